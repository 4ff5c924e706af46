// A task panel's output stream: one EventSource on the console's relay of WatchStream.
// Each attempt's text goes in its own block as it arrives; an attempt that ended other
// than succeeded is marked (its partial output is not the answer). The browser
// reconnects by itself and resumes after the last position it received (Last-Event-ID).
"use strict";

window.awpTaskStream = (panel) => {
  const box = panel.querySelector("#task-stream");
  if (!box) return null;
  const status = box.querySelector("#task-stream-status");
  const blocks = new Map();
  const block = (attempt) => {
    if (!blocks.has(attempt)) {
      const pre = document.createElement("pre");
      pre.className = "stream-attempt";
      pre.dataset.attempt = attempt;
      pre.title = "attempt " + attempt;
      box.appendChild(pre);
      blocks.set(attempt, pre);
    }
    return blocks.get(attempt);
  };
  const source = new EventSource(box.dataset.src);
  source.addEventListener("open", () => { status.textContent = "live"; });
  source.addEventListener("chunks", (message) => {
    for (const [, attempt, text] of JSON.parse(message.data)) {
      block(attempt).textContent += text;
    }
  });
  source.addEventListener("boundary", (message) => {
    const b = JSON.parse(message.data);
    const pre = block(b.attempt);
    if (b.kind === "ended") {
      pre.dataset.state = b.state;
      if (b.state !== "succeeded") pre.classList.add("dropped");
    }
  });
  source.addEventListener("end", () => {
    source.close();
    status.textContent = blocks.size ? "ended" : "ended: nothing was streamed";
  });
  source.addEventListener("failed", (message) => {
    source.close();
    status.textContent = "stream stopped: " + JSON.parse(message.data).error;
  });
  source.addEventListener("error", () => {
    status.textContent = source.readyState === EventSource.CLOSED ? "stream stopped: reload the page" : "reconnecting…";
  });
  return source;
};
