// The run page's event stream: one EventSource on the console's relay of WatchRun,
// resuming after the last seq it saw (the browser reconnects by itself), each batch of
// events handed to apply([type, task key, attempt, state]...); the live status line
// says whether it is live, reconnecting, lost or ended.
"use strict";

window.awpFollow = (run, apply) => {
  const TERMINAL = new Set(["succeeded", "failed", "canceled"]);
  const live = document.getElementById("live-status");
  if (TERMINAL.has(run.state)) {
    live.textContent = "ended: nothing more will change";
    live.className = "live ended";
    return;
  }
  const source = new EventSource("/api/runs/" + encodeURIComponent(run.id) + "/events?after=" + run.last_seq);
  source.addEventListener("open", () => {
    live.textContent = "live";
    live.className = "live";
  });
  source.addEventListener("events", (message) => apply(JSON.parse(message.data)));
  source.addEventListener("end", () => {
    source.close();
    live.textContent = "ended: nothing more will change";
    live.className = "live ended";
  });
  source.addEventListener("failed", (message) => {
    source.close();
    live.textContent = "live updates stopped: " + JSON.parse(message.data).error;
    live.className = "live lost";
  });
  source.addEventListener("error", () => {
    // The browser reconnects by itself (resuming after the last seq) unless it gave up.
    live.textContent = source.readyState === EventSource.CLOSED ? "live updates stopped: reload the page" : "reconnecting…";
    live.className = "live lost";
  });
};
