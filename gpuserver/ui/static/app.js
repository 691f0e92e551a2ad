// The pool page: polls /ui/state every second and renders it. Every text from the server goes through
// textContent, never into HTML.
"use strict";

const GiB = 1024 * 1024 * 1024;
const POLL_MS = 1000;

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else e.setAttribute(k, v);
  }
  for (const c of children) if (c) e.appendChild(c);
  return e;
}

function mib(bytes) {
  return bytes >= GiB ? (bytes / GiB).toFixed(1) + " GiB" : Math.round(bytes / (1024 * 1024)) + " MiB";
}

function num(x, digits) { return x.toFixed(digits); }

function renderGPUs(gpus) {
  const box = document.getElementById("gpus");
  box.replaceChildren();
  for (const g of gpus) {
    const state = !g.healthy ? "failed" : g.busy ? "busy" : "idle";
    const used = g.memory_bytes > 0 ? Math.min(100, 100 * g.used_bytes / g.memory_bytes) : 0;
    const fill = el("div");
    fill.style.width = used.toFixed(1) + "%"; // CSSOM: the CSP allows no inline style attribute
    const bar = el("div", { class: "bar" }, fill);
    const chips = el("div", { class: "chips" });
    if (g.resident.length === 0) chips.appendChild(el("span", { class: "empty", text: "no function resident" }));
    for (const f of g.resident) {
      const running = g.running.includes(f);
      const share = (g.shares || []).filter((s) => s.function === f).map((s) => " (share " + s.request + "-" + s.limit + ")").join("");
      chips.appendChild(el("span", { class: "chip" + (running ? " running" : ""), text: f + share, "data-gpu": String(g.index),
        title: running ? f + ": a request runs" + share : f + ": resident" }));
    }
    box.appendChild(el("div", { class: "gpu " + state, "data-gpu": String(g.index) },
      el("div", { class: "title" }, el("span", { text: "GPU " + g.index }), el("span", { class: "state " + state, text: state })),
      el("div", { class: "name", text: g.name, title: g.name }),
      bar,
      el("div", { class: "mem", text: mib(g.used_bytes) + " of " + mib(g.memory_bytes) + " used" }),
      chips));
  }
}

function renderFunctions(fns, billSince) {
  const body = document.querySelector("#functions tbody");
  body.replaceChildren();
  if (fns.length === 0) {
    body.appendChild(el("tr", {}, el("td", { colspan: "12", class: "empty", text: "no GPU function is registered" })));
  }
  for (const f of fns) {
    let met = el("td", { class: "n", text: "-" });
    if (f.compliance >= 0) {
      const ok = f.compliance >= f.percentile;
      met = el("td", { class: "n " + (ok ? "good" : "poor"), text: num(f.compliance, 1) + "%",
        title: f.on_time + " of " + f.served + " within " + f.slo_ms + " ms (goal p" + f.percentile + ")" });
    }
    const refusedTitle = Object.entries(f.refused_by || {}).map(([k, v]) => k + " " + v).join(", ");
    const u = f.usage || { gpu_seconds: 0, gpu_memory_byte_seconds: 0, host_memory_byte_seconds: 0 };
    body.appendChild(el("tr", { "data-function": f.name, "data-served": String(f.served), "data-on-time": String(f.on_time),
      "data-refused": String(f.refused) },
      el("td", { text: f.function }),
      el("td", { text: f.namespace }),
      el("td", { class: "n", text: mib(f.memory_bytes) }),
      el("td", { class: "n", text: f.slo_ms > 0 ? f.slo_ms + " ms @p" + f.percentile : "-" }),
      el("td", { class: "n", text: String(f.queued) }),
      el("td", { class: "n", text: String(f.running) }),
      el("td", { class: "n", text: String(f.served) }),
      met,
      el("td", { class: "n" + (f.refused > 0 ? " poor" : ""), text: String(f.refused), title: refusedTitle }),
      el("td", { class: "n", text: num(u.gpu_seconds, 3) }),
      el("td", { class: "n", text: num(u.gpu_memory_byte_seconds / GiB, 3) }),
      el("td", { class: "n", text: num(u.host_memory_byte_seconds / GiB, 3) })));
  }
  document.getElementById("bill").textContent = billSince ?
    "The bill (GPU seconds, GPU and host memory GiB-seconds) is counted since " + new Date(billSince).toLocaleString() +
    "; faas-gpu usage prints it." : "";
}

function renderEvents(events) {
  const list = document.getElementById("events");
  list.replaceChildren();
  if (events.length === 0) list.appendChild(el("li", { class: "empty", text: "no swap or eviction yet" }));
  for (const e of events.slice().reverse()) {
    const what = {
      "swap-in": e.function + " swapped in to GPU " + e.gpu + (e.detail ? " (" + e.detail + ")" : ""),
      "evict": e.function + " evicted from GPU " + e.gpu,
      "gpu-failed": "GPU " + e.gpu + " failed",
      "gpu-healthy": "GPU " + e.gpu + " is healthy again",
    }[e.kind] || e.kind;
    list.appendChild(el("li", { "data-kind": e.kind },
      el("time", { text: new Date(e.time).toLocaleTimeString() }),
      el("span", { class: "k-" + e.kind, text: e.kind }),
      document.createTextNode(" " + what)));
  }
}

function renderQueues(s) {
  const body = document.querySelector("#queues tbody");
  body.replaceChildren();
  const dead = document.getElementById("dead");
  if (!s.queues) {
    body.appendChild(el("tr", {}, el("td", { colspan: "6", class: "empty",
      text: s.queues_error ? "queues unavailable: " + s.queues_error : "no queues here" })));
    dead.textContent = "";
    return;
  }
  for (const q of s.queues) {
    body.appendChild(el("tr", {}, el("td", { text: q.queue }), el("td", { class: "n", text: String(q.messages) }),
      el("td", { class: "n", text: String(q.pending) }), el("td", { class: "n", text: String(q.in_worker) }),
      el("td", { class: "n", text: String(q.redelivered) }), el("td", { class: "n", text: String(q.consumers) })));
  }
  dead.textContent = "dead letters: " + s.dead_letters;
}

function render(s) {
  document.getElementById("node").textContent = s.node ? "node " + s.node : "";
  document.getElementById("policy").textContent = s.policy;
  document.getElementById("queued").textContent = String(s.queued);
  const sw = s.swaps || {};
  document.getElementById("swaps").textContent =
    "resident " + (sw.none || 0) + ", nvlink " + (sw.nvlink || 0) + ", pcie " + (sw.pcie || 0) + ", cold " + (sw.cold || 0);
  document.getElementById("dry").hidden = s.sim_kernels !== "dry";
  renderGPUs(s.gpus);
  renderFunctions(s.functions, s.bill_since);
  renderEvents(s.events);
  renderQueues(s);
  const up = document.getElementById("updated");
  up.textContent = "live, updated " + new Date(s.time).toLocaleTimeString();
  up.className = "";
  document.body.dataset.updated = s.time;
}

async function poll() {
  const err = document.getElementById("error");
  try {
    // From the origin: a page opened with credentials in its address (user:password@host/ui) resolves relative URLs with them,
    // which fetch refuses; the browser sends the credentials it was given for this origin by itself.
    const r = await fetch(location.origin + "/ui/state", { cache: "no-store", credentials: "same-origin" });
    if (!r.ok) throw new Error("HTTP " + r.status + (r.status === 401 ? ": log in with the /system credentials" : ""));
    render(await r.json());
    err.hidden = true;
  } catch (e) {
    err.textContent = "not updating: " + e.message;
    err.hidden = false;
    document.getElementById("updated").className = "stale";
  }
  setTimeout(poll, POLL_MS);
}

poll();
