"""How sessionctl shows results to people: tables, key-value lines, one-line event summaries."""

from __future__ import annotations

import json
from typing import Any

import msgspec


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
        ("completed", t.completed_at), ("duration_ms", s.duration_ms),
        ("messages", s.message_count),
        ("ttl", f"{s.ttl_s} s idle (expires {s.expires_at or '-'})" if s.ttl_s else None),
        ("tokens", f"in {u.input_tokens}  out {u.output_tokens}  cost {u.estimated_cost:.4f}"),
        ("progress", f"node {p.current_node or '-'}  steps {p.steps_executed}  "
                     f"retries {p.total_retries}  quality {p.execution_quality}"),
        ("checkpoints", f"{s.checkpoint_count} (latest {s.latest_checkpoint_id or '-'})"),
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


def render_messages(r: Any) -> None:
    table = _table("#", "role", "time", "content")
    for m in r.messages:
        table.add_row(str(m.sequence), m.role, m.timestamp, _short(m.content, 80))
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


def render_events(r: Any) -> None:
    page, wide = (r.page, r.wide) if isinstance(r, Events) else (r, True)
    console = _console()
    if wide:
        table = _table("pos", "session", "v", "type", "time", "data")
        for e in page.events:
            table.add_row(str(e.position), e.session_id, str(e.version), e.type,
                          e.recorded_at, _short(json.dumps(e.fields(), ensure_ascii=False), 60))
        console.print(table)
    else:  # one line an event, as `watch` prints them: fits 80 columns
        shown = short_ids(sorted({e.session_id for e in page.events}))
        for e in page.events:
            console.print(f"{e.position:>6} {e.recorded_at[11:19]} {shown[e.session_id]:<10.10}"
                          f" v{e.version:<4} {e.type:<20} {summarize(e)}", highlight=False,
                          no_wrap=True, overflow="ellipsis", markup=False)
    if page.next is not None:
        console.print(f"more from: {page.next}", highlight=False)


def render_checkpoints(r: Any) -> None:
    table = _table("checkpoint", "node", "version", "size", "created")
    for c in r:
        table.add_row(c.checkpoint_id, c.node_id or "", str(c.version), str(c.size), c.created_at)
    _console().print(table)


def summarize(event: Any) -> str:
    """One short, readable line about an event's data."""
    d, t = event.fields(), event.type
    if t == "message.appended":
        return f"#{d.get('sequence')} {d.get('role')}: {_short(d.get('content'), 70)}"
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
    if t == "session.compacted":  # a boundary in the timeline: what came before stays
        summary = d.get("summary") or [{}]
        return (f"═ #0–#{d.get('through_sequence')} summarized ({d.get('by', 'api')}):"
                f" {_short(summary[0].get('content'), 50)}")
    return _short(json.dumps(d, ensure_ascii=False), 80)
