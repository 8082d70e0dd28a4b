"""The views in SQLite: the `sessions` and `snapshots` tables, written in the commit, and
the queries over them (session.list, resolution, totals, retention)."""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from typing import Any

import msgspec

from sessiond_schemas.state import SessionState, SessionSummary

from ..eventstore import (
    COUNTS,
    Batch,
    Entry,
    Page,
    SessionFilters,
    decode_list_cursor,
    repage,
    sessions_page,
)
from .base import SqliteReads, encode, marks

state_decoder = msgspec.json.Decoder(SessionState)
# A page of the expiry sweep (expiry.py): a range of the partial index sessions_by_expiry.
EXPIRING_SQL = ("SELECT expires_at, session_id FROM sessions WHERE expires_at IS NOT NULL"
                " AND expires_at <= ? AND (expires_at, session_id) > (?, ?)"
                " ORDER BY expires_at, session_id LIMIT ?")


def write_views(db: sqlite3.Connection, batch: Batch) -> None:
    """The batch's views and snapshots (after its events)."""
    if batch.views:
        db.executemany(
            "INSERT OR REPLACE INTO sessions (session_id, version, status, namespace,"
            " actor_name, source, task, created_at, updated_at, message_count, input_tokens,"
            " output_tokens, estimated_cost, last_position, last_hash, state, expires_at)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            [_view_row(entry) for entry in batch.views.values()],
        )
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


def list_sessions_sql(f: SessionFilters, limit: int,
                      cursor: str | None) -> tuple[str, tuple[Any, ...]]:
    """The session.list query: newest first, resumed after the cursor's (created_at, id)."""
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("namespace", f.namespace), ("actor_name", f.actor_name),
                          ("source", f.source)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if f.statuses:
        where.append(f"status IN ({marks(len(f.statuses))})")
        args.extend(f.statuses)
    if f.created_after is not None:
        where.append("created_at > ?")
        args.append(f.created_after)
    if f.created_before is not None:
        where.append("created_at < ?")
        args.append(f.created_before)
    if cursor is not None:
        where.append("(created_at, session_id) < (?, ?)")
        args.extend(decode_list_cursor(cursor))
    sql = (
        "SELECT session_id, status, namespace, actor_name, task, created_at, updated_at,"
        " message_count, input_tokens, output_tokens, estimated_cost FROM sessions"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " ORDER BY created_at DESC, session_id DESC LIMIT ?"
    )
    return sql, (*args, limit)


class SessionViews(SqliteReads):
    """The reads of views, snapshots and session lists."""

    async def state_json(self, session_id: str) -> bytes | None:
        row = await self._one("SELECT state FROM sessions WHERE session_id = ?", (session_id,))
        return bytes(row[0]) if row else None

    async def snapshot(self, session_id: str, at_most: int) -> SessionState | None:
        """The latest stored view of a session at or before version `at_most`."""
        row = await self._one(
            "SELECT state FROM snapshots WHERE session_id = ? AND version <= ?"
            " ORDER BY version DESC LIMIT 1",
            (session_id, at_most),
        )
        return state_decoder.decode(row[0]) if row else None

    async def snapshots(self, session_id: str) -> dict[int, SessionState]:
        rows = await self._all("SELECT version, state FROM snapshots WHERE session_id = ?",
                               (session_id,))
        return {r[0]: state_decoder.decode(r[1]) for r in rows}

    async def resolve(self, prefix: str) -> list[str]:
        # A range scan on the primary key; GLOB-free so '_' and '%' stay literal.
        rows = await self._all(
            "SELECT session_id FROM sessions WHERE session_id >= ? AND session_id < ?"
            " ORDER BY session_id LIMIT 11",
            (prefix, prefix + "\U0010ffff"),
        )
        return [r[0] for r in rows]

    async def list_sessions(
        self, filters: SessionFilters, limit: int, cursor: str | None, max_bytes: int = 0
    ) -> tuple[Page[SessionSummary], str | None]:
        sql, args = list_sessions_sql(filters, limit + 1, cursor)
        return sessions_page(await self._page(sql, args, max_bytes), limit)

    async def session_ids(self, after: str, limit: int) -> list[str]:
        """Session ids in id order, after `after` (for walking every session)."""
        rows = await self._all("SELECT session_id FROM sessions WHERE session_id > ?"
                               " ORDER BY session_id LIMIT ?", (after, limit))
        return [r[0] for r in rows]

    async def stale_sessions(self, statuses: Sequence[str], before: str, limit: int) -> list[str]:
        """Sessions in one of `statuses` whose last event is older than `before`."""
        rows = await self._all(
            f"SELECT session_id FROM sessions WHERE status IN ({marks(len(statuses))})"
            " AND updated_at < ? ORDER BY updated_at LIMIT ?",
            (*statuses, before, limit))
        return [r[0] for r in rows]

    async def expiring_sessions(self, before: str, after: tuple[str, str] | None,
                                limit: int) -> list[tuple[str, str]]:
        """A page of the expiry index (sessions_by_expiry): no scan of other sessions."""
        start = after or ("", "")
        rows = await self._all(EXPIRING_SQL, (before, *start, limit))
        return [(r[0], r[1]) for r in rows]

    async def states(self, namespace: str, prefix: bool, after: str,
                     limit: int, max_bytes: int = 0) -> Page[bytes]:
        """Stored views of sessions in a namespace (or under a namespace prefix), by id."""
        args: tuple[str, ...]
        if prefix:
            where, args = "namespace >= ? AND namespace < ?", (namespace, namespace + "\U0010ffff")
        else:
            where, args = "namespace = ?", (namespace,)
        rows = await self._page(f"SELECT state FROM sessions WHERE {where}"
                                " AND session_id > ? ORDER BY session_id LIMIT ?",
                                (*args, after, limit), max_bytes)
        return repage(rows, [bytes(r[0]) for r in rows])

    async def counts(self) -> tuple[int, int]:
        """Return (sessions, events stored), counted from the views and the fork index: a
        fork's versions up to its fork point are its source's events, not stored again."""
        row = await self._one(COUNTS)
        return int(row[0]), int(row[1])

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
