// A run's counts drawn in the browser, as the server drew them first (web._bar,
// graph.map_progress): the state bars (the run's, a graph node's) and a map's progress.
// run.js redraws them as the run's events arrive; STATES is the lifecycle order.
"use strict";

window.awpBars = (() => {
  const SVG = "http://www.w3.org/2000/svg";
  const TERMINAL_TASK = new Set(["succeeded", "failed", "canceled", "skipped"]);

  function barParts(STATES, counts, width) {
    let total = 0;
    for (const s of STATES) total += counts[s] || 0;
    const parts = [];
    let x = 0;
    if (!total) return parts;
    for (const s of STATES) {
      const n = counts[s] || 0;
      if (!n) continue;
      const w = Math.max((width * n) / total, 1);
      parts.push([s, x, w, n]);
      x += w;
    }
    return parts;
  }

  // Updates a bar in place: one rect per state, reused, so a redraw changes attributes
  // only (no elements made or dropped while a run streams in).
  function drawBar(STATES, parent, counts, width, height) {
    const rects = new Map();
    for (const rect of parent.querySelectorAll("rect")) rects.set(rect.getAttribute("class"), rect);
    const seen = new Set();
    for (const [s, x, w, n] of barParts(STATES, counts, width)) {
      const name = "s-" + s;
      let rect = rects.get(name);
      if (!rect) {
        rect = document.createElementNS(SVG, "rect");
        rect.setAttribute("class", name);
        rect.setAttribute("y", "0");
        rect.setAttribute("height", String(height));
        rect.appendChild(document.createElementNS(SVG, "title"));
        parent.appendChild(rect);
      }
      rect.setAttribute("x", x.toFixed(2));
      rect.setAttribute("width", w.toFixed(2));
      const text = n + " " + s.replace("_", " ");
      if (rect.firstChild && rect.firstChild.textContent !== text) rect.firstChild.textContent = text;
      seen.add(name);
    }
    for (const [name, rect] of rects) if (!seen.has(name)) rect.remove();
  }

  // What graph.map_progress writes: "12/40 done, 2 failed".
  function mapProgress(STATES, counts) {
    let total = 0;
    let done = 0;
    for (const s of STATES) {
      const n = counts[s] || 0;
      total += n;
      if (TERMINAL_TASK.has(s)) done += n;
    }
    return done + "/" + total + " done" + (counts.failed ? ", " + counts.failed + " failed" : "");
  }

  return { drawBar, mapProgress };
})();
