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
      return [`role-${d.role}`, `#${d.sequence} ${d.role}${d.tool_call_id ? ` · result of ${d.tool_call_id}` : ""}${d.metadata && d.metadata.is_error ? " · error" : ""}`, d.content];
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
    case "process.started":
      return ["", `process started · turn ${d.turn}`, `pid ${d.pid}${d.host ? ` on ${d.host}` : ""} · ${(d.argv || []).join(" ").slice(0, 200)}`];
    case "process.exited":
      return ["", `process exited · turn ${d.turn}`, [d.signal ? `signal ${d.signal}` : `exit code ${d.exit_code ?? "?"}`, d.lines !== undefined && d.lines !== null ? `${d.lines} lines` : ""].filter(Boolean).join(" · ")];
    case "process.output":
      return ["", `output [${d.stream || "stdout"}]`, d.line];
    case "stream.chunk":
      return ["", "chunk", d.text !== undefined && d.text !== null ? d.text : `${Math.floor((d.base64 || "").length * 3 / 4)} bytes (binary)`];
    case "graph.checkpoint": {
      // LangGraph's values are its serializer's bytes: what is said is where it sits.
      const m = d.metadata || {};
      const chans = Object.keys(d.blobs || {}).filter((k) => !k.startsWith("branch:"));
      return ["graph", `checkpoint · step ${m.step ?? "-"} (${m.source || "-"})`, `${d.checkpoint_id}${d.ns ? ` · ns ${d.ns}` : ""} · channels: ${chans.join(", ") || "-"}`];
    }
    case "graph.writes": {
      const node = (d.task_path || "").split(", ").pop() || "-";
      const chans = (d.writes || []).map((w) => w.channel);
      if (chans.includes("__interrupt__")) return ["graph interrupt", `interrupt in ${node}`, "the graph stopped here and waits to be resumed"];
      return ["graph", `writes of ${node}`, `channels: ${chans.filter((c) => !String(c).startsWith("branch:")).join(", ") || "-"}`];
    }
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
  // `own`: the session whose page this is; an event of another (a fork's source) is
  // marked as inherited, with a link to the session it belongs to.
  constructor(list, own) {
    this.list = list;
    this.own = own;
    this.calls = new Map(); // tool_call_id -> the element of the call (or of its message)
    this.seen = 0; // the highest version shown
    this.onEvent = () => {}; // told of each event added live
  }

  item(e) {
    const d = e.data || {};
    const calls = e.type === "message.appended" ? toolCalls(d) : [];
    const [cls, label, described] = describe(e);
    const body = calls.length && isCallText(d.content, calls) ? null : described;
    const inherited = e.session_id && this.own && e.session_id !== this.own;
    const el = h("li", { class: `ev ${cls}${inherited ? " inherited" : ""}`, "data-version": e.version, "data-type": e.type,
      "data-session": inherited ? e.session_id : null },
      h("div", { class: "meta" }, h("span", {}, `v${e.version}`), h("span", { title: e.recorded_at }, e.recorded_at.slice(11, 19)), h("b", {}, label),
        inherited ? h("span", { class: "from" }, "from ", sessionLink(e.session_id)) : null),
      body ? h("div", { class: "body" }, body) : null);
    if (calls.length) {
      for (const c of calls) {
        const call = h("div", { class: "call", "data-call": c.id || "", "data-tool": c.name },
          h("div", {}, h("b", { class: "tool" }, c.name), c.id ? h("span", { class: "muted" }, ` · ${c.id}`) : null),
          c.input !== undefined && c.input !== null ? h("pre", { class: "input" }, showInput(c.input)) : null);
        el.append(call);
        if (c.id) this.calls.set(c.id, call);
      }
    }
    return el;
  }

  add(e, where = "end") {
    const d = e.data || {};
    if (e.type === "message.appended" && d.role === "tool" && d.tool_call_id && this.calls.has(d.tool_call_id)) {
      const call = this.calls.get(d.tool_call_id);
      call.append(h("div", { class: `result${d.metadata && d.metadata.is_error ? " failed" : ""}`, "data-result-of": d.tool_call_id, "data-version": e.version },
        h("b", {}, `result #${d.sequence}${d.metadata && d.metadata.is_error ? " (error)" : ""}: `), d.content));
      this.seen = Math.max(this.seen, e.version);
      return;
    }
    const el = this.item(e);
    if (e.type === "message.appended" && d.role === "assistant" && d.tool_call_id && !this.calls.has(d.tool_call_id)) {
      this.calls.set(d.tool_call_id, el); // a call named only by the message's own id
    }
    if (where === "start") this.list.prepend(el);
    else this.list.append(el);
    this.seen = Math.max(this.seen, e.version);
  }
}

export function toolCalls(d) {
  // The tool calls a message makes, whoever wrote them, as {id, name, input}, as
  // sessiond_schemas/toolcalls.py reads them: metadata.tool_calls of the importers
  // ({id, name, input}), OpenAI's ({id, function: {name, arguments}}), LangChain's
  // ({id, name, args}), the Agents SDK's ({call_id, name, arguments}), ADK's
  // function_calls ({id, name, args}). A call without its input (the Agents SDK and ADK
  // keep it once, in the content: `name(arguments)`, a line a call) takes it from there.
  const m = d.metadata || {};
  const calls = [m.tool_calls, m.function_calls].filter(Array.isArray).flat();
  const out = calls.filter((c) => c && typeof c === "object").map((c) => {
    const f = c.function && typeof c.function === "object" ? c.function : {};
    const input = [c.input, c.args, c.arguments, f.arguments].find((x) => x !== undefined && x !== null);
    return { id: c.id || c.call_id || null, name: String(c.name || f.name || c.type || "tool"), input };
  });
  const content = (d.content || "").trim();
  const lines = out.length > 1 ? content.split("\n") : [content];
  if (lines.length === out.length) {
    out.forEach((c, i) => {
      if ((c.input === undefined || c.input === null) && lines[i].startsWith(`${c.name}(`) && lines[i].endsWith(")")) {
        c.input = lines[i].slice(c.name.length + 1, -1);
      }
    });
  }
  return out;
}

function isCallText(content, calls) {
  // The message's text only names its calls (`Grep({...})`): the calls say it all.
  const text = (content || "").trim();
  return calls.length > 0 && text.startsWith(`${calls[0].name}(`) && text.endsWith(")");
}

function showInput(input) {
  // A call's input as people read it: a JSON string parsed, then pretty-printed.
  let value = input;
  if (typeof value === "string") {
    try { value = JSON.parse(value); } catch { return value; }
  }
  return typeof value === "string" ? value : JSON.stringify(value, null, 2);
}

async function sessionView(id) {
  const p = params();
  const at = p.get("v") ? Number(p.get("v")) : null;
  const state = await rpc("session.get", { session_id: id, at_version: at });
  const current = { version: state.version, status: state.status, exec: execKey(state) }; // moves with the live tail
  const u = state.token_usage;
  const head = h("section", { "aria-label": "Session" },
    h("h1", {}, state.session_id),
    h("div", { class: "actions" }, h("span", { id: "status" }, badge(state.status)), state.actor_name || "-", "·", state.namespace, "·",
      state.task ? h("span", { class: "muted" }, state.task.slice(0, 200)) : null),
    state.forked_from ? h("p", { id: "forked-from" }, "Forked from ", sessionLink(state.forked_from.session_id),
      ` at v${state.forked_from.version}: the events up to it are its source's, marked “from”.`) : null,
    h("div", { class: "facts", id: "facts" },
      fact("version", state.version, "version"), fact("messages", state.message_count, "messages"),
      fact("tokens in / out", `${u.input_tokens} / ${u.output_tokens}`, "tokens"), fact("cost", money(u.estimated_cost), "cost"),
      fact("created", ago(state.timestamps.created_at)), fact("updated", ago(state.timestamps.updated_at), "updated"),
      state.checkpoint_count || state.source !== "langgraph" ? fact("checkpoints", state.checkpoint_count, "checkpoints")
        : fact("checkpoints", "LangGraph's: in the timeline"), fact("model", state.model || "-", "model")));
  const travel = h("form", { class: "actions", "aria-label": "Time travel", onsubmit: (e) => {
    e.preventDefault();
    const v = new FormData(e.target).get("v");
    location.hash = v ? `#/s/${encodeURIComponent(id)}?v=${v}` : `#/s/${encodeURIComponent(id)}`;
  } },
    h("label", {}, "State at version ", h("input", { type: "number", name: "v", min: 1, max: at ? undefined : state.version, value: at || "", size: 6 })),
    h("button", { type: "submit" }, "Show"),
    at ? h("a", { href: `#/s/${encodeURIComponent(id)}` }, "Back to now") : null,
    at ? h("span", { class: "muted", role: "status" }, `Showing the state as it was at version ${at}.`) : null);
  const endButton = h("button", { type: "button", id: "end", onclick: () => end(id, current) }, "End session (completed)");
  endButton.hidden = Boolean(at) || !ENDABLE.has(state.status);
  const actions = h("div", { class: "actions", "aria-label": "Actions" },
    h("button", { type: "button", id: "fork", onclick: () => fork(id, at || current.version) }, `Fork at v${at || state.version}`),
    at ? null : endButton,
    h("button", { type: "button", id: "export", onclick: () => exportSession(id) }, "Export JSON"),
    !at ? h("button", { type: "button", class: "danger", id: "delete", onclick: () => remove(id) }, "Delete…") : null);
  const list = h("ol", { class: "timeline", id: "timeline", "aria-live": "polite" });
  const earlier = h("button", { type: "button", id: "earlier" }, "Load earlier events");
  const graph = h("div", { id: "graph" });
  const forks = h("div", { id: "forks" });
  const executor = h("div", { id: "executor" });
  // A panel is drawn only for what the session has: each starts hidden and shows itself.
  const panel = (label, title, body) => {
    const el = h("section", { "aria-label": label, "data-panel": label }, h("h2", {}, title), body);
    el.hidden = true;
    return el;
  };
  const panels = { graph: panel("Graph progress", "Graph progress", graph), forks: panel("Forks", "Fork tree", forks),
    executor: panel("Executor", "Executor", executor) };
  show(head, travel, actions,
    h("div", { class: "cols" },
      h("section", { "aria-label": "Timeline" }, h("h2", {}, "Timeline"), earlier, list),
      h("div", {}, panels.graph, panels.forks, panels.executor,
        h("section", { "aria-label": "State" }, h("h2", {}, "Memory and metadata"),
          h("pre", {}, JSON.stringify({ memory: state.memory, metadata: state.metadata, progress: state.progress }, null, 2))))));
  const timeline = new Timeline(list, id);
  const segments = await lineage(state);
  const last = state.version;
  let first = Math.max(1, last - EVENTS_PAGE + 1);
  for (const e of await eventsBetween(segments, first, last)) timeline.add(e);
  const loadEarlier = async () => {
    if (first <= 1) return;
    const from = Math.max(1, first - EVENTS_PAGE);
    for (const e of (await eventsBetween(segments, from, first - 1)).reverse()) timeline.add(e, "start");
    first = from;
    earlier.hidden = first <= 1;
  };
  earlier.addEventListener("click", () => loadEarlier().catch(fail));
  earlier.hidden = first <= 1;
  const drawGraph = () => graphPath(graph, id, at ? last : null).then((n) => { panels.graph.hidden = !n; })
    .catch((err) => { panels.graph.hidden = false; fill(graph, h("p", { class: "error" }, err.message)); });
  const drawExecutor = (s) => executorPane(executor, s).then((shown) => { panels.executor.hidden = !shown; })
    .catch((err) => { panels.executor.hidden = false; fill(executor, h("p", { class: "error" }, err.message)); });
  drawGraph();
  forkTree(forks, state).then((n) => { panels.forks.hidden = !n; })
    .catch((err) => { panels.forks.hidden = false; fill(forks, h("p", { class: "error" }, err.message)); });
  drawExecutor(state);
  if (!at) {
    // What the live tail changes besides the timeline: the head's figures, the status and
    // its End button, the graph, the executor's pane. Redrawn at most once a second.
    const view = { id, current, endButton, drawGraph, drawExecutor, dirty: new Set() };
    timeline.onEvent = (e) => view.dirty.add(e.type);
    // A typed session's stream is its events as JSON: follow it over SSE. A generic
    // stream's is its bytes, not events: read its events once a second instead.
    const stream = state.metadata && state.metadata.stream;
    if (stream && typeof stream.content_type === "string") poll(timeline, view);
    else follow(timeline, view);
  }
}

function execKey(s) {
  return `${s.turn}/${s.pid}/${s.exit_code}`;
}

async function lineage(state) {
  // Where each version of the session is read from, oldest first: [{id, from, to}]. A
  // fork's versions up to its fork point are its source's events (and so on up the
  // chain, at most 20 ancestors), its own from the fork point on.
  const chain = [{ id: state.session_id, upto: Infinity }];
  let link = state.forked_from;
  while (link && chain.length <= 20) {
    chain.push({ id: link.session_id, upto: link.version });
    const up = await rpc("session.get", { session_id: link.session_id }).catch(() => null);
    link = up && up.forked_from;
  }
  const out = [];
  let from = 1;
  for (const seg of chain.reverse()) {
    out.push({ id: seg.id, from, to: seg.upto });
    from = seg.upto + 1;
  }
  return out;
}

async function eventsBetween(segments, from, to) {
  // The events of versions `from` to `to`, each read from the session that holds it, as
  // many pages as the daemon's byte budget (max_page_bytes) cuts them into.
  const out = [];
  for (const seg of segments) {
    const lo = Math.max(from, seg.from);
    const hi = Math.min(to, seg.to);
    if (lo > hi) continue;
    let at = lo;
    while (at <= hi) {
      const page = await rpc("events.read", { session_id: seg.id, from_version: at, limit: Math.min(EVENTS_PAGE, hi - at + 1) });
      for (const e of page.events) if (e.version <= hi) out.push(e);
      if (page.next === null || page.next === undefined || !page.events.length) break;
      at = page.next;
    }
  }
  return out;
}

function later(view) {
  // Redraw what the new events change, at most once a second (a throttle: a steady
  // stream of events still redraws every second).
  if (view.timer) return;
  view.timer = setTimeout(() => {
    view.timer = null;
    refresh(view).catch(() => {});
  }, 1000);
}

function follow(timeline, view) {
  // The live tail: SSE from the Durable Streams face, from the last version shown. The
  // daemon ends each response after a while (http_sse_close_s); we reopen it from the
  // last offset its control events gave, so nothing is read twice.
  const id = view.id;
  let offset = String(timeline.seen).padStart(20, "0");
  let source = null;
  let again = null;
  const open = () => {
    const url = new URL(`v1/stream/${encodeURIComponent(id)}?offset=${offset}&live=sse`, BASE);
    source = new EventSource(url);
    source.addEventListener("data", (m) => {
      let events = JSON.parse(m.data);
      if (!Array.isArray(events)) events = [events];
      for (const e of events) if (e.version > timeline.seen) { timeline.add(e); timeline.onEvent(e); }
      later(view);
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
  stop = () => { source.close(); clearTimeout(view.timer); clearTimeout(again); setLive(""); };
}

function poll(timeline, view) {
  let timer = null;
  let stopped = false;
  const tick = async () => {
    try {
      const page = await rpc("events.read", { session_id: view.id, from_version: timeline.seen + 1, limit: EVENTS_PAGE });
      for (const e of page.events) { timeline.add(e); timeline.onEvent(e); }
      if (page.events.length) await refresh(view);
      setLive("● live (read every second)");
    } catch (err) { setLive(`reconnecting… (${err.message})`); }
    if (!stopped) timer = setTimeout(tick, 1000);
  };
  timer = setTimeout(tick, 1000);
  stop = () => { stopped = true; clearTimeout(timer); clearTimeout(view.timer); setLive(""); };
}

const EXECUTOR_TYPES = new Set(["process.started", "process.output", "process.exited", "process.detached", "message.appended", "session.status_changed"]);

async function refresh(view) {
  // Everything on the page that the session's events change, from one session.get.
  const { current } = view;
  const s = await rpc("session.get", { session_id: view.id });
  const dirty = view.dirty;
  view.dirty = new Set();
  current.version = s.version;
  const set = (k, v) => { const el = $(`[data-stat="${k}"]`); if (el) el.textContent = v; };
  set("version", s.version);
  set("messages", s.message_count);
  set("tokens", `${s.token_usage.input_tokens} / ${s.token_usage.output_tokens}`);
  set("cost", money(s.token_usage.estimated_cost));
  set("updated", ago(s.timestamps.updated_at));
  set("checkpoints", s.checkpoint_count);
  set("model", s.model || "-");
  const forkButton = $("#fork");
  if (forkButton) forkButton.textContent = `Fork at v${s.version}`;
  if (s.status !== current.status) {
    current.status = s.status;
    fill($("#status"), badge(s.status));
  }
  view.endButton.hidden = !ENDABLE.has(s.status);
  if (dirty.has("progress.recorded")) view.drawGraph();
  const exec = execKey(s);
  if (exec !== current.exec || (hasExecutor(s) && [...dirty].some((t) => EXECUTOR_TYPES.has(t)))) {
    current.exec = exec;
    view.drawExecutor(s);
  }
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
  if (!steps.length) { fill(root, h("p", { class: "muted" }, "No graph steps.")); return 0; }
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
  return steps.length;
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
  return ancestors.length + forks.count;
}

function hasExecutor(s) {
  // An executor ran (or runs) for the session: a turn was started, or a process is live.
  return s.turn > 0 || (s.pid !== null && s.pid !== undefined);
}

async function executorPane(root, state) {
  // The executor's pane, drawn only for a session an executor ran: false otherwise.
  if (!hasExecutor(state)) return false;
  const [trajectory, output] = await Promise.all([
    rpc("session.trajectory", { session_id: state.session_id }).catch((e) => ({ error: e.message })),
    rpc("session.output", { session_id: state.session_id }).catch((e) => ({ error: e.message })),
  ]);
  const steps = trajectory.steps || [];
  const running = state.pid !== null && state.pid !== undefined && (state.exit_code === null || state.exit_code === undefined)
    && ENDABLE.has(state.status);
  fill(root,
    h("p", { id: "process" }, `turn ${state.turn} · `, running ? `running, pid ${state.pid}` : "not running",
      " · exit ", h("span", { id: "exit-code" }, state.exit_code ?? "-"), ` · adapter ${state.adapter || "-"}`),
    h("h2", {}, "Trajectory"),
    trajectory.error ? h("p", { class: "error" }, trajectory.error) :
      h("ol", { id: "trajectory" }, steps.slice(0, 500).map((s) => h("li", {}, h("b", {}, s.type), " ", s.summary))),
    h("h2", {}, `Output of turn ${output.turn ?? "-"}`),
    output.error ? h("p", { class: "error" }, output.error) :
      h("pre", { id: "output" }, (output.lines || []).map(outputLine).join("\n")));
  return true;
}

function outputLine(l) {
  // session.output's lines are the turn's text lines, plain strings (docs/protocol.md).
  return typeof l === "string" ? l : `[${l.stream}] ${l.line}`;
}

// --- the buttons that write --------------------------------------------------------------

async function fork(id, version) {
  try {
    const s = await rpc("session.fork", { session_id: id, at_version: version });
    location.hash = `#/s/${encodeURIComponent(s.session_id)}`;
  } catch (err) { fail(err); }
}

async function end(id, current) {
  if (!confirm(`End session ${id}? Its status becomes completed.`)) return;
  try {
    await rpc("session.transition", { session_id: id, to: "completed", reason: "ended in the web view", expected_version: current.version });
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
    else if (e.type === "process.started") this.executors.set(e.session_id, { pid: d.pid, host: d.host || null });
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
    // Windows by the events' own time, whatever order they arrived in: an old-dated
    // event (an import of last month's usage) read after a new one is not in them.
    this.minute = this.minute.filter(([at]) => at >= now - MINUTE);
    this.spend = this.spend.filter(([at]) => at >= now - HOUR);
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
        h("table", { id: "busiest", class: "responsive" }, h("thead", {}, h("tr", {}, h("th", {}, "session"), h("th", {}, "actor"), h("th", {}, "status"), h("th", { class: "num" }, "events/1m"))), busiest)),
      h("section", { "aria-label": "Spend by actor" }, h("h2", {}, "Spend by actor (by the usage's own time)"),
        h("table", { id: "actors", class: "responsive" }, h("thead", {}, h("tr", {}, h("th", {}, "actor"), ["tokens/1m", "cost/1m", "tokens/1h", "cost/1h"].map((c) => h("th", { class: "num" }, c)))), actors))),
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
      return h("tr", {}, h("td", { "data-label": "session" }, sessionLink(id)), h("td", { "data-label": "actor" }, k.actor || "-"),
        h("td", { "data-label": "status" }, k.status ? badge(k.status) : "-"), h("td", { class: "num", "data-label": "events/1m" }, n));
    }));
    fill(actors, ...f.actors.map((a) => h("tr", { "data-actor": a.actor }, h("td", { "data-label": "actor" }, a.actor),
      h("td", { class: "num", "data-label": "tokens/1m" }, a.tokens_1m), h("td", { class: "num", "data-label": "cost/1m" }, money(a.cost_1m)),
      h("td", { class: "num", "data-label": "tokens/1h" }, a.tokens_1h), h("td", { class: "num", "data-label": "cost/1h" }, money(a.cost_1h)))));
    fill(executors, ...[...host.executors].map(([id, x]) => h("li", {}, sessionLink(id), ` pid ${x.pid}${x.host ? ` on ${x.host}` : ""}`)));
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
    fact("sessions", s.sessions, "sessions"), fact("events stored", s.events, "events"),
    fact("last position", s.last_position, "last_position"),
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
