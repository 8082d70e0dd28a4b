"""The read models the PostgreSQL store keeps inside the batch transaction, from the
batch's events, as sqlite/ keeps SQLite's: the message index (with forks' shares of their
sources), checkpoints, the graph.* indexes and app/user state. Every row points at its
event by position (written after the commit numbered the batch's events).

Rows keyed by a session need no care across hosts: the commit holds the session's row
lock. scoped_state is shared by sessions, so its rows are written in key order (two
hosts never wait on each other in a cycle) and a row is only replaced by a later event.
"""

from __future__ import annotations

from typing import Any

import msgspec

from sessiond_schemas.events import Event

from ..eventstore import Batch
from ..sqlite.runner import indexed
from . import forks

_json = msgspec.json.Encoder()
_MESSAGE = "INSERT INTO messages (session_id, sequence, position) VALUES ($1, $2, $3)"


async def project(con: Any, batch: Batch) -> None:
    """Every read model of the batch's events, in event order."""
    await _conversation(con, batch)
    for e in batch.events:
        if e.type.startswith("graph."):
            await _graph(con, e)
    await _scoped_state(con, batch)
    await _progress(con, batch)
    runner = [(e.session_id, e.version, e.position, e.type) for e in batch.events
              if e.type.startswith("process.") and indexed(e.type, e.data)]
    if runner:
        await con.executemany("INSERT INTO runner_events (session_id, version, position,"
                              " type) VALUES ($1, $2, $3, $4)", runner)


async def _progress(con: Any, batch: Batch) -> None:
    """The graph steps (sqlite/progress.py): a fork copies its source's rows as they are."""
    insert = "INSERT INTO progress_steps (session_id, version, position) VALUES ($1, $2, $3)"
    rows: list[tuple[str, int, int]] = []
    for e in batch.events:
        if e.type == "progress.recorded":
            rows.append((e.session_id, e.version, e.position))
        elif e.type == "session.forked":
            if rows:
                await con.executemany(insert, rows)
            rows = []
            await con.execute(
                "INSERT INTO progress_steps (session_id, version, position) SELECT $1,"
                " version, position FROM progress_steps WHERE session_id = $2 AND version <= $3"
                " ON CONFLICT DO NOTHING", e.session_id, e.data["from"]["session_id"],
                e.data["from"]["version"])
    if rows:
        await con.executemany(insert, rows)


async def _conversation(con: Any, batch: Batch) -> None:
    """Messages (a truncation removes what came before it, a fork copies its source's
    rows as they are) and checkpoints."""
    messages: list[tuple[str, int, int]] = []
    for e in batch.events:
        if e.type == "message.appended":
            messages.append((e.session_id, e.data["sequence"], e.position))
        elif e.type in ("messages.truncated", "session.forked"):
            if messages:
                await con.executemany(_MESSAGE, messages)
            messages = []
            if e.type == "session.forked":
                await forks.index(con, e)
            else:
                await con.execute(
                    "DELETE FROM messages WHERE session_id = $1 AND sequence >= $2",
                    e.session_id, e.data["from_sequence"])
    if messages:
        await con.executemany(_MESSAGE, messages)
    checkpoints = [
        (e.session_id, e.data["checkpoint_id"], e.position, e.version, e.data.get("node_id"),
         e.data.get("resume_from"), e.recorded_at, e.data["size"], batch.payloads[e.event_id])
        for e in batch.events if e.type == "checkpoint.saved"
    ]
    if checkpoints:
        await forks.keep_shared_payloads(con, [(c[0], c[1]) for c in checkpoints])
        await con.executemany(
            "INSERT INTO checkpoints (session_id, checkpoint_id, position, version, node_id,"
            " resume_from, created_at, size, payload) VALUES ($1, $2, $3, $4, $5, $6, $7,"
            " $8, $9) ON CONFLICT (session_id, checkpoint_id) DO UPDATE SET"
            f" {forks.CHECKPOINT_COLUMNS}", checkpoints)


def _replace(*columns: str) -> str:
    return ", ".join(f"{c} = excluded.{c}" for c in columns)




async def _graph(con: Any, e: Event) -> None:
    d, sid = e.data, e.session_id
    ns = d.get("ns", "")
    if e.type == "graph.checkpoint":
        run_id = d.get("metadata", {}).get("run_id")
        await con.execute(
            "INSERT INTO graph_checkpoints (session_id, ns, checkpoint_id, run_id, position)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_id, ns, checkpoint_id)"
            f" DO UPDATE SET {_replace('run_id', 'position')}",
            sid, ns, d["checkpoint_id"], run_id if isinstance(run_id, str) else None,
            e.position)
        blobs = [(sid, ns, channel, d["channel_versions"][channel], e.position)
                 for channel in d.get("blobs", {})]
        if blobs:
            await con.executemany(
                "INSERT INTO graph_blobs (session_id, ns, channel, version, position)"
                " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_id, ns, channel, version)"
                " DO UPDATE SET position = excluded.position", blobs)
    elif e.type == "graph.writes":
        # A repeated (task, idx) keeps the first write, except for the special channels
        # (negative idx: errors, interrupts), where the latest wins, as LangGraph's savers do.
        for item, w in enumerate(d["writes"]):
            action = (f"DO UPDATE SET {_replace('position', 'item')}" if w["idx"] < 0
                      else "DO NOTHING")
            await con.execute(
                "INSERT INTO graph_writes (session_id, ns, checkpoint_id, task_id, idx,"
                " position, item) VALUES ($1, $2, $3, $4, $5, $6, $7)"
                f" ON CONFLICT (session_id, ns, checkpoint_id, task_id, idx) {action}",
                sid, ns, d["checkpoint_id"], d["task_id"], w["idx"], e.position, item)
    elif e.type == "graph.pruned":
        for pruned_ns, checkpoint_id in d["checkpoints"]:
            for table in ("graph_checkpoints", "graph_writes"):
                await con.execute(f"DELETE FROM {table} WHERE session_id = $1 AND ns = $2"
                                  " AND checkpoint_id = $3", sid, pruned_ns, checkpoint_id)


async def _scoped_state(con: Any, batch: Batch) -> None:
    """App and user keys of state.updated events (session keys live in the view): the
    batch's last value of each key, written in key order."""
    latest: dict[tuple[str, str, str], tuple[bytes, int]] = {}
    for e in batch.events:
        d = e.data
        if e.type != "state.updated" or d["scope"] == "session":
            continue
        user = d["user_id"] if d["scope"] == "user" else ""  # '' is the app's own state
        for k, v in d["delta"].items():
            latest[(d["app_name"], user, k)] = (_json.encode(v), e.position)
    if latest:
        await con.executemany(
            "INSERT INTO scoped_state (app_name, user_id, key, value, position)"
            " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (app_name, user_id, key) DO UPDATE"
            f" SET {_replace('value', 'position')} WHERE scoped_state.position"
            " < excluded.position",
            [(*key, *latest[key]) for key in sorted(latest)])
