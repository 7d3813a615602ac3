// The sessionlog web console: read-only views over the server's /api, no build step.
//
//   #/              status at a glance + the sessions, refreshed every few seconds
//   #/s/<id>        one session: derived transcript and state beside its raw events, followed live
//
// Everything from the server is put on the page as text (never as HTML).
"use strict";

const TOKEN_KEY = "sessionlog-token";
const STATUS_EVERY_MS = 3000;
const LIST_EVERY_MS = 5000;

let view = null; // the active view: { stop() }

// -- DOM helpers --------------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(attrs || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "class") node.className = value;
    else if (key === "text") node.textContent = value;
    else if (key.startsWith("on")) node.addEventListener(key.slice(2), value);
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function fmtBytes(n) {
  if (n === null || n === undefined) return "–";
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) { n /= 1024; i++; }
  return `${n.toFixed(n < 10 && i ? 1 : 0)} ${units[i]}`;
}

function fmtCount(n) {
  return n === null || n === undefined ? "–" : Number(n).toLocaleString("en-US");
}

function fmtAgo(ms) {
  if (!ms) return "–";
  const s = Math.max(0, (Date.now() - ms) / 1000);
  if (s < 60) return `${Math.round(s)} s ago`;
  if (s < 3600) return `${Math.round(s / 60)} min ago`;
  if (s < 86400) return `${Math.round(s / 3600)} h ago`;
  return new Date(ms).toISOString().slice(0, 16).replace("T", " ");
}

function fmtTime(iso) {
  if (!iso) return "";
  const d = new Date(iso);
  return isNaN(d) ? iso : d.toTimeString().slice(0, 8) + "." + String(d.getMilliseconds()).padStart(3, "0");
}

// -- API with bearer tokens ---------------------------------------------------------------------

function authHeaders() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? { Authorization: `Bearer ${token}` } : {};
}

class ApiError extends Error {
  constructor(status, body) {
    super(body && body.message ? `${body.reason}: ${body.message}` : `HTTP ${status}`);
    this.status = status;
    this.reason = body && body.reason;
  }
}

let tokenPrompt = null;

function askToken(message) {
  if (tokenPrompt) return tokenPrompt;
  const dialog = document.getElementById("token-dialog");
  document.getElementById("token-error").textContent = message || "";
  tokenPrompt = new Promise((resolve) => {
    const form = document.getElementById("token-form");
    form.onsubmit = () => {
      sessionStorage.setItem(TOKEN_KEY, document.getElementById("token-input").value.trim());
      document.getElementById("token-button").hidden = false;
      tokenPrompt = null;
      resolve();
    };
  });
  if (!dialog.open) dialog.showModal();
  return tokenPrompt;
}

async function api(path, options) {
  for (let attempt = 0; attempt < 5; attempt++) {
    const response = await fetch(path, { headers: authHeaders(), ...(options || {}) });
    if (response.status === 401) {
      const had = sessionStorage.getItem(TOKEN_KEY);
      await askToken(had ? "That token was not accepted." : "");
      continue;
    }
    if (!response.ok) {
      let body = null;
      try { body = await response.json(); } catch (e) { /* not JSON */ }
      throw new ApiError(response.status, body);
    }
    return response;
  }
  throw new ApiError(401, { reason: "UNAUTHENTICATED", message: "no accepted token" });
}

async function getJSON(path) {
  return (await api(path)).json();
}

// -- status bar (metrics at a glance) -----------------------------------------------------------

function card(label, value, sub, extra) {
  return el("div", { class: "card" },
    el("div", { class: "label", text: label }),
    el("div", { class: "value", text: value }),
    sub ? el("div", { class: "sub", text: sub }) : null,
    extra || null);
}

async function refreshStatus() {
  const box = document.getElementById("status");
  let s;
  try {
    s = await getJSON("/api/status");
  } catch (error) {
    box.replaceChildren(el("span", { class: "error", text: `status unavailable: ${error.message}` }));
    return;
  }
  const role = document.getElementById("role");
  role.textContent = s.role;
  role.className = `pill ${s.role}`;
  if (s.session_prefix !== undefined) { // a tenant's token: server-wide numbers are not shown
    box.replaceChildren(card("sessions", `${s.session_prefix}…`, "this token's sessions"));
    return;
  }
  const used = s.map_size ? s.used_bytes / s.map_size : 0;
  const fill = el("span");
  fill.style.width = `${Math.max(1, Math.round(used * 100))}%`; // CSSOM: the CSP allows no inline style
  const bar = el("div", { class: used > 0.85 ? "bar warn" : "bar" }, fill);
  const requests = Object.values(s.requests || {}).reduce((a, b) => a + b, 0);
  const cards = [
    card("sessions", fmtCount(s.sessions)),
    card("events", fmtCount(s.events), `${fmtCount(s.appended_events)} appended since start`),
    card("map usage", `${(used * 100).toFixed(used < 0.1 ? 2 : 1)} %`,
      `${fmtBytes(s.used_bytes)} of ${fmtBytes(s.map_size)}`, bar),
    card("commits", fmtCount(s.commits),
      s.mean_group_size ? `${s.mean_group_size.toFixed(1)} commands per commit` : "group commit"),
    card("requests", fmtCount(requests),
      `${fmtCount(s.request_errors)} refused` +
      (s.append_mean_seconds ? ` · append ${(s.append_mean_seconds * 1000).toFixed(1)} ms` : "")),
    card("open streams", fmtCount(s.open_streams), `${fmtBytes(s.sent_bytes)} sent`),
  ];
  const r = s.replication;
  if (r) {
    const state = r.diverged ? "DIVERGED"
      : r.connected ? (r.caught_up && r.lag_positions === 0 ? "in sync" : "catching up") : "disconnected";
    const note = r.diverged ? `${r.detail} · primary ${r.primary}`
      : `lag ${fmtCount(r.lag_positions)} changes / ${r.lag_seconds.toFixed(1)} s · primary ${r.primary}`;
    cards.push(card("replication", state, note));
  }
  cards.push(card("feed position", fmtCount(s.position),
    s.head_commit_ms ? `last commit ${fmtAgo(s.head_commit_ms)}` : "no writes yet"));
  box.replaceChildren(...cards);
}

// -- sessions list ------------------------------------------------------------------------------

function sessionLink(id) {
  return el("a", { href: `#/s/${encodeURIComponent(id)}`, text: id });
}

// A fork copies the parent's events 0..at_seq, so it records at_seq + 1 copied events: name the
// last copied seq, the number the fork was asked for.
function forkPoint(s) {
  if (s.parent_seq !== undefined && s.parent_seq !== null) return `spawned at seq ${s.parent_seq}`;
  return s.parent_event_count ? `at seq ${s.parent_event_count - 1}` : "before its first event";
}

// The usage ledger's totals of a session, summed over its models: "1,200 in / 80 out".
function tokensText(usage) {
  if (!usage || !usage.length) return "–";
  const sum = (key) => usage.reduce((total, u) => total + u[key], 0);
  return `${fmtCount(sum("input_tokens"))} in / ${fmtCount(sum("output_tokens"))} out`;
}

function labelChips(labels) {
  const pairs = Object.entries(labels ?? {});
  if (!pairs.length) return "–";
  return pairs.map(([k, v]) => el("span", { class: "label", text: v ? `${k}=${v}` : k }));
}

function sessionsView() {
  let prefix = "";
  let filter = "";
  let order = "";
  let shown = 100;
  let timer = null;
  const input = el("input", { type: "search", placeholder: "filter by id prefix", "aria-label": "prefix" });
  const filterInput = el("input", {
    type: "search",
    id: "filter",
    placeholder: 'filter, e.g. labels.team = "core" AND status = "done"',
    "aria-label": "filter",
  });
  const orderSelect = el("select", { id: "order", "aria-label": "order" },
    el("option", { value: "", text: "by id" }),
    el("option", { value: "update_time", text: "newest update first" }));
  const body = el("tbody");
  const more = el("button", { class: "small", type: "button", hidden: true, text: "more" });
  const note = el("p", { class: "muted" });
  const table = el("table", { id: "sessions" },
    el("thead", {}, el("tr", {},
      ["session", "events", "updated", "created", "parent", "lease", "title", "labels", "status", "tokens"]
        .map((h) => el("th", { text: h })))),
    body);

  async function load() {
    const query = new URLSearchParams({ prefix, limit: String(shown), filter, order });
    let data;
    try {
      data = await getJSON(`/api/sessions?${query}`);
    } catch (error) {
      note.textContent = error.message;
      note.className = "error";
      return;
    }
    note.className = "muted";
    note.textContent = data.sessions.length ? "" : "No sessions yet: append to one and it shows up here.";
    body.replaceChildren(...data.sessions.map((s) => el("tr", { "data-session": s.session_id },
      el("td", {}, sessionLink(s.session_id)),
      el("td", { class: "num", text: fmtCount(s.event_count) }),
      el("td", { text: fmtAgo(s.update_time_ms ?? s.last_append_time_ms) }),
      el("td", { text: fmtAgo(s.create_time_ms) }),
      el("td", {}, s.parent_session_id ? [sessionLink(s.parent_session_id), ` ${forkPoint(s)}`] : "–"),
      el("td", { text: s.lease ? `${s.lease.holder} (token ${s.lease.token})` : "–" }),
      el("td", { class: "title", text: s.title || "–" }),
      el("td", { class: "labels" }, labelChips(s.labels)),
      el("td", { text: s.status || "–" }),
      el("td", { class: "num", text: tokensText(s.usage) }))));
    more.hidden = !data.more;
  }

  input.addEventListener("input", () => { prefix = input.value; shown = 100; load(); });
  filterInput.addEventListener("change", () => { filter = filterInput.value; shown = 100; load(); });
  orderSelect.addEventListener("change", () => { order = orderSelect.value; shown = 100; load(); });
  more.addEventListener("click", () => { shown = Math.min(1000, shown + 100); load(); });
  document.getElementById("crumbs").replaceChildren();
  document.getElementById("view").replaceChildren(
    el("h1", { text: "Sessions" }),
    el("div", { class: "toolbar" }, input, filterInput, orderSelect),
    table, note, more);
  load();
  timer = setInterval(load, LIST_EVERY_MS);
  return { stop() { clearInterval(timer); } };
}

// -- one session: transcript beside raw events, followed live -----------------------------------

// SPEC §4: a replace stands at its start_seq, any other event at its seq; a replace covers the
// events whose position lies in its range, and hides those of them appended before it.
function position(event) {
  return event.replace ? event.replace[0] : event.seq;
}

function covers(replace, event) {
  const p = position(event);
  return event.seq !== replace.seq && p >= replace.replace[0] && p <= replace.replace[1];
}

// How a hovered replace relates to one event (a row class), or null when not at all. Covered
// events appended after it are not hidden by it; a replace whose seq but not position lies in
// the range is not covered at all.
function relation(replace, event) {
  if (event.seq === replace.seq) return "range-source";
  if (covers(replace, event)) return event.seq > replace.seq ? "range-after" : "in-range";
  const [start, stop] = replace.replace;
  if (event.replace && event.seq >= start && event.seq <= stop) return "range-outside";
  return null;
}

const RANGE_HINT = "Hover a replace to mark the events its range covers.";

// A hide shadows its range like a replace but puts nothing in its place.
function rangeVerb(event) {
  return event.type === "hide" ? "hides" : "replaces";
}

function describeRange(replace, marked) {
  const [start, stop] = replace.replace;
  const parts = [`seq ${replace.seq} ${rangeVerb(replace)} positions ${start}..${stop}` +
    (marked["in-range"].length ? `, hiding ${marked["in-range"].join(", ")}` : "")];
  if (marked["range-after"].length) {
    parts.push(`${marked["range-after"].join(", ")} in range, but appended after it: not hidden`);
  }
  if (marked["range-outside"].length) {
    parts.push(`${marked["range-outside"].join(", ")}: seq in range, but a replace stands at its start_seq: not covered`);
  }
  return parts.join(" · ");
}

function seqList(seqs) {
  return `${seqs.length > 1 ? "seqs" : "seq"} ${seqs.join(", ")}`;
}

function dataText(data) {
  if (!data || !Object.keys(data).length) return "";
  return JSON.stringify(data, null, 1).replace(/\n\s*/g, " ");
}

function sessionView(sessionId) {
  const controller = new AbortController();
  const rows = new Map(); // seq -> { event, tr }
  const tbody = el("tbody");
  const transcript = el("div", { id: "transcript", class: "scroll" });
  const stateBox = el("pre", { id: "state", class: "state" });
  const live = el("span", { id: "live", class: "live", text: "connecting…" });
  const counts = el("span", { class: "muted", id: "counts" });
  const origin = el("span", { class: "muted", id: "origin" });
  const rangeInfo = el("div", { class: "range-info", id: "range-info", text: RANGE_HINT });
  const earlier = el("button", { class: "small", type: "button", hidden: true, text: "load earlier events" });
  let first = 0;
  let nextSeq = 0;
  let transcriptTimer = null;
  let statusTimer = null;

  document.getElementById("crumbs").replaceChildren(el("a", { href: "#/", text: "sessions" }), " / ", sessionId);
  document.getElementById("view").replaceChildren(
    el("div", { class: "session-head" }, el("h1", { text: sessionId }), counts, origin, live),
    el("div", { class: "columns" },
      el("div", { class: "stack" },
        el("section", { class: "panel" }, el("h2", { text: "Transcript (derived messages)" }), transcript),
        el("section", { class: "panel", id: "state-panel" },
          el("h2", { text: "State (GetState)" }), stateBox)),
      el("section", { class: "panel" }, el("h2", { text: "Raw events" }),
        el("div", { class: "legend", id: "legend" },
          el("span", {}, el("span", { class: "swatch shadow" }), "greyed: hidden by a later replace"),
          el("span", { class: "muted" }, el("span", { class: "swatch book" }), "bookkeeping: never shown to the model"),
          el("span", {}, el("span", { class: "swatch range" }), "hover a replace: events at a position in its range"),
          el("span", {}, el("span", { class: "swatch after" }), "in range, appended after it: not hidden")),
        rangeInfo,
        el("div", { class: "scroll", id: "raw-scroll" }, earlier,
          el("table", { class: "events", id: "raw" },
            el("thead", {}, el("tr", {}, ["seq", "time", "type", "op", "data"].map((h) => el("th", { text: h })))),
            tbody)))));

  function row(event, fresh) {
    const classes = [event.surface ? "surface" : "bookkeeping"];
    if (event.shadowed) classes.push("shadowed");
    if (fresh) classes.push("new");
    const op = el("td", { class: "op" },
      event.replace ? el("span", { class: "badge replace", text: `${rangeVerb(event)} ${event.replace[0]}..${event.replace[1]}` }) : null);
    const tr = el("tr", { class: classes.join(" "), "data-seq": event.seq },
      el("td", { class: "num mono", text: event.seq }),
      el("td", { class: "mono", text: fmtTime(event.time), title: event.time || "" }),
      el("td", { class: "type", text: event.type }),
      op,
      el("td", { class: "data" }, el("pre", { text: dataText(event.data), title: JSON.stringify(event.data, null, 2) }),
        event.state_delta ? el("pre", { class: "delta", text: `state Δ ${dataText(event.state_delta) || "{}"}` }) : null));
    if (event.replace) {
      tr.addEventListener("mouseenter", () => highlight(event, true));
      tr.addEventListener("mouseleave", () => highlight(event, false));
    }
    rows.set(event.seq, { event, tr, op });
    return tr;
  }

  // Marks, while a replace is hovered, every loaded event its range covers by position, and says
  // why in the line above the table. A covered event appended after the replace also gets a note
  // row under it: those rows lie below the hovered one, so the row under the pointer never moves.
  function highlight(replace, on) {
    for (const note of tbody.querySelectorAll("tr.range-note")) note.remove();
    const marked = { "in-range": [], "range-after": [], "range-outside": [] };
    for (const { event, tr } of rows.values()) {
      tr.classList.remove("range-source", "in-range", "range-after", "range-outside");
      const found = on ? relation(replace, event) : null;
      if (!found) continue;
      tr.classList.add(found);
      if (found in marked && (found !== "in-range" || event.surface)) marked[found].push(event.seq);
      if (found === "range-after") {
        tr.after(el("tr", { class: "range-note", "data-note-for": event.seq },
          el("td", { colspan: 5, text: `↑ seq ${event.seq} stands at position ${position(event)}: ` +
            "in range, but appended after this replace: not hidden" })));
      }
    }
    rangeInfo.textContent = on ? describeRange(replace, marked) : RANGE_HINT;
    rangeInfo.title = rangeInfo.textContent;
  }

  function shadowBy(replace) {
    // SPEC's rule: a replace hides every earlier surface event whose position is in its range.
    for (const { event, tr } of rows.values()) {
      if (event.surface && !event.shadowed && event.seq < replace.seq && covers(replace, event)) {
        event.shadowed = true;
        tr.classList.add("shadowed");
      }
    }
  }

  // Names, on each shadowed row, the loaded replaces that hide it. The loaded rows always run to
  // the log's end, so every replace appended after a loaded event is loaded too.
  function labelShadowed() {
    const replaces = [...rows.values()].map((r) => r.event).filter((e) => e.replace);
    for (const { event, op } of rows.values()) {
      if (!event.shadowed) continue;
      const by = replaces.filter((r) => r.seq > event.seq && covers(r, event)).map((r) => r.seq).sort((a, b) => a - b);
      const text = by.length ? `hidden by ${seqList(by)}` : "shadowed";
      const badge = op.querySelector(".badge.shadow") || op.appendChild(el("span", { class: "badge shadow" }));
      badge.textContent = text;
    }
  }

  function setCounts() {
    counts.textContent = `${fmtCount(nextSeq)} events`;
  }

  function message(m, all) {
    const box = el("div", { class: `message role-${m.role}`, "data-seq": m.seq },
      el("div", { class: "who" }, m.role, m.name ? el("span", { class: "seq", text: `(${m.name})` }) : null,
        el("span", { class: "seq", text: `#${m.seq}` }),
        m.replace ? el("span", { class: "badge replace", text: `summary · replaces ${m.replace[0]}..${m.replace[1]}` }) : null),
      m.content ? el("div", { class: "content", text: m.content }) : null,
      m.reasoning ? el("details", {}, el("summary", { text: "reasoning" }), el("pre", { text: m.reasoning })) : null);
    for (const call of m.tool_calls) {
      const result = call.result === null ? null : all[call.result];
      box.append(el("div", { class: "tool-call", "data-call-id": call.id || "" },
        el("div", { class: "call mono" }, "→ ", el("b", { text: call.name || "tool" }), `(${call.arguments || ""})`),
        result
          ? el("div", { class: "tool-result", "data-seq": result.seq },
            el("div", { class: "label", text: `← result #${result.seq}` }),
            el("pre", { text: result.content || "" }))
          : el("div", { class: "tool-result pending", text: "no result yet" })));
    }
    return box;
  }

  async function loadTranscript() {
    try {
      const data = await getJSON(`/api/sessions/${encodeURIComponent(sessionId)}/transcript`);
      const shown = data.messages
        .filter((m) => m.answers === null) // paired tool results are shown under their call
        .map((m) => message(m, data.messages));
      transcript.replaceChildren(...(shown.length ? shown : [el("p", { class: "muted", text: "No messages yet." })]));
      transcript.scrollTop = transcript.scrollHeight;
    } catch (error) {
      transcript.replaceChildren(el("p", { class: "error", text: error.message }));
    }
  }

  async function loadState() {
    try {
      const data = await getJSON(`/api/sessions/${encodeURIComponent(sessionId)}/state`);
      stateBox.textContent = JSON.stringify(data.state, null, 2);
      stateBox.title = `after ${fmtCount(data.event_count)} events`;
    } catch (error) {
      stateBox.textContent = error.message;
    }
  }

  function scheduleTranscript() {
    clearTimeout(transcriptTimer);
    transcriptTimer = setTimeout(() => Promise.all([loadTranscript(), loadState()]), 150);
  }

  async function loadEvents(from) {
    const query = from === undefined ? "" : `?from=${from}`;
    const data = await getJSON(`/api/sessions/${encodeURIComponent(sessionId)}/events${query}`);
    const fresh = data.events.filter((e) => !rows.has(e.seq)).map((e) => row(e, false));
    if (from === undefined) tbody.replaceChildren(...fresh);
    else tbody.prepend(...fresh);
    first = data.from;
    nextSeq = Math.max(nextSeq, data.next_seq);
    earlier.hidden = first === 0;
    labelShadowed();
    setCounts();
  }

  earlier.addEventListener("click", () => loadEvents(Math.max(0, first - 500)));

  async function loadOrigin() {
    try {
      const s = await getJSON(`/api/sessions/${encodeURIComponent(sessionId)}`);
      if (s.parent_session_id) origin.replaceChildren("forked from ", sessionLink(s.parent_session_id), ` ${forkPoint(s)}`);
    } catch (error) {
      origin.textContent = ""; // the events' own error says what went wrong
    }
  }

  function applyLive(events) {
    for (const event of events) {
      if (rows.has(event.seq)) continue;
      event.shadowed = false;
      tbody.append(row(event, true));
      if (event.replace) shadowBy(event);
      nextSeq = Math.max(nextSeq, event.seq + 1);
    }
    labelShadowed();
    setCounts();
    const scroller = document.getElementById("raw-scroll");
    if (scroller) scroller.scrollTop = scroller.scrollHeight;
    scheduleTranscript();
    clearTimeout(statusTimer);
    statusTimer = setTimeout(refreshStatus, 300);
  }

  async function followOnce() {
    const url = `/api/sessions/${encodeURIComponent(sessionId)}/follow?from=${nextSeq}`;
    const response = await api(url, { signal: controller.signal });
    const reader = response.body.getReader();
    const decoder = new TextDecoder();
    let buffer = "";
    for (;;) {
      const { value, done } = await reader.read();
      if (done) return;
      buffer += decoder.decode(value, { stream: true });
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const frame = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        let kind = "message";
        let data = "";
        for (const line of frame.split("\n")) {
          if (line.startsWith("event: ")) kind = line.slice(7);
          else if (line.startsWith("data: ")) data += line.slice(6);
        }
        if (!data) continue;
        const body = JSON.parse(data);
        if (kind === "events") applyLive(body.events);
        if (kind === "caught_up") { live.textContent = "● live"; live.className = "live on"; }
      }
    }
  }

  async function follow() {
    let backoff = 500;
    while (!controller.signal.aborted) {
      try {
        await followOnce();
      } catch (error) {
        if (controller.signal.aborted) return;
      }
      live.textContent = "reconnecting…";
      live.className = "live";
      await new Promise((resolve) => setTimeout(resolve, backoff));
      backoff = Math.min(backoff * 2, 5000);
    }
  }

  (async () => {
    try {
      await loadEvents();
    } catch (error) {
      document.getElementById("view").append(el("p", { class: "error", text: error.message }));
      return;
    }
    const scroller = document.getElementById("raw-scroll");
    if (scroller) scroller.scrollTop = scroller.scrollHeight;
    await Promise.all([loadTranscript(), loadState(), loadOrigin()]);
    follow();
  })();

  return { stop() { controller.abort(); clearTimeout(transcriptTimer); clearTimeout(statusTimer); } };
}

// -- routing ------------------------------------------------------------------------------------

function route() {
  if (view) view.stop();
  const hash = location.hash || "#/";
  if (hash.startsWith("#/s/")) view = sessionView(decodeURIComponent(hash.slice(4)));
  else view = sessionsView();
}

window.addEventListener("hashchange", route);
window.addEventListener("DOMContentLoaded", () => {
  document.getElementById("token-button").hidden = !sessionStorage.getItem(TOKEN_KEY);
  document.getElementById("token-button").addEventListener("click", () => {
    sessionStorage.removeItem(TOKEN_KEY);
    askToken("").then(() => { refreshStatus(); route(); });
  });
  refreshStatus();
  setInterval(refreshStatus, STATUS_EVERY_MS);
  route();
});
