// The run page's attempts table: loaded, and paged, when asked for.
"use strict";

(() => {
  document.getElementById("attempts").addEventListener("click", async (event) => {
    const button = event.target.closest("#load-attempts, .more");
    if (!button) return;
    const box = document.getElementById("attempts");
    const src = button.dataset.src || box.dataset.src;
    button.disabled = true;
    const answer = await fetch(src, { credentials: "same-origin" });
    const holder = document.createElement("div");
    holder.innerHTML = answer.ok ? await answer.text() : '<p class="error">Not loaded (' + answer.status + ").</p>";
    button.replaceWith(...holder.childNodes);
  });
})();
