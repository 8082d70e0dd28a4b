// sessiond's web view: sessions, one session live, the host. Plain ES module, no build.
//
// Every read is one JSON-RPC call to the daemon's HTTP face (POST ../rpc, the socket's
// contract and grants); a session's timeline follows over SSE (the Durable Streams tail
// of ../v1/stream/<id>). Nothing here writes unless a button that says so is pressed.

const BASE = new URL("..", location.href); // "/" or "/t/<token>/": the token stays in the path
const PAGE = 50; // sessions per page
const EVENTS_PAGE = 200; // timeline events per page
const MARK = ["\u0002", "\u0003"]; // search highlight marks, turned into <mark>
const STATUSES = ["pending", "active", "paused", "completed", "failed", "cancelled", "killed"];
const ENDABLE = new Set(["active", "paused"]);
let ids = 0;
let stop = () => {}; // ends the current view's live work when the route changes

// --- the wire ----------------------------------------------------------------------------

export async function rpc(method, params = {}) {
  const response = await fetch(new URL("rpc", BASE), {
    method: "POST",
    headers: { "content-type": "application/json" },
    body: JSON.stringify({ jsonrpc: "2.0", id: ++ids, method, params }),
  });
  const body = await response.json().catch(() => null);
  if (!body) throw new Error(`HTTP ${response.status} from ${method}`);
  if (body.error) {
    const err = new Error(`${body.error.message} (${body.error.code})`);
    err.code = body.error.code;
    throw err;
  }
  return body.result;
}

// --- small helpers -----------------------------------------------------------------------

const $ = (sel, root = document) => root.querySelector(sel);

function h(tag, attrs = {}, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === null || v === undefined || v === false) continue;
    if (k === "class") el.className = v;
    else if (k.startsWith("on")) el.addEventListener(k.slice(2), v);
    else el.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return el;
}

function ago(iso) {
  if (!iso) return "-";
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s >= 30 * 86400) return iso.slice(0, 10);
  for (const [u, n] of [["d", 86400], ["h", 3600], ["m", 60]]) if (s >= n) return `${Math.floor(s / n)}${u} ago`;
  return `${Math.floor(s)}s ago`;
}

const money = (x) => `$${(x || 0).toFixed(4)}`;
const tokens = (u) => (u ? (u.input_tokens || 0) + (u.output_tokens || 0) : 0);
const badge = (status) => h("span", { class: `badge ${status}` }, status);
const sessionLink = (id, text = id) => h("a", { href: `#/s/${encodeURIComponent(id)}`, class: "id" }, text);
const fact = (name, value, key) => h("div", { class: "fact" }, h("b", {}, name), h("span", { "data-stat": key }, value));

function marked(snippet) {
  // The daemon's marks around each match: text nodes and <mark>, never HTML from data.
  const out = [];
  const parts = snippet.split(MARK[0]);
  out.push(parts[0].replaceAll(MARK[1], ""));
  for (const part of parts.slice(1)) {
    const [hit, ...rest] = part.split(MARK[1]);
    out.push(h("mark", {}, hit), rest.join(""));
  }
  return out;
}

function fill(root, ...nodes) {
  // replaceChildren, leaving out what is null (a part that does not apply).
  root.replaceChildren(...nodes.flat().filter((n) => n !== null && n !== undefined && n !== false));
}

function show(...nodes) {
  fill($("#main"), ...nodes);
}

function fail(err) {
  show(h("p", { class: "error", role: "alert" }, String(err.message || err)));
}

function setLive(text) {
  $("#live").textContent = text;
}

function params() {
  const q = location.hash.split("?")[1] || "";
  return new URLSearchParams(q);
}

// --- the sessions list -------------------------------------------------------------------

const SINCE = { "": null, "1h": 3600, "24h": 86400, "7d": 7 * 86400, "30d": 30 * 86400 };

async function sessionsView() {
  const p = params();
  const q = p.get("q") || "";
  const form = h("form", { class: "filters", role: "search", onsubmit: (e) => {
    e.preventDefault();
    const f = new FormData(e.target);
    const next = new URLSearchParams();
    for (const [k, v] of f) if (v) next.set(k, v);
    location.hash = `#/?${next}`;
  } },
    h("label", {}, "Search text", h("input", { type: "search", name: "q", value: q, placeholder: "words, \"a phrase\", prefix*", "aria-label": "Search text" })),
    h("label", {}, "Status", h("select", { name: "status", "aria-label": "Status" },
      h("option", { value: "" }, "any"), STATUSES.map((s) => h("option", { value: s, selected: p.get("status") === s }, s)))),
    h("label", {}, "Actor", h("input", { name: "actor", value: p.get("actor") || "", size: 12 })),
    h("label", {}, "Namespace", h("input", { name: "namespace", value: p.get("namespace") || "", size: 12 })),
    h("label", {}, "Since", h("select", { name: "since", "aria-label": "Since" },
      Object.keys(SINCE).map((k) => h("option", { value: k, selected: (p.get("since") || "") === k }, k || "any time")))),
    h("button", { type: "submit", class: "primary" }, "Apply"),
  );
  const results = h("div", { id: "results" }, h("p", { class: "muted" }, "Loading…"));
  show(h("h1", {}, "Sessions"), form, results);
  const since = SINCE[p.get("since") || ""];
  const sinceIso = since ? new Date(Date.now() - since * 1000).toISOString() : null;
  const filters = {
    status: p.get("status") ? [p.get("status")] : null,
    actor_name: p.get("actor") || null,
    namespace: p.get("namespace") || null,
  };
  const cursor = p.get("cursor");
  try {
    if (q) await searchResults(results, q, filters, sinceIso, cursor, p);
    else await listResults(results, filters, sinceIso, cursor, p);
  } catch (err) {
    fill(results, h("p", { class: "error", role: "alert" }, err.message));
  }
}

function pager(next, p) {
  const nav = h("nav", { class: "pager", "aria-label": "Pages" });
  if (p.get("cursor")) {
    const first = new URLSearchParams(p);
    first.delete("cursor");
    nav.append(h("a", { href: `#/?${first}` }, "← First page"));
  }
  if (next) {
    const more = new URLSearchParams(p);
    more.set("cursor", next);
    nav.append(h("a", { href: `#/?${more}`, rel: "next" }, "Next page →"));
  }
  return nav;
}

async function listResults(root, filters, sinceIso, cursor, p) {
  const page = await rpc("session.list", { ...clean(filters), created_after: sinceIso, limit: PAGE, cursor });
  const rows = page.sessions.map((s) => h("tr", {},
    h("td", { "data-label": "session" }, sessionLink(s.session_id)),
    h("td", { "data-label": "status" }, badge(s.status)),
    h("td", { "data-label": "actor" }, s.actor_name || "-"),
    h("td", { "data-label": "namespace" }, s.namespace),
    h("td", { "data-label": "task" }, (s.task || "").slice(0, 120)),
    h("td", { class: "num", "data-label": "messages" }, s.message_count),
    h("td", { class: "num", "data-label": "tokens" }, tokens(s.token_usage)),
    h("td", { class: "num", "data-label": "cost" }, money(s.token_usage && s.token_usage.estimated_cost)),
    h("td", { "data-label": "last activity", title: s.updated_at }, ago(s.updated_at)),
  ));
  fill(root, 
    page.sessions.length ? h("table", { class: "responsive", id: "sessions" },
      h("thead", {}, h("tr", {}, ["session", "status", "actor", "namespace", "task"].map((c) => h("th", { scope: "col" }, c)),
        ["messages", "tokens", "cost"].map((c) => h("th", { scope: "col", class: "num" }, c)), h("th", { scope: "col" }, "last activity"))),
      h("tbody", {}, rows)) : h("p", { class: "muted" }, "No session matches."),
    pager(page.next_cursor, p));
}

async function searchResults(root, q, filters, sinceIso, cursor, p) {
  const r = await rpc("session.search", { query: q, ...clean(filters), since: sinceIso, limit: 20, hits: 3, mark: MARK, cursor });
  const items = r.sessions.map((s) => h("li", { class: "ev" },
    h("div", {}, sessionLink(s.session_id), " ", badge(s.status), " ", s.actor_name || "-", " · ", s.namespace,
      " · ", h("span", { class: "muted" }, `${s.matches} matching · ${ago(s.updated_at)}`)),
    s.task ? h("div", { class: "muted" }, s.task.slice(0, 160)) : null,
    s.hits.map((hit) => h("div", { class: "hit" },
      h("span", { class: "muted" }, hit.sequence !== null && hit.sequence !== undefined ? `#${hit.sequence} ${hit.role}: ` : `${hit.type}: `),
      marked(hit.snippet)))));
  fill(root, 
    items.length ? h("ul", { class: "timeline", id: "search-results" }, items) : h("p", { class: "muted" }, "No session matches."),
    r.complete ? null : h("p", { class: "muted" }, "Only the newest matches were ranked: add words or filters to reach older sessions."),
    pager(r.next_cursor, p));
}

function clean(o) {
  return Object.fromEntries(Object.entries(o).filter(([, v]) => v !== null && v !== undefined));
}

// --- one session -------------------------------------------------------------------------

function describe(e) {
  // [class, label, body] of one event of the timeline.
  const d = e.data || {};
  switch (e.type) {
    case "message.appended":
      return [`role-${d.role}`, `#${d.sequence} ${d.role}${d.tool_call_id ? ` · call ${d.tool_call_id}` : ""}`, d.content];
    case "session.created":
      return ["", `created ${d.status || "active"}`, [d.task, d.actor_name && `actor ${d.actor_name}`, d.namespace && `ns ${d.namespace}`].filter(Boolean).join(" · ")];
    case "session.status_changed":
      return ["", `${d.from} → ${d.to}`, d.reason || d.error || ""];
    case "tokens.recorded":
      return ["", "tokens", `+${d.input_tokens || 0} in · +${d.output_tokens || 0} out · ${money(d.estimated_cost)}${d.model ? ` · ${d.model}` : ""}`];
    case "progress.recorded":
      return ["", `step ${d.node_id}`, [d.edge && `edge ${d.edge}`, d.latency_ms ? `${d.latency_ms} ms` : "", d.tokens ? `${d.tokens} tokens` : "", d.retries ? `${d.retries} retries` : "", d.failed ? "FAILED" : ""].filter(Boolean).join(" · ")];
    case "checkpoint.saved":
      return ["", `checkpoint ${d.checkpoint_id}`, `node ${d.node_id || "-"} · ${d.size ?? "?"} B`];
    case "process.output":
      return ["", `output [${d.stream || "stdout"}]`, d.line];
    case "stream.chunk":
      return ["", "chunk", d.text !== undefined && d.text !== null ? d.text : `${Math.floor((d.base64 || "").length * 3 / 4)} bytes (binary)`];
    case "session.forked":
      return ["", "forked", `from ${d.from && d.from.session_id} at v${d.from && d.from.version}`];
    case "session.compacted": // a boundary: the context starts here; what is above stays
      return ["compaction", `compacted · #0–#${d.through_sequence} summarized by ${d.by || "api"}`, (d.summary || []).map((m) => `[${m.role}] ${m.content}`).join("\n")];
    default:
      return ["", e.type, JSON.stringify(d).slice(0, 400)];
  }
}

class Timeline {
  // The events of a session, paired: a tool result sits under the call it answers.
  constructor(list) {
    this.list = list;
    this.calls = new Map(); // tool_call_id -> the element of the message that made the call
    this.seen = 0; // the highest version shown
  }

  item(e) {
    const [cls, label, body] = describe(e);
    const el = h("li", { class: `ev ${cls}`, "data-version": e.version, "data-type": e.type },
      h("div", { class: "meta" }, h("span", {}, `v${e.version}`), h("span", { title: e.recorded_at }, e.recorded_at.slice(11, 19)), h("b", {}, label)),
      body ? h("div", { class: "body" }, body) : null);
    return el;
  }

  add(e, where = "end") {
    const d = e.data || {};
    if (e.type === "message.appended" && d.role === "tool" && d.tool_call_id && this.calls.has(d.tool_call_id)) {
      const call = this.calls.get(d.tool_call_id);
      call.append(h("div", { class: "result", "data-result-of": d.tool_call_id }, h("b", {}, `result #${d.sequence}: `), d.content));
      return;
    }
    const el = this.item(e);
    if (e.type === "message.appended" && d.role !== "tool") {
      for (const id of toolCallIds(d)) this.calls.set(id, el);
    }
    if (where === "start") this.list.prepend(el);
    else this.list.append(el);
    this.seen = Math.max(this.seen, e.version);
  }
}

function toolCallIds(d) {
  // The ids of the tool calls a message makes: its tool_call_id, or metadata.tool_calls.
  const calls = (d.metadata && (d.metadata.tool_calls || d.metadata.function_calls)) || [];
  const out = Array.isArray(calls) ? calls.map((c) => c && (c.id || c.call_id)).filter(Boolean) : [];
  if (d.role === "assistant" && d.tool_call_id) out.push(d.tool_call_id);
  return out;
}

async function sessionView(id) {
  const p = params();
  const at = p.get("v") ? Number(p.get("v")) : null;
  const state = await rpc("session.get", { session_id: id, at_version: at });
  const current = { version: state.version }; // moves with the live tail
  const u = state.token_usage;
  const head = h("section", { "aria-label": "Session" },
    h("h1", {}, state.session_id),
    h("div", { class: "actions" }, badge(state.status), state.actor_name || "-", "·", state.namespace, "·",
      state.task ? h("span", { class: "muted" }, state.task.slice(0, 200)) : null),
    h("div", { class: "facts", id: "facts" },
      fact("version", state.version, "version"), fact("messages", state.message_count, "messages"),
      fact("tokens in / out", `${u.input_tokens} / ${u.output_tokens}`, "tokens"), fact("cost", money(u.estimated_cost), "cost"),
      fact("created", ago(state.timestamps.created_at)), fact("updated", ago(state.timestamps.updated_at)),
      fact("checkpoints", state.checkpoint_count), fact("model", state.model || "-")));
  const travel = h("form", { class: "actions", "aria-label": "Time travel", onsubmit: (e) => {
    e.preventDefault();
    const v = new FormData(e.target).get("v");
    location.hash = v ? `#/s/${encodeURIComponent(id)}?v=${v}` : `#/s/${encodeURIComponent(id)}`;
  } },
    h("label", {}, "State at version ", h("input", { type: "number", name: "v", min: 1, max: at ? undefined : state.version, value: at || "", size: 6 })),
    h("button", { type: "submit" }, "Show"),
    at ? h("a", { href: `#/s/${encodeURIComponent(id)}` }, "Back to now") : null,
    at ? h("span", { class: "muted", role: "status" }, `Showing the state as it was at version ${at}.`) : null);
  const actions = h("div", { class: "actions", "aria-label": "Actions" },
    h("button", { type: "button", id: "fork", onclick: () => fork(id, at || current.version) }, `Fork at v${at || state.version}`),
    !at && ENDABLE.has(state.status) ? h("button", { type: "button", id: "end", onclick: () => end(id, state) }, "End session (completed)") : null,
    h("button", { type: "button", id: "export", onclick: () => exportSession(id) }, "Export JSON"),
    !at ? h("button", { type: "button", class: "danger", id: "delete", onclick: () => remove(id) }, "Delete…") : null);
  const list = h("ol", { class: "timeline", id: "timeline", "aria-live": "polite" });
  const earlier = h("button", { type: "button", id: "earlier" }, "Load earlier events");
  const graph = h("div", { id: "graph" });
  const forks = h("div", { id: "forks" });
  const executor = h("div", { id: "executor" });
  show(head, travel, actions,
    h("div", { class: "cols" },
      h("section", { "aria-label": "Timeline" }, h("h2", {}, "Timeline"), earlier, list),
      h("div", {}, h("section", { "aria-label": "Graph progress" }, h("h2", {}, "Graph progress"), graph),
        h("section", { "aria-label": "Forks" }, h("h2", {}, "Fork tree"), forks),
        h("section", { "aria-label": "Executor" }, h("h2", {}, "Executor"), executor),
        h("section", { "aria-label": "State" }, h("h2", {}, "Memory and metadata"),
          h("pre", {}, JSON.stringify({ memory: state.memory, metadata: state.metadata, progress: state.progress }, null, 2))))));
  const timeline = new Timeline(list);
  const last = state.version;
  let first = Math.max(1, last - EVENTS_PAGE + 1);
  for (const e of await eventsBetween(id, first, last)) timeline.add(e);
  const loadEarlier = async () => {
    if (first <= 1) return;
    const from = Math.max(1, first - EVENTS_PAGE);
    for (const e of (await eventsBetween(id, from, first - 1)).reverse()) timeline.add(e, "start");
    first = from;
    earlier.hidden = first <= 1;
  };
  earlier.addEventListener("click", () => loadEarlier().catch(fail));
  earlier.hidden = first <= 1;
  graphPath(graph, id, last).catch((err) => fill(graph, h("p", { class: "error" }, err.message)));
  forkTree(forks, state).catch((err) => fill(forks, h("p", { class: "error" }, err.message)));
  executorPane(executor, state).catch((err) => fill(executor, h("p", { class: "error" }, err.message)));
  if (!at) {
    // A typed session's stream is its events as JSON: follow it over SSE. A generic
    // stream's is its bytes, not events: read its events once a second instead.
    const stream = state.metadata && state.metadata.stream;
    if (stream && typeof stream.content_type === "string") poll(id, timeline, current);
    else follow(id, timeline, current);
  }
}

async function eventsBetween(id, from, to) {
  // A session's events from version `from` to `to`: as many pages as the daemon's byte
  // budget (max_page_bytes) cuts them into.
  const out = [];
  let at = from;
  while (at <= to) {
    const page = await rpc("events.read", { session_id: id, from_version: at, limit: Math.min(EVENTS_PAGE, to - at + 1) });
    for (const e of page.events) if (e.version <= to) out.push(e);
    if (page.next === null || page.next === undefined || !page.events.length) break;
    at = page.next;
  }
  return out;
}

function follow(id, timeline, current) {
  // The live tail: SSE from the Durable Streams face, from the last version shown. The
  // daemon ends each response after a while (http_sse_close_s); we reopen it from the
  // last offset its control events gave, so nothing is read twice.
  let offset = String(timeline.seen).padStart(20, "0");
  let source = null;
  let facts = null;
  let again = null;
  const open = () => {
    const url = new URL(`v1/stream/${encodeURIComponent(id)}?offset=${offset}&live=sse`, BASE);
    source = new EventSource(url);
    source.addEventListener("data", (m) => {
      let events = JSON.parse(m.data);
      if (!Array.isArray(events)) events = [events];
      for (const e of events) if (e.version > timeline.seen) timeline.add(e);
      clearTimeout(facts); // the head's figures, at most once a second
      facts = setTimeout(() => refreshFacts(id, current).catch(() => {}), 1000);
    });
    source.addEventListener("control", (m) => {
      const c = JSON.parse(m.data);
      if (c.streamNextOffset) offset = c.streamNextOffset;
      setLive(c.streamClosed ? "stream closed" : "● live");
      if (c.streamClosed) source.close();
    });
    source.addEventListener("error", () => {
      source.close();
      setLive("reconnecting…");
      again = setTimeout(open, 1000);
    });
  };
  open();
  stop = () => { source.close(); clearTimeout(facts); clearTimeout(again); setLive(""); };
}

function poll(id, timeline, current) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    try {
      const page = await rpc("events.read", { session_id: id, from_version: timeline.seen + 1, limit: EVENTS_PAGE });
      for (const e of page.events) timeline.add(e);
      if (page.events.length) await refreshFacts(id, current);
      setLive("● live (read every second)");
    } catch (err) { setLive(`reconnecting… (${err.message})`); }
    if (!stopped) timer = setTimeout(tick, 1000);
  };
  timer = setTimeout(tick, 1000);
  stop = () => { stopped = true; clearTimeout(timer); setLive(""); };
}

async function refreshFacts(id, current) {
  const s = await rpc("session.get", { session_id: id });
  current.version = s.version;
  const set = (k, v) => { const el = $(`[data-stat="${k}"]`); if (el) el.textContent = v; };
  set("version", s.version);
  set("messages", s.message_count);
  set("tokens", `${s.token_usage.input_tokens} / ${s.token_usage.output_tokens}`);
  set("cost", money(s.token_usage.estimated_cost));
  const forkButton = $("#fork");
  if (forkButton) forkButton.textContent = `Fork at v${s.version}`;
}

async function graphPath(root, id, atVersion) {
  const steps = [];
  let after = 0;
  for (let pages = 0; pages < 5; pages++) { // at most five pages drawn; the rest is counted
    const page = await rpc("progress.list", { session_id: id, after_version: after, at_version: atVersion });
    steps.push(...page.steps);
    if (page.next === null || page.next === undefined) { after = null; break; }
    after = page.next;
  }
  if (!steps.length) { fill(root, h("p", { class: "muted" }, "No graph steps.")); return; }
  const visits = new Map();
  const path = h("div", { class: "path", id: "path" });
  let prev = null;
  let run = null;
  for (const s of steps) {
    visits.set(s.node_id, (visits.get(s.node_id) || 0) + 1);
    if (prev === s.node_id && run) { run.count++; run.el.lastChild.textContent = ` ×${run.count}`; continue; }
    if (prev !== null) path.append("→");
    const el = h("span", { class: `node${s.failed ? " failed" : ""}`, title: `${s.latency_ms} ms · ${s.tokens} tokens` }, s.node_id, h("small", {}, ""));
    path.append(el);
    run = { el, count: 1 };
    prev = s.node_id;
  }
  const counts = h("table", { id: "visits" }, h("thead", {}, h("tr", {}, h("th", {}, "node"), h("th", { class: "num" }, "visits"))),
    h("tbody", {}, [...visits].map(([n, c]) => h("tr", {}, h("td", {}, n), h("td", { class: "num" }, c)))));
  fill(root, path, after !== null ? h("p", { class: "muted" }, `First ${steps.length} steps shown.`) : null, counts);
}

async function forkTree(root, state) {
  const ancestors = [];
  let link = state.forked_from;
  while (link && ancestors.length < 20) { // bounded: a tree drawn, not a chain walked whole
    ancestors.push(link);
    const up = await rpc("session.get", { session_id: link.session_id }).catch(() => null);
    link = up && up.forked_from;
  }
  const forks = await rpc("session.forks", { session_id: state.session_id, limit: 50 });
  const tree = h("ul", { class: "tree", id: "fork-tree" });
  let into = tree;
  for (const a of ancestors.reverse()) {
    const li = h("li", {}, sessionLink(a.session_id), ` @ v${a.version}`);
    into.append(li);
    const sub = h("ul", { class: "tree" });
    li.append(sub);
    into = sub;
  }
  const me = h("li", {}, h("b", {}, state.session_id), " (this session)");
  into.append(me);
  if (forks.forks.length) {
    me.append(h("ul", { class: "tree" }, forks.forks.map((f) => h("li", {}, sessionLink(f.session_id), ` forked at v${f.version}`))));
  }
  const more = forks.count - forks.forks.length;
  fill(root, tree, more > 0 ? h("p", { class: "muted" }, `… and ${more} more forks`) : null);
}

async function executorPane(root, state) {
  if (!state.turn && state.pid === null && !state.adapter) {
    fill(root, h("p", { class: "muted" }, "Not run by an executor."));
    return;
  }
  const [trajectory, output] = await Promise.all([
    rpc("session.trajectory", { session_id: state.session_id }).catch((e) => ({ error: e.message })),
    rpc("session.output", { session_id: state.session_id }).catch((e) => ({ error: e.message })),
  ]);
  const steps = trajectory.steps || [];
  fill(root, 
    h("p", {}, `turn ${state.turn} · pid ${state.pid ?? "-"} · exit ${state.exit_code ?? "-"} · adapter ${state.adapter || "-"}`),
    h("h2", {}, "Trajectory"),
    trajectory.error ? h("p", { class: "error" }, trajectory.error) :
      h("ol", { id: "trajectory" }, steps.slice(0, 500).map((s) => h("li", {}, h("b", {}, s.type), " ", s.summary))),
    h("h2", {}, `Output of turn ${output.turn ?? "-"}`),
    output.error ? h("p", { class: "error" }, output.error) :
      h("pre", { id: "output" }, (output.lines || []).map((l) => `[${l.stream}] ${l.line}`).join("\n")));
}

// --- the buttons that write --------------------------------------------------------------

async function fork(id, version) {
  try {
    const s = await rpc("session.fork", { session_id: id, at_version: version });
    location.hash = `#/s/${encodeURIComponent(s.session_id)}`;
  } catch (err) { fail(err); }
}

async function end(id, state) {
  if (!confirm(`End session ${id}? Its status becomes completed.`)) return;
  try {
    await rpc("session.transition", { session_id: id, to: "completed", reason: "ended in the web view", expected_version: state.version });
    route();
  } catch (err) { fail(err); }
}

async function remove(id) {
  if (!confirm(`Delete session ${id} and everything stored for it? This cannot be undone.`)) return;
  try {
    await rpc("session.delete", { session_id: id });
    location.hash = "#/";
  } catch (err) { fail(err); }
}

function exportSession(id) {
  // The daemon streams the document a page at a time (../ui/export/<id>), in its own
  // bytes: re-encoded here, JSON would lose what it keeps (1.0 would become 1).
  const a = h("a", { href: `export/${encodeURIComponent(id)}`, download: `${id}.json` });
  document.body.append(a);
  a.click();
  a.remove();
}

// --- the host ----------------------------------------------------------------------------

const MINUTE = 60_000;
const HOUR = 3_600_000;
const BACKLOG = 20_000; // events read back at start, as `sessionctl top` does

class Host {
  // What `sessionctl top` shows, folded from the event log read through events.read.
  constructor() {
    this.position = 0;
    this.sessions = new Map(); // id -> {actor, namespace, status}
    this.minute = []; // [time, session]
    this.spend = []; // [time, session, tokens, cost]
    this.executors = new Map();
  }

  add(e) {
    const at = Date.parse(e.recorded_at);
    const d = e.data || {};
    let s = this.sessions.get(e.session_id);
    if (!s) { s = { actor: null, namespace: null, status: null, known: false }; this.sessions.set(e.session_id, s); }
    if (e.type === "session.created") Object.assign(s, { actor: d.actor_name || null, namespace: d.namespace || "local", status: d.status || "active", known: true });
    else if (e.type === "session.status_changed") s.status = d.to;
    else if (e.type === "tokens.recorded") this.spend.push([at, e.session_id, (d.input_tokens || 0) + (d.output_tokens || 0), d.estimated_cost || 0]);
    else if (e.type === "process.started") this.executors.set(e.session_id, d.pid);
    else if (e.type === "process.exited" || e.type === "process.detached") this.executors.delete(e.session_id);
    this.minute.push([at, e.session_id]);
    this.position = Math.max(this.position, e.position);
  }

  async catchUp(last) {
    while (this.position < last) {
      const page = await rpc("events.read", { from_position: this.position, limit: 1000 });
      for (const e of page.events) this.add(e);
      if (page.next === null || page.next === undefined || !page.events.length) break;
    }
  }

  async lookUp(limit) {
    let n = 0;
    for (const [id, s] of this.sessions) {
      if (s.known || n >= limit) continue;
      n++;
      const st = await rpc("session.get", { session_id: id }).catch(() => null);
      Object.assign(s, st ? { actor: st.actor_name, namespace: st.namespace, status: st.status } : {}, { known: true });
    }
  }

  figures(now) {
    while (this.minute.length && this.minute[0][0] < now - MINUTE) this.minute.shift();
    while (this.spend.length && this.spend[0][0] < now - HOUR) this.spend.shift();
    const busy = new Map();
    for (const [, id] of this.minute) busy.set(id, (busy.get(id) || 0) + 1);
    const actors = new Map();
    for (const [at, id, tok, cost] of this.spend) {
      const who = (this.sessions.get(id) || {}).actor || "-";
      const a = actors.get(who) || { actor: who, tokens_1m: 0, cost_1m: 0, tokens_1h: 0, cost_1h: 0 };
      a.tokens_1h += tok; a.cost_1h += cost;
      if (at >= now - MINUTE) { a.tokens_1m += tok; a.cost_1m += cost; }
      actors.set(who, a);
    }
    return {
      busiest: [...busy].sort((x, y) => y[1] - x[1]).slice(0, 10),
      actors: [...actors.values()].sort((x, y) => y.cost_1h - x.cost_1h || y.tokens_1h - x.tokens_1h).slice(0, 10),
    };
  }
}

async function hostView() {
  const stats = h("div", { class: "facts", id: "stats" });
  const busiest = h("tbody", {});
  const actors = h("tbody", {});
  const executors = h("ul", { id: "executors" });
  show(h("h1", {}, "Host"), stats,
    h("div", { class: "cols" },
      h("section", { "aria-label": "Busiest sessions" }, h("h2", {}, "Busiest sessions (events in the last minute)"),
        h("table", { id: "busiest" }, h("thead", {}, h("tr", {}, h("th", {}, "session"), h("th", {}, "actor"), h("th", {}, "status"), h("th", { class: "num" }, "events/1m"))), busiest)),
      h("section", { "aria-label": "Spend by actor" }, h("h2", {}, "Spend by actor"),
        h("table", { id: "actors" }, h("thead", {}, h("tr", {}, h("th", {}, "actor"), ["tokens/1m", "cost/1m", "tokens/1h", "cost/1h"].map((c) => h("th", { class: "num" }, c)))), actors))),
    h("section", { "aria-label": "Executors" }, h("h2", {}, "Executors running"), executors));
  const host = new Host();
  let first = await rpc("daemon.stats");
  host.position = Math.max(0, first.last_position - BACKLOG);
  let timer = null;
  let stopped = false;
  const tick = async () => {
    const s = first || await rpc("daemon.stats");
    first = null;
    await host.catchUp(s.last_position);
    await host.lookUp(20);
    drawStats(stats, s);
    const f = host.figures(Date.now());
    fill(busiest, ...f.busiest.map(([id, n]) => {
      const k = host.sessions.get(id) || {};
      return h("tr", {}, h("td", {}, sessionLink(id)), h("td", {}, k.actor || "-"), h("td", {}, k.status ? badge(k.status) : "-"), h("td", { class: "num" }, n));
    }));
    fill(actors, ...f.actors.map((a) => h("tr", { "data-actor": a.actor }, h("td", {}, a.actor),
      h("td", { class: "num" }, a.tokens_1m), h("td", { class: "num" }, money(a.cost_1m)),
      h("td", { class: "num" }, a.tokens_1h), h("td", { class: "num" }, money(a.cost_1h)))));
    fill(executors, ...[...host.executors].map(([id, pid]) => h("li", {}, sessionLink(id), ` pid ${pid}`)));
    if (!host.executors.size) fill(executors, h("li", { class: "muted" }, "none"));
    setLive(`● live · updated ${new Date().toLocaleTimeString()}`);
  };
  const loop = async () => {
    if (stopped) return;
    try { await tick(); } catch (err) { setLive(`daemon unreachable: ${err.message}`); }
    if (!stopped) timer = setTimeout(loop, 1000);
  };
  stop = () => { stopped = true; clearTimeout(timer); setLive(""); };
  await loop();
}

function drawStats(root, s) {
  const f = (n) => (n === null || n === undefined ? "?" : n);
  const up = Math.floor(s.uptime_s);
  fill(root, 
    fact("sessions", s.sessions, "sessions"), fact("events", s.events, "events"),
    fact("connections", s.connections, "connections"), fact("subscriptions", s.subscriptions, "subscriptions"),
    fact("write queue", `${s.write_queue_depth} / ${f(s.write_queue_capacity)}`, "queue"),
    fact("commit latency", s.commit_latency_ms === null || s.commit_latency_ms === undefined ? "?" : `${s.commit_latency_ms.toFixed(2)} ms`, "commit_latency"),
    fact("appends/s", s.appends_per_s.toFixed(1), "appends_per_s"),
    fact("executors running", f(s.executors_running), "executors_running"),
    fact("database", `${(s.db_bytes / 1048576).toFixed(1)} MiB`, "db_bytes"),
    fact("uptime", up >= 3600 ? `${Math.floor(up / 3600)}h${String(Math.floor(up % 3600 / 60)).padStart(2, "0")}m` : `${Math.floor(up / 60)}m${String(up % 60).padStart(2, "0")}s`, "uptime"),
    fact("by status", Object.entries(s.sessions_by_status || {}).map(([k, v]) => `${k} ${v}`).join(" · ") || "-", "by_status"));
}

// --- routing -----------------------------------------------------------------------------

async function route() {
  stop();
  stop = () => {};
  const path = location.hash.slice(1).split("?")[0] || "/";
  for (const a of document.querySelectorAll("[data-nav]")) {
    const on = (a.dataset.nav === "host") === path.startsWith("/host");
    if (on) a.setAttribute("aria-current", "page"); else a.removeAttribute("aria-current");
  }
  try {
    if (path.startsWith("/s/")) await sessionView(decodeURIComponent(path.slice(3)));
    else if (path.startsWith("/host")) await hostView();
    else await sessionsView();
    document.title = `sessiond · ${path.startsWith("/s/") ? decodeURIComponent(path.slice(3)) : path.startsWith("/host") ? "host" : "sessions"}`;
  } catch (err) {
    fail(err);
  }
}

window.addEventListener("hashchange", route);
route();
