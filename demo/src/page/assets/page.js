// The paused-worker page: polls GET /page/state and draws it; the buttons POST /page/runs.
// Everything shown is built with textContent, never as HTML: a document's value is whatever
// a writer sent.
"use strict";

const POLL_MS = 400;
const TITLES = {
  "guard-on": "Paused worker, guard on",
  "guard-off": "Paused worker, guard off",
  "gap": "The gap",
  "gap-checked": "The gap, with a check",
};

let latest = null; // the newest state
let leaseSeen = 0; // performance.now() when `latest` arrived

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name === "class") node.className = value;
    else node.setAttribute(name, value);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(typeof child === "string" ? document.createTextNode(child) : child);
  }
  return node;
}

function seconds(ms) {
  return (ms / 1000).toFixed(1) + " s";
}

function offset(run, at) {
  const ms = Date.parse(at) - Date.parse(run.started_at);
  return "+" + seconds(Math.max(0, ms));
}

// Applied writes whose value a later write with a lower fence replaced: lost to a stale
// writer. And applied late writes: made after a greater fence had been granted.
function classify(writes) {
  const overwritten = new Set();
  const stale = new Set(writes.filter((w) => w.late && w.outcome === "applied").map((w) => w.id));
  writes.forEach((w, i) => {
    if (w.outcome !== "applied") return;
    for (const later of writes.slice(i + 1)) {
      if (later.outcome === "applied" && later.fence < w.fence) {
        overwritten.add(w.id);
        stale.add(later.id);
      }
    }
  });
  return { overwritten, stale };
}

function marks(run) {
  const { overwritten, stale } = classify(run.writes);
  const list = el("ol", { class: "marks", "aria-label": "Write attempts on " + run.key });
  for (const w of run.writes) {
    let cls = "mark " + w.outcome;
    if (overwritten.has(w.id)) cls += " overwritten";
    if (stale.has(w.id)) cls += " stale";
    list.append(
      el("li", {
        class: cls,
        "data-worker": w.worker || "unknown",
        "data-fence": String(w.fence),
        "data-outcome": w.outcome,
      },
      el("span", { class: "dot", title: "fence " + w.fence }, el("small", {}, "fence"), String(w.fence)),
      el("span", { class: "who" }, w.worker || "unknown writer"),
      el("span", { class: "what" }, w.outcome === "applied" ? "applied" : "rejected: stale fence"),
      el("span", { class: "when" }, offset(run, w.at))),
    );
  }
  if (run.writes.length === 0) list.append(el("li", { class: "muted" }, "No write yet."));
  return list;
}

function events(run) {
  const list = el("ol", { class: "events" });
  for (const e of run.events) {
    list.append(el("li", {},
      el("span", { class: "t" }, "+" + seconds(e.at_ms)),
      el("span", { class: "who" }, e.who),
      el("span", {}, e.what)));
  }
  return list;
}

function verdict(run) {
  if (run.phase === "failed") {
    return el("div", { class: "verdict failed", id: "verdict" }, "The story could not be played: " + run.error);
  }
  if (!run.verdict) {
    return el("div", { class: "verdict", id: "verdict" }, "Playing…");
  }
  return el("div", { class: "verdict " + run.verdict.kind, id: "verdict" }, run.verdict.text);
}

function leaseCard(run) {
  const card = el("div", { class: "card lease", id: "lease" }, el("h3", {}, "The lease, as the lease server sees it"));
  if (run.lease_error) {
    card.append(el("p", { class: "free" }, "Unknown: " + run.lease_error));
  } else if (!run.lease) {
    card.append(el("p", { class: "free big" }, "No live lease"),
      el("p", { class: "muted" }, "Free: expired or released."));
  } else {
    card.append(
      el("p", { class: "big" }, "fence " + run.lease.fence + " · " + (run.lease.holder || "another owner")),
      el("p", { class: "muted" }, el("span", { id: "lease-left" }, ""), " left (the owner secret stays with the holder)"),
      el("div", { class: "bar" }, el("div", { id: "lease-bar" })));
  }
  return card;
}

function documentCard(run) {
  const doc = run.document;
  const lost = run.verdict && run.verdict.kind === "data-loss";
  const card = el("div", { class: "card document" + (lost ? " lost" : ""), id: "document" },
    el("h3", {}, "The document, as the store holds it"));
  if (!doc) {
    card.append(el("p", { class: "muted" }, "Not written yet."));
    return card;
  }
  const text = doc.value && typeof doc.value === "object" && typeof doc.value.text === "string"
    ? doc.value.text : JSON.stringify(doc.value);
  card.append(
    el("p", { class: "big", id: "document-text" }, text),
    el("p", { class: "muted" }, "written by " + (doc.worker || "an unknown writer") + " with fence " + doc.fence),
    el("pre", {}, JSON.stringify(doc.value, null, 1)));
  if (lost) card.append(el("p", { class: "loss" }, "Worker B's report is lost."));
  return card;
}

function storeTag(run) {
  return run.guarded
    ? el("span", { class: "tag guarded" }, "store guard on")
    : el("span", { class: "tag unguarded" }, run.story === "guard-off" ? "unguarded copy of the store" : "store guard off");
}

function drawCurrent(run) {
  const main = document.getElementById("current");
  main.replaceChildren();
  if (!run) {
    main.dataset.phase = "none";
    main.append(el("p", { class: "empty" }, "Press a button to play a story. Each takes a few seconds."));
    return;
  }
  main.dataset.phase = run.phase;
  main.dataset.story = run.story;
  main.dataset.run = String(run.id);
  main.dataset.verdict = run.verdict ? run.verdict.kind : "";
  main.append(
    el("div", { class: "run-head" }, el("h2", {}, TITLES[run.story] || run.story),
      el("span", { class: "key" }, run.key), storeTag(run)),
    verdict(run),
    el("div", { class: "grid" },
      el("section", {}, el("h3", {}, "Write attempts, in the store's log"), marks(run),
        el("h3", {}, "What happened"), events(run)),
      el("aside", {}, leaseCard(run), documentCard(run))));
}

function drawEarlier(runs) {
  const box = document.getElementById("earlier");
  box.replaceChildren();
  if (runs.length) box.append(el("h3", {}, "Earlier runs"));
  for (const run of runs) {
    box.append(el("div", { class: "earlier-run", "data-run": String(run.id) },
      el("div", { class: "run-head" }, el("b", {}, TITLES[run.story] || run.story),
        el("span", { class: "key" }, run.key), storeTag(run)),
      marks(run),
      run.verdict ? el("div", { class: "verdict " + run.verdict.kind }, run.verdict.text) : null));
  }
}

function tick() {
  const left = document.getElementById("lease-left");
  const bar = document.getElementById("lease-bar");
  const run = latest && latest.runs[0];
  if (!left || !run || !run.lease) return;
  const ms = Math.max(0, run.lease.expires_in_ms - (performance.now() - leaseSeen));
  left.textContent = seconds(ms);
  if (bar) bar.style.width = Math.min(100, (100 * ms) / (latest.ttl_seconds * 1000)) + "%";
}

function draw(state) {
  latest = state;
  leaseSeen = performance.now();
  document.getElementById("lease-server").textContent = state.lease_server || "started with the first story";
  document.getElementById("guard").textContent = state.guard;
  drawCurrent(state.runs[0]);
  drawEarlier(state.runs.slice(1));
  const playing = state.runs.filter((r) => r.phase === "playing").length;
  setStatus(playing ? playing + " playing" : "Ready.");
  tick();
}

function setStatus(text) {
  document.getElementById("status").textContent = text;
}

async function poll() {
  try {
    const response = await fetch("/page/state", { cache: "no-store" });
    if (response.ok) draw(await response.json());
    else setStatus("The store answered " + response.status + "; retrying.");
  } catch (e) {
    setStatus("The store does not answer; retrying.");
  }
  setTimeout(poll, POLL_MS);
}

async function play(story, button) {
  button.disabled = true;
  try {
    const response = await fetch("/page/runs", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ story }),
    });
    if (!response.ok) {
      const problem = await response.json().catch(() => ({}));
      setStatus(problem.detail || "The store answered " + response.status);
    }
  } catch (e) {
    setStatus("The store does not answer.");
  } finally {
    button.disabled = false;
  }
}

document.addEventListener("DOMContentLoaded", () => {
  for (const button of document.querySelectorAll("button[data-story]")) {
    button.addEventListener("click", () => play(button.dataset.story, button));
  }
  setInterval(tick, 100);
  poll();
});
