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


def print_kv(obj: Any) -> None:
    data = msgspec.to_builtins(obj)
    console = _console()
    for key, value in data.items():
        text = json.dumps(value, ensure_ascii=False) if isinstance(value, (dict, list)) \
            else str(value)
        console.print(f"[bold]{key}[/bold]: {_short(text, 200)}", highlight=False)


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


def render_list(r: Any) -> None:
    table = _table("id", "status", "actor", "task", "msgs", "tokens", "created")
    for s in r.sessions:
        u = s.token_usage
        table.add_row(s.session_id, s.status, s.actor_name or "", _short(s.task, 40),
                      str(s.message_count), str(u.input_tokens + u.output_tokens), s.created_at)
    console = _console()
    console.print(table)
    if r.next_cursor:
        console.print(f"more: --cursor {r.next_cursor}", highlight=False)


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


def render_events(r: Any) -> None:
    table = _table("pos", "session", "v", "type", "time", "data")
    for e in r.events:
        table.add_row(str(e.position), e.session_id, str(e.version), e.type, e.recorded_at,
                      _short(json.dumps(e.data, ensure_ascii=False), 60))
    console = _console()
    console.print(table)
    if r.next is not None:
        console.print(f"more from: {r.next}", highlight=False)


def render_checkpoints(r: Any) -> None:
    table = _table("checkpoint", "node", "version", "size", "created")
    for c in r:
        table.add_row(c.checkpoint_id, c.node_id or "", str(c.version), str(c.size), c.created_at)
    _console().print(table)


def summarize(event: Any) -> str:
    """One short, readable line about an event's data."""
    d, t = event.data, event.type
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
    return _short(json.dumps(d, ensure_ascii=False), 80)
