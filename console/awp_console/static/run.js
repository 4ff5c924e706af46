// The run page: live task states from the console's event stream (one WatchRun behind
// it), the graph recoloured in place, a virtualised task list, and the task panel.
// Every change is applied to the data at once and drawn at the next animation frame,
// so thousands of changes a second cost one repaint each frame. bars.js draws the state
// bars and a map's progress; stream.js holds the event stream.
"use strict";

(() => {
  const data = JSON.parse(document.getElementById("run-data").textContent);
  const STATES = data.states;
  const ROW_H = 28;

  // [key, state, attempt, max_attempts, free attempts]: the list shows the charged ones
  // (attempt - free: hand-backs and suspensions at a wait cost nothing), as the panel does.
  const tasks = data.tasks;
  const indexOf = new Map(tasks.map((t, i) => [t[0], i]));
  let nodeOf = data.node_of;
  let nodeKinds = data.nodes;
  // The task a fan-out node shows as its map (-1: none): its state is not counted with
  // the elements'.
  let nodeParents = data.parents;
  // Tasks past GetRun's listing: the page neither lists nor draws them, nor follows the
  // map elements among them.
  let omitted = data.tasks_omitted;
  let nodeEls = [];
  let nodeCounts = [];
  const runCounts = {};

  const dirtyNodes = new Set();
  let listDirty = false;
  let tasksAdded = false;
  let progressDirty = false;
  let frame = 0;
  function schedule() {
    if (!frame) frame = requestAnimationFrame(draw);
  }

  // The bars and a map's progress, drawn by bars.js with this page's states.
  const drawBar = (parent, counts, width, height) => window.awpBars.drawBar(STATES, parent, counts, width, height);
  const mapProgress = (counts) => window.awpBars.mapProgress(STATES, counts);

  // ------------------------------------------------------------ graph

  function bindGraph() {
    const svg = document.querySelector("#graph svg.dag");
    nodeEls = [];
    if (svg) for (const el of svg.querySelectorAll("[data-node]")) nodeEls[+el.dataset.node] = el;
    nodeCounts = nodeKinds.map(() => ({}));
    tasks.forEach((t, i) => {
      if (nodeParents[nodeOf[i]] === i) return;
      const c = nodeCounts[nodeOf[i]];
      c[t[1]] = (c[t[1]] || 0) + 1;
    });
    nodeEls.forEach((_, n) => dirtyNodes.add(n));
    if (fitted) fit();
    applyZoom();
    schedule();
  }

  function drawNode(n) {
    const el = nodeEls[n];
    if (!el) return;
    if (nodeKinds[n] === "task") {
      const state = Object.keys(nodeCounts[n]).find((s) => nodeCounts[n][s] > 0) || "pending";
      el.setAttribute("class", "node task s-" + state + (el.classList.contains("selected") ? " selected" : ""));
      const sub = el.querySelector(".sub");
      if (sub) sub.textContent = state.replace("_", " ");
    } else if (nodeKinds[n] === "fanout") {
      const bar = el.querySelector(".bar");
      if (bar) drawBar(bar, nodeCounts[n], 148, 6);
      const text = el.querySelector(".progress-text");
      const progress = mapProgress(nodeCounts[n]);
      if (text && text.textContent !== progress) text.textContent = progress;
      const parent = nodeParents[n];
      if (parent >= 0) {
        const name = "node fanout s-" + tasks[parent][1];
        if (el.getAttribute("class") !== name) el.setAttribute("class", name);
      }
    } else {
      const bar = el.querySelector(".bar");
      if (bar) drawBar(bar, nodeCounts[n], 102, 7);
    }
  }

  // The graph fits its panel when the page opens and whenever the panel changes size,
  // until a zoom button asks otherwise ("fit" asks for it again).
  let zoom = 1;
  let fitted = true;
  function fit() {
    const svg = document.querySelector("#graph svg.dag");
    const box = document.getElementById("graph");
    if (!svg || !box.clientWidth) return;
    const style = getComputedStyle(box);
    const width = box.clientWidth - parseFloat(style.paddingLeft) - parseFloat(style.paddingRight);
    const height = box.clientHeight - parseFloat(style.paddingTop) - parseFloat(style.paddingBottom);
    zoom = Math.min(width / +svg.dataset.width, height / +svg.dataset.height, 1);
  }
  new ResizeObserver(() => {
    if (!fitted) return;
    fit();
    applyZoom();
  }).observe(document.getElementById("graph"));
  function applyZoom() {
    const svg = document.querySelector("#graph svg.dag");
    if (!svg) return;
    svg.setAttribute("width", String(Math.round(+svg.dataset.width * zoom)));
    svg.setAttribute("height", String(Math.round(+svg.dataset.height * zoom)));
  }
  for (const button of document.querySelectorAll("[data-zoom]")) {
    button.addEventListener("click", () => {
      const how = button.dataset.zoom;
      fitted = how === "fit";
      if (how === "in") zoom = Math.min(zoom * 1.25, 4);
      else if (how === "out") zoom = Math.max(zoom / 1.25, 0.05);
      else fit();
      applyZoom();
    });
  }

  const expanded = new Set();
  let reloadTimer = 0;
  function reloadGraphSoon() {
    if (!reloadTimer) reloadTimer = setTimeout(() => ((reloadTimer = 0), reloadGraph()), 300);
  }
  async function reloadGraph() {
    const url = document.getElementById("graph").dataset.src + "?expand=" + encodeURIComponent([...expanded].join(","));
    const answer = await fetch(url, { credentials: "same-origin" });
    if (!answer.ok) return;
    const fresh = await answer.json();
    document.getElementById("graph").innerHTML = fresh.svg;
    // The server's tasks may be more than the page's (a map's elements made since): the
    // page keeps what its events said of the tasks it knows, and learns the others.
    const nodeOfKey = new Map(fresh.tasks.map((t, i) => [t[0], fresh.node_of[i]]));
    for (const t of fresh.tasks) {
      const i = indexOf.get(t[0]);
      if (i === undefined) addTask(t);
      else if (t[4] > tasks[i][4]) {
        tasks[i][4] = t[4];
        listDirty = true;
      }
    }
    // Elements made while the answer was on its way are drawn the next time.
    let unplaced = false;
    nodeOf = tasks.map((t) => {
      const n = nodeOfKey.get(t[0]);
      if (n !== undefined) return n;
      unplaced = true;
      return nodeOfKey.get(fanoutOf(t[0])) ?? 0;
    });
    omitted = fresh.tasks_omitted;
    if (unplaced && !omitted) reloadGraphSoon();
    nodeKinds = fresh.nodes;
    nodeParents = fresh.parents.map((p) => (p >= 0 ? indexOf.get(fresh.tasks[p][0]) : -1));
    document.getElementById("collapse").hidden = expanded.size === 0;
    if (fresh.too_large.length) {
      // Too many to draw: list them instead.
      setGroup((i) => fanoutOf(tasks[i][0]) === fresh.too_large[0], fresh.too_large[0] + "[…]");
      for (const name of fresh.too_large) expanded.delete(name);
    }
    bindGraph();
    markSelected();
  }
  function fanoutOf(key) {
    const found = /^(.+)\[\d+\]$/.exec(key);
    return found ? found[1] : null;
  }
  document.getElementById("collapse").addEventListener("click", () => {
    expanded.clear();
    reloadGraph();
  });

  document.getElementById("graph").addEventListener("click", (event) => {
    const el = event.target.closest("[data-node]");
    if (!el) return;
    const n = +el.dataset.node;
    if (el.dataset.key) select(el.dataset.key);
    else if (el.dataset.fanout) {
      expanded.add(el.dataset.fanout);
      reloadGraph();
    } else {
      const label = el.querySelector("title").textContent.split(":")[0];
      setGroup((i) => nodeOf[i] === n, label);
    }
  });
  document.getElementById("graph").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && event.target.closest("[data-node]")) event.target.dispatchEvent(new MouseEvent("click", { bubbles: true }));
  });

  // ------------------------------------------------------------ the task list

  const list = document.getElementById("task-list");
  const spacer = list.querySelector(".vlist-spacer");
  const rows = list.querySelector(".vlist-rows");
  const keyFilter = document.getElementById("task-filter");
  const stateFilter = document.getElementById("task-state-filter");
  const groupFilter = document.getElementById("task-group-filter");
  let group = null;
  let shown = [];

  function setGroup(test, label) {
    group = test;
    groupFilter.hidden = !test;
    groupFilter.querySelector("span").textContent = test ? "in " + label : "";
    refilter();
  }
  groupFilter.querySelector("button").addEventListener("click", () => setGroup(null, ""));

  function refilter() {
    const text = keyFilter.value.trim();
    const state = stateFilter.value;
    shown = [];
    for (let i = 0; i < tasks.length; i++) {
      if (text && !tasks[i][0].includes(text)) continue;
      if (state && tasks[i][1] !== state) continue;
      if (group && !group(i)) continue;
      shown.push(i);
    }
    spacer.style.height = shown.length * ROW_H + "px";
    rowFirst = -1;
    document.getElementById("task-count").textContent = shown.length + " of " + tasks.length;
    drawRows();
  }
  keyFilter.addEventListener("input", refilter);
  stateFilter.addEventListener("change", refilter);
  list.addEventListener("scroll", () => {
    listDirty = true;
    schedule();
  });

  // The rows in view (and a margin), made afresh only when the view moves; a state change
  // updates its row in place.
  let rowFirst = -1;
  let rowLast = -1;
  const rowOf = new Map(); // task index -> its row element, for the rows that exist

  function drawRows() {
    const first = Math.max(Math.floor(list.scrollTop / ROW_H) - 10, 0);
    const last = Math.min(Math.ceil((list.scrollTop + list.clientHeight) / ROW_H) + 10, shown.length);
    if (first === rowFirst && last === rowLast) {
      for (const [i, row] of rowOf) fillRow(row, tasks[i]);
      return;
    }
    rowFirst = first;
    rowLast = last;
    rows.style.transform = "translateY(" + first * ROW_H + "px)";
    rowOf.clear();
    const made = [];
    for (let r = first; r < last; r++) {
      const row = document.createElement("div");
      const key = document.createElement("code");
      const cell = document.createElement("span");
      cell.appendChild(document.createElement("span"));
      const tries = document.createElement("span");
      tries.className = "muted";
      row.append(key, cell, tries);
      fillRow(row, tasks[shown[r]]);
      rowOf.set(shown[r], row);
      made.push(row);
    }
    rows.replaceChildren(...made);
  }

  function fillRow(row, t) {
    const className = "vrow" + (t[0] === selected ? " selected" : "");
    if (row.className !== className) row.className = className;
    row.dataset.key = t[0];
    const [key, cell, tries] = row.children;
    if (key.textContent !== t[0]) key.textContent = t[0];
    const state = cell.firstChild;
    if (state.className !== "state s-" + t[1]) {
      state.className = "state s-" + t[1];
      state.textContent = t[1].replace("_", " ");
    }
    const text = t[2] - t[4] + " / " + t[3] + " attempts";
    if (tries.textContent !== text) tries.textContent = text;
  }

  rows.addEventListener("click", (event) => {
    const row = event.target.closest(".vrow");
    if (row) select(row.dataset.key);
  });

  // ------------------------------------------------------------ the task panel

  const panel = document.getElementById("task-panel");
  let selected = null;
  let panelTimer = 0;

  function markSelected() {
    for (const el of nodeEls) if (el) el.classList.toggle("selected", el.dataset.key === selected);
  }

  function select(key) {
    if (!indexOf.has(key)) return;
    selected = key;
    markSelected();
    listDirty = true;
    schedule();
    loadPanel();
  }

  let panelStream = null;
  async function loadPanel() {
    const key = selected;
    const answer = await fetch(panel.dataset.src + encodeURIComponent(key), { credentials: "same-origin" });
    if (key !== selected) return;
    if (panelStream) panelStream.close();
    panel.innerHTML = answer.ok ? await answer.text() : '<p class="error">The task could not be loaded (' + answer.status + ").</p>";
    panelStream = answer.ok ? window.awpTaskStream(panel) : null;
  }

  document.addEventListener("click", (event) => {
    const link = event.target.closest(".task-link");
    if (!link) return;
    event.preventDefault();
    select(link.dataset.key);
    panel.scrollIntoView({ block: "nearest" });
  });

  // ------------------------------------------------------------ live updates

  function setTaskState(i, state) {
    const t = tasks[i];
    const old = t[1];
    if (old === state) return;
    t[1] = state;
    if (nodeParents[nodeOf[i]] !== i) {
      const c = nodeCounts[nodeOf[i]];
      c[old] -= 1;
      c[state] = (c[state] || 0) + 1;
    }
    runCounts[old] -= 1;
    runCounts[state] = (runCounts[state] || 0) + 1;
    dirtyNodes.add(nodeOf[i]);
    listDirty = true;
    progressDirty = true;
    if (t[0] === selected) {
      clearTimeout(panelTimer);
      panelTimer = setTimeout(loadPanel, 250);
    }
  }

  function addTask(t) {
    indexOf.set(t[0], tasks.length);
    tasks.push([t[0], t[1], t[2], t[3], t[4]]);
    runCounts[t[1]] = (runCounts[t[1]] || 0) + 1;
    progressDirty = true;
    listDirty = true;
    tasksAdded = true;
  }

  // A map's element the page has not seen yet (made after it loaded): a task of its own,
  // shown by its fan-out's node when there is one, else the graph is drawn again.
  function newElement(key, state) {
    const name = fanoutOf(key);
    const parent = name === null ? undefined : indexOf.get(name);
    if (parent === undefined || omitted) return undefined;
    const i = tasks.length;
    addTask([key, state, 0, tasks[parent][3], 0]);
    const n = nodeOf[parent];
    nodeOf.push(n);
    if (nodeKinds[n] !== "task") {
      // Its fan-out's node, or the cluster its map is in.
      const c = nodeCounts[n];
      c[state] = (c[state] || 0) + 1;
      dirtyNodes.add(n);
    } else reloadGraphSoon();
    return i;
  }

  function apply(batch) {
    let runChanged = false;
    for (const [type, key, attempt, state] of batch) {
      if (type === "task_state") {
        const i = indexOf.get(key);
        if (i !== undefined) setTaskState(i, state);
        else newElement(key, state);
      } else if (type === "attempt_state") {
        const i = indexOf.get(key) ?? newElement(key, "running");
        if (i === undefined) continue;
        if (attempt > tasks[i][2]) tasks[i][2] = attempt;
        // A suspension is free; an interrupted attempt may have been a free hand-back,
        // which only the server knows: the reload brings its count of free attempts.
        if (state === "suspended") tasks[i][4] += 1;
        else if (state === "interrupted") reloadGraphSoon();
        listDirty = true;
      } else if (type === "run_state" || type === "run_cancel_requested") {
        runChanged = true;
      }
    }
    schedule();
    if (runChanged) reloadHeader();
  }

  async function reloadHeader() {
    const box = document.getElementById("run-header");
    const answer = await fetch(box.dataset.src, { credentials: "same-origin" });
    if (answer.ok) box.innerHTML = await answer.text();
    if (selected) loadPanel(); // its retry button depends on the run's state
  }

  // ------------------------------------------------------------ drawing

  function drawProgress() {
    const box = document.getElementById("run-progress");
    const bar = box && box.querySelector("svg.progress");
    if (!bar) return;
    drawBar(bar, runCounts, +bar.getAttribute("width"), 10);
    const counts = box.querySelector(".counts");
    counts.replaceChildren();
    for (const s of STATES) {
      if (!runCounts[s]) continue;
      const span = document.createElement("span");
      span.className = "count s-" + s;
      span.textContent = runCounts[s] + " " + s.replace("_", " ");
      counts.appendChild(span);
    }
  }

  function draw() {
    frame = 0;
    for (const n of dirtyNodes) drawNode(n);
    dirtyNodes.clear();
    if (progressDirty) drawProgress();
    progressDirty = false;
    if (listDirty) {
      listDirty = false;
      if (tasksAdded || keyFilter.value || stateFilter.value || group) refilter();
      else drawRows();
      tasksAdded = false;
    }
  }

  for (const t of tasks) runCounts[t[1]] = (runCounts[t[1]] || 0) + 1;
  bindGraph();
  refilter();
  // A form that acted on a task (a decision) comes back here with it named: #task=KEY.
  const named = /^#task=(.+)$/.exec(location.hash);
  if (named) select(decodeURIComponent(named[1]));
  window.awpFollow(data.run, apply);
  // For tests and the benchmark: the page has drawn what it was given.
  requestAnimationFrame(() => {
    document.documentElement.dataset.runPage = "ready";
  });
})();
