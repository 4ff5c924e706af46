// Times that go on while a page is open ("Running for", a running run's duration): each
// element with data-elapsed (the seconds it had when the server made it) counts on from
// when this page first saw it, by the browser's monotonic clock, once a second. Elements
// swapped in later (the run page's header) are picked up at the next tick.
"use strict";

(() => {
  const seen = new WeakMap(); // element -> performance.now() when first seen

  // Whole seconds in the units awp_common.durations writes: 45s, 2m5s, 1h2m, 3d4h.
  function format(seconds) {
    let rest = Math.max(Math.floor(seconds), 0);
    if (rest < 60) return rest + "s";
    const days = Math.floor(rest / 86400);
    rest -= days * 86400;
    const hours = Math.floor(rest / 3600);
    rest -= hours * 3600;
    const minutes = Math.floor(rest / 60);
    rest -= minutes * 60;
    return (days ? days + "d" : "") + (hours ? hours + "h" : "") + (minutes ? minutes + "m" : "") + (rest ? rest + "s" : "");
  }

  function tick() {
    const now = performance.now();
    for (const el of document.querySelectorAll("[data-elapsed]")) {
      if (!seen.has(el)) seen.set(el, now);
      const text = format(+el.dataset.elapsed + (now - seen.get(el)) / 1000);
      if (el.textContent !== text) el.textContent = text;
    }
  }
  setInterval(tick, 1000);
})();
