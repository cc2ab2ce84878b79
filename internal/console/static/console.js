// actionbus console: plain JavaScript over the HTTP API (docs/http.md).
// Everything shown is built with textContent, never parsed as HTML.
"use strict";

const state = { runs: new Map(), approvals: [], view: "runs", runId: "", follow: null, index: null,
  events: [], ended: null, drawing: 0, tick: 0 };

function token() { return sessionStorage.getItem("actionbus-token") || ""; }
function auth() { return { "Authorization": "Bearer " + token() }; }

function el(tag, attrs, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") e.className = v; else if (k.startsWith("on")) e.addEventListener(k.slice(2), v); else e.setAttribute(k, v);
  }
  for (const c of children) e.append(c instanceof Node ? c : document.createTextNode(c == null ? "" : String(c)));
  return e;
}

// say shows a message: an error unless ok.
function say(text, ok) {
  const m = document.getElementById("message");
  m.textContent = text || "";
  m.className = ok ? "ok" : "";
}

// Ids that go into a URL are checked against their documented shape first
// and encoded as path segments: a crafted fragment (a "\\" the browser
// reads as "/", a "..") shows an error, never makes a request.
const RUN_ID = /^[0-7][0-9A-HJKMNP-TV-Z]{25}$/; // a canonical ULID
const APPROVAL_ID = /^[0-7][0-9A-HJKMNP-TV-Z]{25}-\d{1,9}-\d{1,9}(-\d{1,9})?$/; // <runId>-<cycle>-<planIndex>[-<attempt>]

// runPath is /v1/runs/<id>[/more], refusing an id that is not a run id.
function runPath(id, more) {
  if (!RUN_ID.test(id)) throw new Error("invalid_run_id: " + JSON.stringify(String(id).slice(0, 80)) + " is not a run id");
  return "/v1/runs/" + encodeURIComponent(id) + (more ? "/" + more : "");
}

// approvalPath is /v1/approvals/<id>/<verb>, refusing an id that is not an
// approval id.
function approvalPath(id, verb) {
  if (!APPROVAL_ID.test(id)) throw new Error("approval_not_found: " + JSON.stringify(String(id).slice(0, 80)) + " is not an approval id");
  return "/v1/approvals/" + encodeURIComponent(id) + "/" + verb;
}

async function api(method, path, body) {
  const opts = { method, headers: auth() };
  if (body !== undefined) { opts.headers["Content-Type"] = "application/json"; opts.body = JSON.stringify(body); }
  const res = await fetch(path, opts);
  const data = await res.json().catch(() => ({}));
  if (res.status === 401) showLogin();
  if (!res.ok && res.status !== 202 && !(data && data.status)) {
    const e = data.error || {};
    throw new Error((e.code || res.status) + ": " + (e.message || res.statusText));
  }
  return data;
}

// stream reads server-sent events with fetch (EventSource cannot send the
// Authorization header) and calls on(event, data) for each.
async function stream(path, on, signal) {
  const res = await fetch(path, { headers: auth(), signal });
  if (!res.ok) {
    if (res.status === 401) showLogin();
    const data = await res.json().catch(() => ({}));
    throw new Error(((data.error || {}).code || res.status) + ": " + ((data.error || {}).message || ""));
  }
  const reader = res.body.getReader();
  const dec = new TextDecoder();
  let buf = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) return;
    buf += dec.decode(value, { stream: true });
    let i;
    while ((i = buf.indexOf("\n\n")) >= 0) {
      const chunk = buf.slice(0, i);
      buf = buf.slice(i + 2);
      let ev = "message", data = "";
      for (const line of chunk.split("\n")) {
        if (line.startsWith("event: ")) ev = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) on(ev, JSON.parse(data));
    }
  }
}

// human writes a duration in milliseconds as people read it: whole ms
// under a second ("850 ms"), seconds with one decimal under a minute
// ("12.3 s"), then two units ("2 m 44 s", "3 h 5 m", "2 d 4 h"). Every
// duration the console shows goes through it.
function human(ms) {
  ms = Math.max(0, Math.round(Number(ms) || 0));
  if (ms < 1000) return ms + " ms";
  if (ms < 59950) return (ms / 1000).toFixed(1) + " s";
  const s = Math.round(ms / 1000);
  if (s < 3600) return Math.floor(s / 60) + " m " + (s % 60) + " s";
  const m = Math.round(s / 60);
  if (m < 1440) return Math.floor(m / 60) + " h " + (m % 60) + " m";
  const h = Math.round(m / 60);
  return Math.floor(h / 24) + " d " + (h % 24) + " h";
}

function age(iso) { return human(Date.now() - Date.parse(iso)); }

// short shows a long value (a hash) by its first 12 characters.
function short(v) {
  const s = String(v == null ? "" : v);
  return s.length > 13 ? s.slice(0, 12) + "…" : s;
}

// shortID shows a run or approval id by its start and its end (an
// approval id ends with the call's cycle and plan index, which tell a
// run's approvals apart).
function shortID(v) {
  const s = String(v == null ? "" : v);
  if (s.length <= 16) return s;
  const tail = s.length > 26 ? s.slice(22) : s.slice(-4);
  return s.slice(0, 8) + "…" + tail;
}

// copyable shows a value shortened, with a control that copies the whole
// value to the clipboard.
function copyable(full, shown) {
  return el("span", { class: "copyable" }, el("code", { title: full }, shown),
    el("button", { class: "copy", type: "button", title: "copy " + full, "data-copy": full, onclick: () => copy(full) }, "copy"));
}

async function copy(text) {
  try {
    await navigator.clipboard.writeText(text);
    say("copied " + text, true);
  } catch (e) { say("copy failed: " + e.message); }
}

// --- runs -------------------------------------------------------------------

function renderRuns() {
  const status = document.getElementById("filter-status").value;
  const kind = document.getElementById("filter-kind").value;
  const user = document.getElementById("filter-user").value.trim();
  const body = document.querySelector("#runs tbody");
  const rows = [...state.runs.values()]
    .filter(r => (!status || r.status === status) && (!kind || r.kind === kind) && (!user || r.userId === user))
    .sort((a, b) => Date.parse(b.startedAt) - Date.parse(a.startedAt))
    .slice(0, 200)
    .map(r => el("tr", { "data-run": r.runId },
      el("td", {}, el("a", { href: "#run/" + r.runId }, r.runId)),
      el("td", { class: "status " + r.status }, r.status),
      el("td", {}, r.kind || ""),
      el("td", {}, (r.title || "").slice(0, 80)),
      el("td", {}, age(r.startedAt)),
      el("td", {}, r.waiting || ""),
      el("td", {}, r.userId || "")));
  body.replaceChildren(...rows);
}

function renderApprovals() {
  document.getElementById("approval-count").textContent = String(state.approvals.length);
  document.getElementById("approvals-empty").classList.toggle("hidden", state.approvals.length > 0);
  const rows = state.approvals.map(a => el("tr", { "data-approval": a.approvalId },
    el("td", {}, copyable(a.approvalId, shortID(a.approvalId))),
    el("td", {}, el("a", { href: "#run/" + a.runId, title: a.runId }, el("code", {}, shortID(a.runId)))),
    el("td", {}, a.action),
    el("td", {}, a.userId || ""),
    el("td", { class: "hash" }, copyable(a.inputHash, short(a.inputHash))),
    el("td", {}, inputView(a.input)),
    el("td", {}, a.reason || ""),
    el("td", { title: new Date(a.expiresAt).toLocaleString() }, "in " + human(Date.parse(a.expiresAt) - Date.now())),
    el("td", { class: "actions" },
      el("button", { class: "approve", "data-approval": a.approvalId, onclick: () => answer(a.approvalId, "approve") }, "Approve"),
      " ",
      el("button", { class: "deny", "data-approval": a.approvalId, onclick: () => answer(a.approvalId, "deny") }, "Deny"))));
  document.querySelector("#approvals tbody").replaceChildren(...rows);
}

// inputView shows an approval's input: its one-line JSON as a summary
// that opens onto the whole document, wrapped; a small one starts open.
function inputView(input) {
  const line = JSON.stringify(input === undefined ? null : input);
  const d = el("details", {}, el("summary", {}, line.length > 80 ? line.slice(0, 80) + "…" : line),
    el("pre", {}, JSON.stringify(input, null, 2)));
  if (line.length <= 200) d.open = true;
  return d;
}

async function answer(id, verb) {
  const body = {};
  if (verb === "deny") body.reason = prompt("Why deny " + id + "?") || "";
  say("");
  try {
    await api("POST", approvalPath(id, verb), verb === "deny" ? body : undefined);
    say(verb === "approve" ? "approved " + id : "denied " + id, true);
  } catch (e) { say(e.message); }
}

// followIndex keeps runs and approvals live; it reconnects when cut.
async function followIndex() {
  if (state.index) state.index.abort();
  const ctl = new AbortController();
  state.index = ctl;
  for (;;) {
    try {
      await stream("/v1/events", (ev, data) => {
        document.getElementById("live").textContent = "live";
        if (ev === "snapshot") {
          state.runs = new Map(data.runs.map(r => [r.runId, r]));
          state.approvals = data.approvals;
          renderApprovals();
        } else if (ev === "run") {
          state.runs.set(data.runId, data);
          if (state.view === "run" && state.runId === data.runId) renderRunHeader(data);
        } else if (ev === "approvals") {
          state.approvals = data.approvals;
          renderApprovals();
        }
        renderRuns();
      }, ctl.signal);
    } catch (e) {
      if (ctl.signal.aborted) return;
      say(e.message);
    }
    document.getElementById("live").textContent = "offline";
    if (!token()) return;
    await new Promise(r => setTimeout(r, 2000));
  }
}

// --- one run ----------------------------------------------------------------

function renderRunHeader(r) {
  const s = document.getElementById("run-status");
  s.textContent = r.status;
  s.className = "status " + r.status;
  document.getElementById("run-kind").textContent = r.kind ? "(" + r.kind + ")" : "";
  document.getElementById("run-title").textContent = r.title || "";
  let outcome = "";
  if (r.waiting) outcome = "waiting for " + r.waiting;
  if (r.output !== undefined && r.output !== null) outcome = JSON.stringify(r.output).slice(0, 400);
  if (r.answer) outcome = r.answer;
  if (r.error) outcome = r.error.code + ": " + (r.error.message || "");
  if (r.reason) outcome = "canceled: " + r.reason;
  document.getElementById("run-outcome").textContent = outcome;
  document.getElementById("run-usage").textContent = r.usage ? "LLM usage: " + usageText(r.usage) : "";
}

// usageText is a run's LLM usage on one line, as the CLI prints it.
function usageText(u) {
  const n = v => Number(v) || 0;
  let s = (n(u.inputTokens) + n(u.outputTokens)) + " tokens (" + n(u.inputTokens) + " in, " + n(u.outputTokens) + " out) in " +
    n(u.calls) + " call(s), $" + n(u.costUsd).toFixed(4);
  if (n(u.estimatedCalls) > 0) s += "; " + n(u.estimatedCalls) + " call(s) estimated";
  if (n(u.unpricedCalls) > 0) s += "; " + n(u.unpricedCalls) + " call(s) unpriced";
  return s;
}

function describe(type, d) {
  switch (type) {
    case "run.step": case "run.progress":
      return d.name + (d.action ? " " + d.action : "") + (d.message ? ": " + d.message : "") + (d.status ? " [" + d.status + "]" : "");
    case "decision.made": {
      const dec = d.decision || {};
      if (dec.type === "action") return "action " + dec.name;
      if (dec.type === "plan") return "plan of " + (dec.actions || []).map(a => a.name).join(", ");
      if (dec.type === "clarify") return "clarify: " + dec.question;
      return dec.type + (dec.answer ? ": " + dec.answer.slice(0, 120) : "");
    }
    case "action.completed":
      return d.action + " ok in " + human(d.durationMs) + " on " + (d.executor || "?") + (d.replayed ? " (replayed)" : "") + (d.summary ? " — " + d.summary : "");
    case "action.failed":
      return d.action + " failed: " + (d.error || {}).code + " " + ((d.error || {}).message || "") + " after " + human(d.durationMs) + (d.executor ? " on " + d.executor : "");
    case "approval.requested":
      return "approval " + d.context.approvalId + " for " + d.context.action + " (input " + d.context.inputHash.slice(0, 12) + "…)";
    case "approval.resolved":
      return "approval " + d.approvalId + " " + d.outcome + (d.approver ? " by " + d.approver : "");
    case "run.completed": return "completed: " + (d.answer || JSON.stringify(d.output || "")).slice(0, 200);
    case "run.failed": return "failed: " + d.error.code + " " + (d.error.message || "");
    case "run.canceled": return "canceled: " + (d.reason || "");
    case "synthesis.completed": return "synthesis " + d.part + (d.error ? " failed" : "");
  }
  return "";
}

async function showRun(id) {
  state.runId = RUN_ID.test(id) ? id : "";
  document.getElementById("run-id").textContent = id;
  document.getElementById("run-audit").textContent = "";
  document.getElementById("run-audit-link").setAttribute("href", "#audit/" + encodeURIComponent(state.runId));
  const body = document.querySelector("#timeline tbody");
  body.replaceChildren();
  state.events = [];
  state.ended = null;
  drawWaterfall();
  if (state.follow) state.follow.abort();
  const ctl = new AbortController();
  state.follow = ctl;
  try {
    // The index's stream may have brought a newer state of the run while
    // this read was on its way: the newer one is shown.
    const got = await api("GET", runPath(id));
    const live = state.runs.get(id);
    renderRunHeader(live && Date.parse(live.updatedAt) > Date.parse(got.updatedAt) ? live : got);
  } catch (e) { say(e.message); return; }
  let first = 0;
  try {
    await stream(runPath(id, "events"), (ev, e) => {
      if (ctl.signal.aborted) return; // the rest of a chunk read before another run was opened
      if (ev === "end") {
        renderRunHeader(Object.assign({}, state.runs.get(id) || {}, e, { waiting: "" }));
        if (!state.ended) state.ended = { time: Date.now(), status: e.status };
        queueWaterfall();
        return;
      }
      if (ev === "error") { say((e.error || {}).code + ": " + (e.error || {}).message); return; }
      const t = Date.parse(e.time);
      if (!first) first = t;
      const d = e.data || {};
      state.events.push({ type: ev, time: t, data: d });
      if (ev === "run.completed" || ev === "run.failed" || ev === "run.canceled") state.ended = { time: t, status: ev.slice(4) };
      queueWaterfall();
      body.append(el("tr", { "data-type": ev },
        el("td", { title: (t - first) + " ms" }, "+" + human(t - first)), el("td", {}, ev), el("td", {}, d.cycle == null ? "" : String(d.cycle)), el("td", {}, describe(ev, d))));
    }, ctl.signal);
  } catch (e) { if (!ctl.signal.aborted) say(e.message); }
}

// --- the waterfall ----------------------------------------------------------

// Outcomes of a bar, by the error code of a failed call: a call policy or
// an approver refused is denied, one a cancel stopped is cancelled.
const DENIED_CODES = new Set(["policy_rejected", "mode_not_allowed", "approval_required", "approval_denied",
  "approval_expired", "approval_invalid", "approval_replayed", "forbidden"]);
const CANCELLED_CODES = new Set(["canceled", "run_canceled", "cancelled"]);

function outcomeOf(ev, d) {
  if (ev === "action.completed") return "ok";
  const code = (d.error || {}).code || "";
  if (DENIED_CODES.has(code)) return "denied";
  if (CANCELLED_CODES.has(code)) return "cancelled";
  return "failed";
}

// waterfallModel reads a run's events (in the order they came, each with
// its time in ms) into rows, one per action call (its cycle and plan index,
// a workflow's step), each holding the call's bars (one per attempt:
// started durationMs before its result, on the executor the result names)
// and its gaps (an approval, a retry's backoff, a wait for capacity), and
// run-wide gaps (awaiting input). A call dispatched and not answered is a
// running bar up to now (or cancelled at the run's end). Times are ms.
function waterfallModel(evs, ended, now) {
  const rows = new Map();
  const groups = new Map();
  const dispatched = new Map();
  const open = new Map();
  let t0 = Infinity, t1 = -Infinity;
  const rowOf = (cycle, planIndex, action) => {
    const k = cycle + "/" + planIndex;
    if (!rows.has(k)) rows.set(k, { cycle, planIndex, action: action || "", step: "", bars: [], gaps: [] });
    const r = rows.get(k);
    if (action && !r.action) r.action = action;
    if (!groups.has(cycle)) groups.set(cycle, "");
    return r;
  };
  const opens = (r, from, reason) => { close(r, from, ""); open.set(r, { from, reason }); };
  const close = (r, to, outcome) => {
    const g = open.get(r);
    if (!g) return;
    open.delete(r);
    r.gaps.push({ from: g.from, to: Math.max(g.from, to), reason: g.reason + (outcome ? " → " + outcome : "") });
  };
  const sorted = evs.map((e, i) => [e, i]).sort((a, b) => a[0].time - b[0].time || a[1] - b[1]).map(x => x[0]);
  for (const e of sorted) {
    const d = e.data || {};
    const t = e.time;
    t0 = Math.min(t0, t);
    t1 = Math.max(t1, t);
    const cycle = d.cycle == null ? 0 : d.cycle;
    if (e.type === "decision.made") {
      const dec = d.decision || {};
      if (dec.type === "plan") groups.set(cycle, "plan of " + (dec.actions || []).length + ", in parallel");
      continue;
    }
    if (e.type === "action.completed" || e.type === "action.failed") {
      const r = rowOf(cycle, d.planIndex || 0, d.action);
      if (d.stepId) r.step = d.stepId;
      const start = t - (Number(d.durationMs) || 0);
      t0 = Math.min(t0, start);
      close(r, start, "");
      dispatched.delete(r);
      r.bars.push({ start, end: t, outcome: outcomeOf(e.type, d), executor: d.executor || "", attempt: d.attempt || 1,
        code: (d.error || {}).code || "", replayed: !!d.replayed });
      continue;
    }
    if (e.type !== "run.step" && e.type !== "run.progress") continue;
    const det = d.details || {};
    const call = () => rowOf(cycle, d.planIndex || 0, d.action);
    switch (d.name) {
      case "action-dispatched": case "action-redispatched": {
        const r = call();
        close(r, t, "");
        if (!dispatched.has(r)) dispatched.set(r, t);
        break;
      }
      case "awaiting-approval":
        opens(call(), t, "awaiting approval" + (det.approvalId ? " " + shortID(det.approvalId) : ""));
        break;
      case "approval-granted": close(call(), t, "granted"); break;
      case "approval-denied": case "approval-expired": {
        const r = call();
        close(r, t, d.name === "approval-denied" ? "denied" : "expired");
        r.bars.push({ start: t, end: t, outcome: "denied", executor: "", attempt: 0, code: d.name.replace("-", "_") });
        break;
      }
      case "policy-evaluated": {
        const snap = det.snapshot || {};
        if (snap.action === "deny" || /^deny/.test(d.message || "")) {
          call().bars.push({ start: t, end: t, outcome: "denied", executor: "", attempt: 0, code: "policy_rejected" });
        }
        break;
      }
      case "workflow-step-retry":
        opens(call(), t, "retry backoff" + (det.attempt ? " after attempt " + det.attempt + " of " + (det.maxAttempts || "?") : ""));
        break;
      case "waiting-for-capacity": opens(call(), t, "waiting for capacity" + (det.key ? " (" + det.key + ")" : "")); break;
      case "awaiting-input": opens(rowOf(cycle, -1, "input"), t, "awaiting input" + (d.message ? ": " + d.message : "")); break;
      case "input-received": close(rowOf(cycle, -1, "input"), t, "answered"); break;
    }
  }
  const end = ended ? ended.time : now;
  if (ended || dispatched.size || open.size) t1 = Math.max(t1, end);
  for (const [r, from] of dispatched) {
    r.bars.push({ start: from, end: Math.max(from, end), outcome: ended ? "cancelled" : "running", executor: "", attempt: 0, code: "" });
  }
  for (const r of [...open.keys()]) close(r, end, ended ? "run " + ended.status : "waiting");
  const list = [...rows.values()].sort((a, b) => a.cycle - b.cycle || a.planIndex - b.planIndex);
  for (const r of list) r.bars.sort((a, b) => a.start - b.start);
  return { rows: list, groups, t0, t1 };
}

// niceStep is a tick interval of 1, 2 or 5 times a power of ten near
// span/6 ms.
function niceStep(span) {
  const raw = Math.max(span / 6, 1);
  const p = Math.pow(10, Math.floor(Math.log10(raw)));
  for (const m of [1, 2, 5, 10]) if (raw <= m * p) return m * p;
  return 10 * p;
}

const SVG = "http://www.w3.org/2000/svg";

// svg makes an SVG element; text children are text nodes, never markup.
function svg(tag, attrs, text) {
  const e = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) e.setAttribute(k, String(v));
  if (text != null) e.textContent = String(text);
  return e;
}

// place puts a label of about textW px by a mark at x1 of width w, where
// it overlaps nothing the row holds so far but the mark itself (taken, a
// list of [from, to, mark] it adds the label to) and stays between the
// label column (labelW) and the right edge (W): in the order of prefer
// ("after", "before", "inside": at its start, middle or end, when it
// fits in the mark). It returns null when there is no room: the mark's
// title still says it all.
function place(x1, w, textW, labelW, W, taken, prefer, mark) {
  const froms = where => where === "after" ? [x1 + w + 4] : where === "before" ? [x1 - 4 - textW]
    : w >= textW + 8 ? [x1 + 4, x1 + (w - textW) / 2, x1 + w - 4 - textW] : [];
  for (const where of prefer) {
    for (const from of froms(where)) {
      const to = from + textW;
      if (from < labelW || to > W || taken.some(([a, b, of]) => of !== mark && from < b && a < to)) continue;
      taken.push([from, to, null]);
      return { x: from, anchor: "start" };
    }
  }
  return null;
}

function queueWaterfall() {
  if (state.drawing) return;
  state.drawing = requestAnimationFrame(() => { state.drawing = 0; drawWaterfall(); });
}

// drawWaterfall draws the run's waterfall: a time axis, then per cycle (a
// plan's fan-out, a workflow's steps) one row per action call with a bar
// per attempt, coloured by outcome and labelled with the executor and the
// time it took, and gaps (dashed) where the call or the run waited, with
// the reason. While something runs or waits it is drawn again each second.
function drawWaterfall() {
  const box = document.getElementById("waterfall");
  clearTimeout(state.tick);
  const m = waterfallModel(state.events, state.ended, Date.now());
  if (!m.rows.length) {
    box.replaceChildren(el("p", { class: "muted" }, "No action yet."));
    return;
  }
  const W = Math.max(480, box.clientWidth - 16);
  const labelW = Math.min(300, Math.round(W * 0.28));
  const chartW = W - labelW - 12;
  const span = Math.max(m.t1 - m.t0, 1);
  const x = t => labelW + (t - m.t0) / span * chartW;
  const rowH = 22, groupH = 20, axisH = 20;
  const g = svg("g");
  let y = axisH;
  const step = niceStep(span);
  let lastCycle = null, bars = 0, running = false;
  for (const r of m.rows) {
    if (r.cycle !== lastCycle) {
      lastCycle = r.cycle;
      const what = m.groups.get(r.cycle);
      const kind = (state.runs.get(state.runId) || {}).kind;
      g.append(svg("text", { class: "group", x: 0, y: y + 14 }, (kind === "workflow" ? "workflow steps" : "cycle " + r.cycle) + (what ? " — " + what : "")));
      y += groupH;
    }
    const row = svg("g", { class: "row", "data-cycle": r.cycle, "data-plan-index": r.planIndex });
    row.append(svg("rect", { class: "band", x: 0, y, width: W, height: rowH - 2, opacity: bars % 2 ? 0 : 1 }));
    const name = r.planIndex < 0 ? "input" : "#" + r.planIndex + " " + r.action + (r.step ? " [" + r.step + "]" : "");
    const label = svg("text", { class: "row-label", x: 4, y: y + 15 }, name.length > 42 ? name.slice(0, 41) + "…" : name);
    label.append(svg("title", {}, name));
    row.append(label);
    const taken = r.bars.map(b => [x(b.start), x(b.start) + Math.max(3, x(b.end) - x(b.start)), b]);
    for (const b of r.bars) {
      const x1 = x(b.start), w = Math.max(3, x(b.end) - x1);
      const took = b.outcome === "denied" && b.end === b.start ? b.code : human(b.end - b.start);
      const who = b.executor ? "on " + b.executor : "";
      const text = [b.outcome === "ok" ? "" : b.outcome, who, took, b.attempt > 1 ? "attempt " + b.attempt : "", b.replayed ? "replayed" : ""].filter(Boolean).join(" · ");
      const bg = svg("g", { class: "bar", "data-action": r.action, "data-cycle": r.cycle, "data-plan-index": r.planIndex,
        "data-step": r.step, "data-executor": b.executor, "data-outcome": b.outcome, "data-attempt": b.attempt,
        "data-start": Math.round(b.start - m.t0), "data-end": Math.round(b.end - m.t0) });
      bg.append(svg("rect", { class: b.outcome, x: x1, y: y + 3, width: w, height: rowH - 8, rx: 2 }));
      const at = place(x1, w, text.length * 6.5, labelW, W, taken, ["after", "before", "inside"], b);
      if (at) bg.append(svg("text", { class: "bar-label", x: at.x, y: y + 14, "text-anchor": at.anchor }, text));
      bg.append(svg("title", {}, r.action + " " + text));
      row.append(bg);
      if (b.outcome === "running") running = true;
    }
    for (const gap of r.gaps) {
      const x1 = x(gap.from), w = Math.max(2, x(gap.to) - x1);
      const gg = svg("g", { class: "gap", "data-reason": gap.reason });
      gg.append(svg("rect", { class: "gap", x: x1, y: y + 3, width: w, height: rowH - 8 }));
      const text = gap.reason + " · " + human(gap.to - gap.from);
      const at = place(x1, w, text.length * 6, labelW, W, taken, ["inside", "after", "before"], gap);
      if (at) gg.append(svg("text", { class: "gap-label", x: at.x, y: y + 14, "text-anchor": at.anchor }, text));
      gg.append(svg("title", {}, text));
      row.insertBefore(gg, row.querySelector("g.bar"));
      if (/waiting$/.test(gap.reason)) running = true;
    }
    g.append(row);
    y += rowH;
    bars++;
  }
  const axis = svg("g", { class: "axis" });
  for (let v = 0; v <= span + 1e-9; v += step) {
    axis.append(svg("line", { class: "tick", x1: x(m.t0 + v), x2: x(m.t0 + v), y1: axisH - 4, y2: y }));
    const tx = x(m.t0 + v);
    axis.append(svg("text", { class: "tick", x: tx, y: axisH - 8, "text-anchor": v === 0 ? "start" : tx + 40 > W ? "end" : "middle" }, "+" + human(v)));
  }
  const root = svg("svg", { width: W, height: y + 4, viewBox: "0 0 " + W + " " + (y + 4), role: "img", "aria-label": "waterfall of the run's actions" });
  root.append(axis, g);
  const legend = el("div", { class: "legend" },
    ...["ok", "failed", "denied", "cancelled", "running", "gap"].map(o => el("span", {}, el("i", { class: "swatch " + o }), o === "gap" ? "waiting (approval, input, retry backoff, capacity)" : o)),
    el("span", {}, "span " + human(span)));
  box.replaceChildren(root, legend);
  if (running && state.view === "run") state.tick = setTimeout(queueWaterfall, 1000);
}

async function verifyAudit() {
  const out = document.getElementById("run-audit");
  try {
    const a = await api("GET", runPath(state.runId, "audit"));
    out.textContent = a.verified
      ? "chain verified: " + a.records.length + " records" + (a.complete ? ", complete" : ", not ended yet")
      : "chain BROKEN at record " + a.brokenAt;
    out.className = a.verified ? "verified" : "broken";
  } catch (e) { out.textContent = e.message; }
}

// --- audit ------------------------------------------------------------------

// showAudit verifies a run's audit chain and lists its records, hashes
// shortened (each with a copy control).
async function showAudit(id) {
  if (id) document.getElementById("audit-run").value = id;
  const out = document.getElementById("audit-result");
  const body = document.querySelector("#audit tbody");
  out.textContent = "";
  body.replaceChildren();
  if (!id) return;
  try {
    const a = await api("GET", runPath(id, "audit"));
    out.textContent = a.verified
      ? "chain verified: " + a.records.length + " records" + (a.complete ? ", complete" : ", not ended yet")
      : "chain BROKEN at record " + a.brokenAt;
    out.className = a.verified ? "verified" : "broken";
    const first = a.records.length ? Date.parse(a.records[0].eventTime) : 0;
    body.replaceChildren(...a.records.map((r, i) => el("tr", { "data-kind": r.kind, class: a.brokenAt === i ? "broken" : "" },
      el("td", {}, String(r.n || i + 1)),
      el("td", { title: r.eventTime }, "+" + human(Date.parse(r.eventTime) - first)),
      el("td", {}, r.kind || ""),
      el("td", {}, (r.eventType || "").replace(/^io\.actionbus\./, "")),
      el("td", {}, r.action || ""),
      el("td", {}, r.status || ""),
      el("td", {}, r.summary || r.outputSummary || ""),
      el("td", {}, copyable(r.hash || "", short(r.hash))))));
  } catch (e) { out.textContent = e.message; out.className = "broken"; }
}

// --- catalog and start ------------------------------------------------------

async function showCatalog() {
  try {
    const c = await api("GET", "/v1/catalog");
    document.querySelector("#catalog tbody").replaceChildren(...c.actions.map(a => el("tr", { "data-action": a.name },
      el("td", {}, el("code", {}, a.name)), el("td", {}, a.mode), el("td", {}, String(a.tier)), el("td", {}, a.pool),
      el("td", {}, a.description || ""),
      el("td", {}, el("details", {}, el("summary", {}, "schema"), el("pre", {}, JSON.stringify(a.inputSchema || {}, null, 2)))))));
  } catch (e) { say(e.message); }
}

async function startRun() {
  say("");
  const body = { allowedModes: [...document.querySelectorAll("#start-modes input:checked")].map(i => i.value) };
  const action = document.getElementById("start-action").value.trim();
  if (action) {
    let args;
    try { args = JSON.parse(document.getElementById("start-args").value || "{}"); } catch (e) { say("action input: " + e.message); return; }
    body.action = { name: action, args };
  } else {
    body.prompt = document.getElementById("start-prompt").value;
    const sc = document.getElementById("start-scenario").value.trim();
    if (sc) body.scenario = sc;
  }
  try {
    const r = await api("POST", "/v1/runs", body);
    location.hash = "#run/" + encodeURIComponent(r.runId);
  } catch (e) { say(e.message); }
}

// --- navigation -------------------------------------------------------------

function route() {
  const h = location.hash.replace(/^#/, "");
  const [view, arg] = h.split("/");
  state.view = view === "run" ? "run" : (["runs", "approvals", "audit", "catalog", "start"].includes(view) ? view : "runs");
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("hidden", s.id !== "view-" + state.view);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === state.view);
  if (state.view !== "run" && state.follow) { state.follow.abort(); state.follow = null; }
  if (state.view === "run" && arg) showRun(arg);
  if (state.view === "audit") showAudit(decodeURIComponent(arg || ""));
  if (state.view === "catalog") showCatalog();
}

function showLogin() { document.getElementById("login").classList.remove("hidden"); }

function init() {
  // A console address may carry the token in its fragment (never sent to
  // the server, not kept in history once read). It signs in a tab that
  // holds no token yet, never replaces the one a tab is signed in with: a
  // link someone sent would otherwise make this tab act as them.
  const m = location.hash.match(/(?:^#|&)token=([^&]+)/);
  if (m) {
    const given = decodeURIComponent(m[1]);
    history.replaceState(null, "", location.pathname + "#runs");
    if (!token()) sessionStorage.setItem("actionbus-token", given);
    else if (given !== token()) say("this link carries another token; it was not used (this tab stays signed in as before; open the link in a new tab to use it)");
  }
  document.getElementById("token-save").addEventListener("click", () => {
    sessionStorage.setItem("actionbus-token", document.getElementById("token").value.trim());
    document.getElementById("login").classList.add("hidden");
    followIndex();
  });
  for (const id of ["filter-status", "filter-kind", "filter-user"]) document.getElementById(id).addEventListener("input", renderRuns);
  document.getElementById("start-submit").addEventListener("click", startRun);
  document.getElementById("run-verify").addEventListener("click", verifyAudit);
  document.getElementById("run-cancel").addEventListener("click", async () => {
    try { await api("POST", runPath(state.runId, "cancel"), { reason: "canceled from the console" }); } catch (e) { say(e.message); }
  });
  document.getElementById("audit-verify").addEventListener("click", () => {
    const id = document.getElementById("audit-run").value.trim();
    if (location.hash === "#audit/" + id) showAudit(id); else location.hash = "#audit/" + encodeURIComponent(id);
  });
  window.addEventListener("hashchange", route);
  window.addEventListener("resize", () => { if (state.view === "run") queueWaterfall(); });
  if (!token()) showLogin(); else followIndex();
  route();
}

init();
