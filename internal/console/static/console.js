// actionbus console: plain JavaScript over the HTTP API (docs/http.md).
// Everything shown is built with textContent, never parsed as HTML.
"use strict";

const state = { runs: new Map(), approvals: [], view: "runs", runId: "", follow: null, index: null };

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

function age(iso) {
  const s = Math.max(0, Math.round((Date.now() - Date.parse(iso)) / 1000));
  return s < 60 ? s + "s" : s < 3600 ? Math.round(s / 60) + "m" : Math.round(s / 3600) + "h";
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
    el("td", {}, el("code", {}, a.approvalId)),
    el("td", {}, el("a", { href: "#run/" + a.runId }, a.runId)),
    el("td", {}, a.action),
    el("td", {}, a.userId || ""),
    el("td", {}, el("code", {}, a.inputHash)),
    el("td", {}, el("pre", {}, JSON.stringify(a.input, null, 2))),
    el("td", {}, a.reason || ""),
    el("td", {}, new Date(a.expiresAt).toLocaleString()),
    el("td", {},
      el("button", { class: "approve", "data-approval": a.approvalId, onclick: () => answer(a.approvalId, "approve") }, "Approve"),
      " ",
      el("button", { class: "deny", "data-approval": a.approvalId, onclick: () => answer(a.approvalId, "deny") }, "Deny"))));
  document.querySelector("#approvals tbody").replaceChildren(...rows);
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
      return d.action + " ok in " + d.durationMs + " ms on " + (d.executor || "?") + (d.replayed ? " (replayed)" : "") + (d.summary ? " — " + d.summary : "");
    case "action.failed":
      return d.action + " failed: " + (d.error || {}).code + " " + ((d.error || {}).message || "");
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
  const body = document.querySelector("#timeline tbody");
  body.replaceChildren();
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
      if (ev === "end") {
        renderRunHeader(Object.assign({}, state.runs.get(id) || {}, e, { waiting: "" }));
        return;
      }
      if (ev === "error") { say((e.error || {}).code + ": " + (e.error || {}).message); return; }
      const t = Date.parse(e.time);
      if (!first) first = t;
      const d = e.data || {};
      body.append(el("tr", { "data-type": ev },
        el("td", {}, String(t - first)), el("td", {}, ev), el("td", {}, d.cycle == null ? "" : String(d.cycle)), el("td", {}, describe(ev, d))));
    }, ctl.signal);
  } catch (e) { if (!ctl.signal.aborted) say(e.message); }
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
  state.view = view === "run" ? "run" : (["runs", "approvals", "catalog", "start"].includes(view) ? view : "runs");
  for (const s of document.querySelectorAll(".view")) s.classList.toggle("hidden", s.id !== "view-" + state.view);
  for (const a of document.querySelectorAll("nav a")) a.classList.toggle("active", a.dataset.view === state.view);
  if (state.view !== "run" && state.follow) { state.follow.abort(); state.follow = null; }
  if (state.view === "run" && arg) showRun(arg);
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
  window.addEventListener("hashchange", route);
  if (!token()) showLogin(); else followIndex();
  route();
}

init();
