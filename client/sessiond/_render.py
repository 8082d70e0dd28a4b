"""How sessionctl shows results to people: tables, key-value lines, one-line event summaries."""

from __future__ import annotations

import json
from typing import Any

import msgspec

from sessiond_schemas.toolcalls import input_text, is_call_text, message_calls

from .importers._lines import LINE_FIELD


def _console() -> Any:
    from rich.console import Console
    return Console()


def _table(*columns: str) -> Any:
    from rich.table import Table
    table = Table(box=None, header_style="bold")
    for c in columns:
        table.add_column(c)
    return table


def _short(text: str | None, width: int = 60) -> str:
    text = (text or "").replace("\n", " ")
    return text if len(text) <= width else text[: width - 1] + "…"


def _flat(data: dict[str, Any], prefix: str = "") -> list[tuple[str, Any]]:
    """Nested objects as dotted keys, so each value sits on a line of its own."""
    out: list[tuple[str, Any]] = []
    for key, value in data.items():
        if isinstance(value, dict) and value:
            out += _flat(value, f"{prefix}{key}.")
        else:
            out.append((prefix + key, value))
    return out


def print_kv(obj: Any) -> None:
    """`key: value` lines, one per value (nested objects as dotted keys), each cut to the
    terminal's width rather than wrapped mid-value."""
    data = msgspec.to_builtins(obj)
    console = _console()
    for key, value in _flat(data):
        text = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) \
            else str(value)
        room = max(20, console.width - len(key) - 2)
        console.print(f"[bold]{key}[/bold]: {_short(text, min(room, 200))}", highlight=False,
                      no_wrap=True, overflow="ellipsis")


def short_ids(ids: list[str], least: int = 8) -> dict[str, str]:
    """Each id cut to the shortest prefix no other id in `ids` starts with (at least
    `least` characters): what a list shows, and what `sessionctl show` takes."""
    out = {}
    for sid in ids:
        n = min(len(sid), least)
        while n < len(sid) and any(o != sid and o.startswith(sid[:n]) for o in ids):
            n += 1
        out[sid] = sid[:n]
    return out


def ago(recorded_at: str | None, now: float | None = None) -> str:
    """A time as how long ago it was (45s, 12m, 3h, 5d); its date past 30 days."""
    if not recorded_at:
        return "-"
    import time
    from datetime import datetime
    try:
        at = datetime.fromisoformat(recorded_at.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return recorded_at
    s = max(0.0, (time.time() if now is None else now) - at)
    if s >= 30 * 86400:
        return recorded_at[:10]
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if s >= size:
            return f"{int(s // size)}{unit} ago"
    return f"{int(s)}s ago"


# --- renderers ---------------------------------------------------------------------------


def render_state(s: Any) -> None:
    console = _console()
    t, p, u = s.timestamps, s.progress, s.token_usage
    rows = [
        ("session", s.session_id), ("status", s.status), ("version", s.version),
        ("namespace", s.namespace), ("actor", s.actor_name), ("task", _short(s.task, 100)),
        ("goal / agent", f"{s.goal_id or '-'} / {s.agent_id or '-'}"),
        ("model / adapter", f"{s.model or '-'} / {s.adapter or '-'}"), ("source", s.source),
        ("created", t.created_at), ("updated", t.updated_at), ("started", t.started_at),
        ("completed", t.completed_at), ("duration", _duration(s)),
        ("messages", s.message_count),
        ("ttl", f"{s.ttl_s} s idle (expires {s.expires_at or '-'})" if s.ttl_s else None),
        ("tokens", f"in {u.input_tokens}  out {u.output_tokens}  cost {u.estimated_cost:.4f}"),
        ("progress", f"node {p.current_node or '-'}  steps {p.steps_executed}  "
                     f"retries {p.total_retries}  quality {p.execution_quality}"),
        ("checkpoints", f"{s.checkpoint_count} (latest {s.latest_checkpoint_id or '-'})"
         if s.checkpoint_count or s.source != "langgraph" else
         "LangGraph's: events --type graph.checkpoint"),
        ("resumable", f"{s.is_resumable} (from checkpoint: {s.is_resumable_from_checkpoint})"),
        ("error", s.error),
    ]
    for key, value in rows:
        if value not in (None, ""):
            console.print(f"[bold]{key:>16}[/bold]  {value}", highlight=False)
    if s.last_message is not None:
        m = s.last_message
        console.print(f"[bold]{'last message':>16}[/bold]  #{m.sequence} {m.role}: "
                      f"{_short(m.content, 80)}", highlight=False)


def _duration(s: Any) -> str | None:
    """How long the session ran: its stored duration_ms once it ended; before that, from
    its start (or creation) to its last event, said as not ended (duration_ms is 0 then:
    the fold sets it when the session ends)."""
    from datetime import datetime

    if s.timestamps.completed_at is not None or s.duration_ms:
        return f"{s.duration_ms} ms ({_span(s.duration_ms / 1000)})"
    t = s.timestamps
    try:
        begun, last = (datetime.fromisoformat(x.replace("Z", "+00:00")).timestamp()
                       for x in (t.started_at or t.created_at, t.updated_at))
    except (AttributeError, ValueError):
        return None
    return f"{_span(max(0.0, last - begun))} to its last event ({s.status}, not ended)"


def _span(seconds: float) -> str:
    """A length of time as people say it: 45s, 12m 5s, 3h 2m, 5d 4h."""
    s = int(seconds)
    for big, small, bn, sn in ((86400, 3600, "d", "h"), (3600, 60, "h", "m"), (60, 1, "m", "s")):
        if s >= big:
            return f"{s // big}{bn} {s % big // small}{sn}"
    return f"{seconds:.3g}s" if seconds < 10 else f"{s}s"


class Listed(msgspec.Struct):
    """A page of sessions as sessionctl shows it to people: `wide` keeps ids and times
    whole; otherwise they are cut to fit 80 columns."""

    page: Any
    wide: bool = False


def render_list(r: Any) -> None:
    page, wide = (r.page, r.wide) if isinstance(r, Listed) else (r, True)
    console = _console()
    shown = short_ids([s.session_id for s in page.sessions])
    rows = []
    for s in page.sessions:
        u = s.token_usage
        rows.append([s.session_id if wide else shown[s.session_id], s.status,
                     s.actor_name or "", (s.task or "").replace("\n", " "),
                     str(s.message_count), str(u.input_tokens + u.output_tokens),
                     s.created_at if wide else ago(s.created_at)])
    table = _table("id", "status", "actor", "task", "msgs", "tokens", "created")
    if not wide and rows:  # fit the terminal: actor and task give way, nothing else
        table.pad_edge = False
        headers = [str(c.header) for c in table.columns]
        widths = [max(len(row[i]) for row in [headers, *rows]) for i in range(7)]
        actor = min(widths[2], 14)
        # 6 gaps of 2 between the 7 columns
        task = max(8, console.width - (sum(widths) - widths[2] - widths[3]) - actor - 12)
        for row in rows:
            row[2], row[3] = _short(row[2], actor), _short(row[3], task)
        for column in table.columns:
            column.no_wrap = True
    for row in rows:
        table.add_row(*row)
    console.print(table)
    if page.next_cursor:
        console.print(f"more: --cursor {page.next_cursor}", highlight=False)


def message_text(m: Any, names: dict[str, str], width: int = 80) -> str:
    """A message as sessionctl shows it: its text, then each tool call it makes
    (`→ name(input)`); a tool result says whose call it answers (`↳ name: …`). `names`
    gathers the calls' names by id as the messages go by."""
    d = m if isinstance(m, dict) else msgspec.to_builtins(m)
    content = d.get("content") or ""
    calls = message_calls(d.get("metadata"), content)
    for c in calls:
        if c["id"]:
            names[c["id"]] = c["name"]
    if d.get("role") == "tool" and d.get("tool_call_id"):
        name = names.get(d["tool_call_id"], d["tool_call_id"])
        error = " (error)" if (d.get("metadata") or {}).get("is_error") else ""
        return f"↳ {name}{error}: {_short(content, width)}"
    lines = [] if calls and is_call_text(content, calls) else [_short(content, width)]
    lines += [_short(f"→ {c['name']}({input_text(c['input'])})", width) for c in calls]
    return "\n".join(lines)


def render_messages(r: Any) -> None:
    table = _table("#", "role", "time", "content")
    names: dict[str, str] = {}
    for m in r.messages:
        table.add_row(str(m.sequence), m.role, m.timestamp, message_text(m, names))
    console = _console()
    console.print(table)
    console.print(f"{len(r.messages)} of {r.total}", highlight=False)
    if r.truncated_by_bytes and r.messages:  # the daemon's max_page_bytes ended the page
        console.print("page ended at the daemon's byte budget; more: --after "
                      f"{r.messages[-1].sequence} (or --offset, with --desc)", highlight=False)


def render_context(r: Any) -> None:
    """What the model sees now: the compaction's boundary and summary, then the tail; and
    how to read the history before the boundary."""
    console = _console()
    c = r.compaction
    if c is not None:
        console.print(f"── compacted at v{c.version} by {c.by}: {len(r.summary) or 'the'} summary"
                      f" message(s) for #0–#{c.through_sequence} (v1–v{c.through_version}) ──",
                      highlight=False, markup=False)
        for m in r.summary:
            console.print(f"  [summary] {m.role}: {_short(m.content, 70)}", highlight=False,
                          markup=False)
    render_messages(r)
    if c is not None and c.through_sequence >= 0:
        console.print(f"the history before it: sessionctl messages {r.session_id} --limit"
                      f" {min(c.through_sequence + 1, 1000)}", highlight=False, markup=False)
    if r.next is not None:
        console.print(f"more: --after {r.next}", highlight=False)


class Events(msgspec.Struct):
    """A page of events as sessionctl shows it to people (see Listed)."""

    page: Any
    wide: bool = False
    own: str | None = None  # the session asked for: a fork's inherited events are not its


def render_events(r: Any) -> None:
    page, wide = (r.page, r.wide) if isinstance(r, Events) else (r, True)
    own = r.own if isinstance(r, Events) else None
    console = _console()
    inherited = [e for e in page.events if own and e.session_id != own]
    if inherited:
        console.print(f"versions 1-{inherited[-1].version} are inherited: the events of"
                      f" {inherited[-1].session_id} (marked ^), up to the fork point",
                      highlight=False, markup=False)
    if wide:  # whole ids, times and data: a line of facts, the data under it, wrapped
        for e in page.events:
            mark = "^" if own and e.session_id != own else " "
            console.print(f"{mark}{e.position:>6}  {e.session_id}  v{e.version}  {e.type}"
                          f"  {e.recorded_at}", highlight=False, markup=False,
                          overflow="fold")
            console.print(json.dumps(_shown_fields(e), ensure_ascii=False),
                          highlight=False, markup=False, style="dim")
    else:  # one line an event, as `watch` prints them: fits 80 columns
        shown = short_ids(sorted({e.session_id for e in page.events}))
        names: dict[str, str] = {}
        for e in page.events:
            mark = "^" if own and e.session_id != own else " "
            console.print(f"{mark}{e.position:>5} {e.recorded_at[11:19]} "
                          f"{shown[e.session_id]:<10.10} v{e.version:<4} {e.type:<20}"
                          f" {summarize(e, names)}", highlight=False,
                          no_wrap=True, overflow="ellipsis", markup=False)
    if page.next is not None:
        console.print(f"more from: {page.next}", highlight=False)


def _shown_fields(event: Any) -> dict[str, Any]:
    """An event's data for people: an imported transcript's kept line (restore's copy of
    what the CLI wrote, repeating the event's own fields) is named by its length."""
    data: dict[str, Any] = event.fields()
    kept = data.get(LINE_FIELD)
    if isinstance(kept, str):
        data = {**data, LINE_FIELD: f"[the transcript's line as written: {len(kept)} "
                                    "characters; sessionctl restore writes it back]"}
    return data


def render_checkpoints(r: Any) -> None:
    table = _table("checkpoint", "node", "version", "size", "created")
    for c in r:
        table.add_row(c.checkpoint_id, c.node_id or "", str(c.version), str(c.size), c.created_at)
    _console().print(table)


def summarize(event: Any, names: dict[str, str] | None = None) -> str:
    """One short, readable line about an event's data (`names`: the tool calls' names by
    id, gathered over the events shown, so a result names the call it answers)."""
    d, t = event.fields(), event.type
    if t == "message.appended":
        text = message_text(d, {} if names is None else names, 70)
        return f"#{d.get('sequence')} {d.get('role')}: {text}".replace("\n", " ")
    if t == "session.status_changed":
        why = d.get("reason") or d.get("error")
        return f"{d.get('from')} -> {d.get('to')}" + (f" ({_short(why, 50)})" if why else "")
    if t == "session.created":
        return f"{d.get('status', 'active')} {_short(d.get('task'), 60)}".rstrip()
    if t == "tokens.recorded":
        return (f"+{d.get('input_tokens', 0)} in +{d.get('output_tokens', 0)} out"
                f" ${d.get('estimated_cost', 0):.4f}")
    if t == "progress.recorded":
        extra = [f"edge {d['edge']}"] if d.get("edge") else []
        extra += [f"{d['retries']} retries"] if d.get("retries") else []
        extra += ["FAILED"] if d.get("failed") else []
        return " ".join([f"node {d.get('node_id')}", *extra])
    if t == "checkpoint.saved":
        return f"{d.get('checkpoint_id')} node {d.get('node_id') or '-'} {d.get('size')} B"
    if t in ("memory.updated", "metadata.updated"):
        return "keys " + ", ".join(sorted(d.get("patch", {})))
    if t == "plan.linked":
        return str(d.get("plan_id"))
    if t == "process.output":
        return f"[{d.get('stream', 'stdout')}] {_short(d.get('line'), 70)}"
    if t in ("graph.checkpoint", "graph.writes"):
        return graph_summary(d)
    if t == "session.compacted":  # a boundary in the timeline: what came before stays
        summary = d.get("summary") or [{}]
        return (f"═ #0–#{d.get('through_sequence')} summarized ({d.get('by', 'api')}):"
                f" {_short(summary[0].get('content'), 50)}")
    return _short(json.dumps(d, ensure_ascii=False), 80)


def graph_summary(d: dict[str, Any]) -> str:
    """A LangGraph record in words: its values are LangGraph's serializer's bytes, so
    what is said is where it sits (checkpoint, step, node) and which channels it holds."""
    ns = f" ns {d['ns']}" if d.get("ns") else ""
    if "writes" in d:
        node = (d.get("task_path") or "").rpartition(", ")[2] or "-"
        channels = [str(w.get("channel")) for w in d.get("writes") or [] if isinstance(w, dict)]
        what = "interrupted" if "__interrupt__" in channels else "writes " + (
            ", ".join(c for c in channels if not c.startswith("branch:")) or "-")
        return f"task {node}{ns}: {what}"
    meta = d.get("metadata") or {}
    return (f"checkpoint {str(d.get('checkpoint_id'))[:13]}{ns} step {meta.get('step', '-')}"
            f" ({meta.get('source', '-')}): " + (", ".join(
                k for k in d.get("blobs") or {} if not k.startswith("branch:")) or "-"))


def render_ping(r: Any) -> None:
    """ping's answer: the method list whole, wrapped between names at the terminal's width."""
    import textwrap

    data = msgspec.to_builtins(r)
    methods = data.pop("methods", None) or []
    print_kv(data)
    console = _console()
    console.print(f"[bold]methods[/bold]: {len(methods)}", highlight=False)
    for line in textwrap.wrap(" ".join(methods), max(20, console.width - 2),
                              break_long_words=False, break_on_hyphens=False):
        console.print("  " + line, highlight=False, markup=False)


# What the figures of `sessionctl stats` count that their names do not say.
STATS_NOTES = {
    "events": "events stored now (a fork's inherited versions counted once, in its source)",
    "last_position": "the newest event's global position: every event ever appended, those"
                     " of sessions since deleted, expired or pruned too; never reused",
    "sessions": "sessions stored now",
    "db_bytes": "bytes the store takes on disk",
}


def render_stats(r: Any) -> None:
    """daemon.stats as `key: value` lines, the figures whose names say too little with
    what they count (events and last_position differ by what was deleted)."""
    data = msgspec.to_builtins(r)
    print_kv(data)
    console = _console()
    console.print("", highlight=False)
    for key, note in STATS_NOTES.items():
        if key in data:
            console.print(f"[bold]{key}[/bold]: {note}", highlight=False)
