"""The queries over the views (the `sessions` and `snapshots` tables every store keeps,
written by its commit), written once for every store as queries.py's are: session.list,
resolution, retention and expiry pages, namespaces' views, snapshots and counts.

The views' own writes, and the two reads whose SQL truly differs (totals: SQLite's TOTAL
against PostgreSQL's numeric SUM; views naming a process: JSON inside the view), stay in
each store."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Final

import msgspec

from sessiond_daemon.stores.interface import Page, SessionFilters, repage
from sessiond_daemon.stores.models.sql import marks
from sessiond_daemon.stores.rows import decode_list_cursor, sessions_page
from sessiond_schemas.state import SessionState, SessionSummary

state_decoder = msgspec.json.Decoder(SessionState)
# A page of the expiry sweep (features/expiry.py): a range of the partial index sessions_by_expiry.
EXPIRING_SQL: Final = (
    "SELECT expires_at, session_id FROM sessions WHERE expires_at IS NOT NULL"
    " AND expires_at <= ? AND (expires_at, session_id) > (?, ?)"
    " ORDER BY expires_at, session_id LIMIT ?")


# daemon.stats' (sessions, events): the views' versions less the forks' fork points.
COUNTS: Final = ("SELECT (SELECT COUNT(*) FROM sessions),"
                 " (SELECT COALESCE(SUM(version), 0) FROM sessions)"
                 " - (SELECT COALESCE(SUM(version), 0) FROM forks)")


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


class ViewQueries:
    """The reads of views, snapshots and session lists, over a store's QueryDriver
    (queries.py)."""

    if TYPE_CHECKING:  # the store's (QueryDriver); nothing here to shadow them at run time
        async def _q_all(self, sql: str, args: tuple[Any, ...]) -> list[Any]: ...
        async def _q_page(self, sql: str, args: tuple[Any, ...],
                          max_bytes: int) -> Page[Any]: ...

    async def state_json(self, session_id: str) -> bytes | None:
        """A session's stored view, as its JSON bytes."""
        rows = await self._q_all("SELECT state FROM sessions WHERE session_id = ?",
                                 (session_id,))
        return bytes(rows[0][0]) if rows else None

    async def snapshot(self, session_id: str, at_most: int) -> SessionState | None:
        """The latest stored view of a session at or before version `at_most`."""
        rows = await self._q_all(
            "SELECT state FROM snapshots WHERE session_id = ? AND version <= ?"
            " ORDER BY version DESC LIMIT 1", (session_id, at_most))
        return state_decoder.decode(rows[0][0]) if rows else None

    async def snapshots(self, session_id: str) -> dict[int, SessionState]:
        rows = await self._q_all("SELECT version, state FROM snapshots WHERE session_id = ?",
                                 (session_id,))
        return {int(r[0]): state_decoder.decode(r[1]) for r in rows}

    async def trim_point(self, session_id: str, at_most: int, before: str,
                         keep_sequence: int) -> tuple[int, str, SessionState] | None:
        rows = await self._q_all(
            "SELECT s.version, e.hash, s.state FROM snapshots s JOIN events e"
            " ON e.session_id = s.session_id AND e.version = s.version"
            " WHERE s.session_id = ? AND s.version <= ? AND e.recorded_at < ?"
            " AND NOT EXISTS (SELECT 1 FROM messages m JOIN events k"
            " ON k.position = m.position WHERE m.session_id = ? AND m.sequence >= ?"
            " AND k.version <= s.version)"
            " ORDER BY s.version DESC LIMIT 1",
            (session_id, at_most, before, session_id, keep_sequence))
        if not rows:
            return None
        return int(rows[0][0]), str(rows[0][1]), state_decoder.decode(rows[0][2])

    async def resolve(self, prefix: str) -> list[str]:
        # A range scan on the primary key; no LIKE or GLOB, so '_' and '%' stay literal.
        rows = await self._q_all(
            "SELECT session_id FROM sessions WHERE session_id >= ? AND session_id < ?"
            " ORDER BY session_id LIMIT 11", (prefix, prefix + "\U0010ffff"))
        return [r[0] for r in rows]

    async def list_sessions(
        self, filters: SessionFilters, limit: int, cursor: str | None, max_bytes: int = 0
    ) -> tuple[Page[SessionSummary], str | None]:
        sql, args = list_sessions_sql(filters, limit + 1, cursor)
        return sessions_page(await self._q_page(sql, args, max_bytes), limit)

    async def session_ids(self, after: str, limit: int) -> list[str]:
        """Session ids in id order, after `after` (for walking every session)."""
        rows = await self._q_all("SELECT session_id FROM sessions WHERE session_id > ?"
                                 " ORDER BY session_id LIMIT ?", (after, limit))
        return [r[0] for r in rows]

    async def stale_sessions(self, statuses: Sequence[str], before: str,
                             limit: int) -> list[str]:
        """Sessions in one of `statuses` whose last event is older than `before`."""
        rows = await self._q_all(
            f"SELECT session_id FROM sessions WHERE status IN ({marks(len(statuses))})"
            " AND updated_at < ? ORDER BY updated_at LIMIT ?", (*statuses, before, limit))
        return [r[0] for r in rows]

    async def expiring_sessions(self, before: str, after: tuple[str, str] | None,
                                limit: int) -> list[tuple[str, str]]:
        """A page of the expiry index (sessions_by_expiry): no scan of other sessions."""
        start = after or ("", "")
        rows = await self._q_all(EXPIRING_SQL, (before, *start, limit))
        return [(r[0], r[1]) for r in rows]

    async def states(self, namespace: str, prefix: bool, after: str,
                     limit: int, max_bytes: int = 0) -> Page[bytes]:
        """Stored views of sessions in a namespace (or under a namespace prefix), by id."""
        args: tuple[str, ...]
        if prefix:
            where, args = "namespace >= ? AND namespace < ?", (namespace,
                                                               namespace + "\U0010ffff")
        else:
            where, args = "namespace = ?", (namespace,)
        rows = await self._q_page(f"SELECT state FROM sessions WHERE {where}"
                                  " AND session_id > ? ORDER BY session_id LIMIT ?",
                                  (*args, after, limit), max_bytes)
        return repage(rows, [bytes(r[0]) for r in rows])

    async def counts(self) -> tuple[int, int]:
        """(sessions, events stored), counted from the views and the fork index: a fork's
        versions up to its fork point are its source's events, not stored again. One pass
        over each, never over the events."""
        rows = await self._q_all(COUNTS, ())
        return int(rows[0][0]), int(rows[0][1])
