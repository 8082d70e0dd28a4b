"""The views in SQLite: the `sessions` and `snapshots` tables, written in the commit, and
the two queries over them that are SQLite's own (totals, views naming a process); the
others are shared (stores/models/views.py)."""

from __future__ import annotations

import sqlite3
from typing import Any

from sessiond_daemon.stores.interface import Batch, Entry
from sessiond_daemon.stores.models.views import ViewQueries
from sessiond_daemon.stores.sqlite.base import SqliteReads, encode

_VIEW_COLUMNS = ("session_id", "version", "status", "namespace", "actor_name", "source", "task",
                 "created_at", "updated_at", "message_count", "input_tokens", "output_tokens",
                 "estimated_cost", "last_position", "last_hash", "state", "expires_at")
# The columns some index of `sessions` holds (session.list's five, the expiry sweep's).
_INDEXED = ("status", "namespace", "actor_name", "created_at", "expires_at")
# A view is an upsert of the columns no index holds, then an UPDATE of the indexed ones
# only where one differs. Not INSERT OR REPLACE, which deletes the row and inserts it
# again: that rewrote the row's entry in each index at every commit, a WAL page each; and
# an UPDATE that sets an indexed column rewrites its indexes even to the same value.
VIEW_UPSERT = (
    f"INSERT INTO sessions ({', '.join(_VIEW_COLUMNS)})"
    f" VALUES ({', '.join('?' for _ in _VIEW_COLUMNS)}) ON CONFLICT (session_id) DO UPDATE SET "
    + ", ".join(f"{c} = excluded.{c}" for c in _VIEW_COLUMNS[1:] if c not in _INDEXED))
VIEW_INDEXED = (
    "UPDATE sessions SET " + ", ".join(f"{c} = ?{i}" for i, c in enumerate(_INDEXED, 2))
    + " WHERE session_id = ?1 AND ("
    + " OR ".join(f"{c} IS NOT ?{i}" for i, c in enumerate(_INDEXED, 2)) + ")")


def write_views(db: sqlite3.Connection, batch: Batch) -> None:
    """The batch's views and snapshots (after its events)."""
    if batch.views:
        rows = [_view_row(entry) for entry in batch.views.values()]
        db.executemany(VIEW_UPSERT, rows)
        db.executemany(VIEW_INDEXED, [(r[0], r[2], r[3], r[4], r[7], r[16]) for r in rows])
    if batch.snapshots:
        db.executemany(
            "INSERT OR REPLACE INTO snapshots (session_id, version, state) VALUES (?, ?, ?)",
            [(v.session_id, v.version, encode(v)) for v in batch.snapshots],
        )


def _view_row(entry: Entry) -> tuple[Any, ...]:
    s = entry.state
    u = s.token_usage
    return (
        s.session_id, s.version, s.status, s.namespace, s.actor_name, s.source, s.task,
        s.timestamps.created_at, s.timestamps.updated_at, s.message_count, u.input_tokens,
        u.output_tokens, u.estimated_cost, entry.last_position, entry.last_hash, encode(s),
        s.expires_at,
    )


class SessionViews(SqliteReads, ViewQueries):
    """The reads of views whose SQL is SQLite's own (the rest: stores/models/views.py)."""

    async def session_totals(self, column: str) -> list[tuple[Any, int, int, int, float]]:
        """Per value of an indexed sessions column (status, namespace, actor_name): sessions,
        input tokens, output tokens, cost. One GROUP BY over the views, never the events.
        TOTAL, not SUM: each session's counts fit int64, their sum across sessions may not
        (SUM would raise "integer overflow"); a gauge is a float anyway."""
        if column not in ("status", "namespace", "actor_name"):
            raise ValueError(f"not a grouping column: {column}")
        rows = await self._all(
            f"SELECT {column}, COUNT(*), TOTAL(input_tokens), TOTAL(output_tokens),"
            f" TOTAL(estimated_cost) FROM sessions GROUP BY {column}")
        return [(r[0], int(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows]

    async def sessions_with_process(self) -> list[str]:
        """Active sessions whose view names a process: candidates for restart recovery."""
        rows = await self._all(
            "SELECT session_id FROM sessions WHERE status = 'active'"
            " AND json_extract(state, '$.pid') IS NOT NULL")
        return [r[0] for r in rows]
