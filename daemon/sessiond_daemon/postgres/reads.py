"""The PostgreSQL store's reads: each on a pooled connection, one statement each (a paged
read runs its cursor in a transaction of its own), so no transaction spans the writer's."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Sequence
from typing import Any

import asyncpg
import msgspec

from sessiond_schemas.events import Event
from sessiond_schemas.state import (
    Message,
    ProgressStep,
    SessionState,
    SessionSummary,
)

from ..eventstore import (
    EVENT_COLUMNS,
    CheckpointRow,
    Page,
    SessionFilters,
    StoredCheckpoint,
    event_from_row,
    messages_page,
    repage,
    sessions_page,
)
from ..sqlite.progress import PAGE_SQL, steps_of
from ..sqlite.sessions import list_sessions_sql
from . import forks
from .errors import RETRYABLE, storage_error

_state_decoder = msgspec.json.Decoder(SessionState)
_dict_decoder = msgspec.json.Decoder(dict[str, Any])

def dollar(sql: str) -> str:
    """SQLite's `?` placeholders as PostgreSQL's $1, $2, ... (none is inside a literal in
    the shared queries)."""
    counter = iter(range(1, 1 << 16))
    return re.sub(r"\?", lambda _: f"${next(counter)}", sql)


def _row_bytes(row: Any) -> int:
    return sum(len(v) for v in row if isinstance(v, (str, bytes))) + 16


class Reads:
    """Read queries over the pool `_pool` (an asyncpg.Pool, set by open)."""

    _pool: Any
    reads: Counter[str]  # statements run, by what ran them (the fleet tests count them)

    @staticmethod
    def _state(data: bytes) -> SessionState:
        return _state_decoder.decode(data)

    async def _all(self, sql: str, *args: Any) -> list[Any]:
        self.reads["pool"] += 1
        try:
            return list(await self._pool.fetch(sql, *args))
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            raise storage_error(exc) from exc

    async def _one(self, sql: str, *args: Any) -> Any:
        rows = await self._all(sql, *args)
        return rows[0] if rows else None

    async def _page(self, sql: str, args: tuple[Any, ...], max_bytes: int) -> Page[Any]:
        """The rows of a paged query, stopping before the row that would pass `max_bytes`
        (0: no budget); the first row always comes. Fetched a few rows at a time through
        a cursor, so a page never holds much past its budget."""
        page: Page[Any] = Page()
        if not max_bytes:
            page.extend(await self._all(sql, *args))
            return page
        self.reads["pool"] += 1
        try:
            async with self._pool.acquire() as con, con.transaction(readonly=True):
                cursor = await con.cursor(sql, *args)
                used, chunk, largest = 0, 1, 1
                while rows := await cursor.fetch(chunk):
                    for row in rows:
                        size = _row_bytes(row)
                        if page and used + size > max_bytes:
                            page.cut = True
                            return page
                        page.append(row)
                        used += size
                        largest = max(largest, size)
                    # As SQLite's (sqlite/base.py): from the largest row, at most doubling.
                    chunk = max(1, min(1024, len(page), (max_bytes - used) // largest + 1))
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            raise storage_error(exc) from exc
        return page

    # --- positions and events ------------------------------------------------------------

    async def head(self) -> int:
        """The last committed position: every event at or below it is committed and
        readable (positions are taken in commit order from this very row)."""
        return int((await self._one("SELECT position FROM log_head WHERE id = 1"))[0])

    async def read_after(self, after: int, upto: int, session_id: str | None,
                         types: frozenset[str] | None, limit: int) -> list[Event]:
        """Events with after < position <= upto, in position order (what subscribers read)."""
        where: list[str] = ["position > $1 AND position <= $2"]
        args: list[Any] = [after, upto]
        if session_id is not None:
            args.append(session_id)
            where.append(f"session_id = ${len(args)}")
        if types:
            args.append(sorted(types))
            where.append(f"type = ANY(${len(args)}::text[])")
        args.append(limit)
        rows = await self._all(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)}"
            f" ORDER BY position LIMIT ${len(args)}", *args)
        return [event_from_row(r) for r in rows]

    async def read_events(self, *, session_id: str | None, from_version: int,
                          after_position: int, limit: int, types: list[str] | None,
                          max_bytes: int = 0) -> Page[Event]:
        where: list[str] = []
        args: list[Any] = []
        if session_id is not None:
            args += [session_id, from_version]
            where.append(f"session_id = ${len(args) - 1} AND version >= ${len(args)}")
        if after_position:
            args.append(after_position)
            where.append(f"position > ${len(args)}")
        if types:
            args.append(types)
            where.append(f"type = ANY(${len(args)}::text[])")
        args.append(limit)
        order = "version" if session_id is not None else "position"
        rows = await self._page(
            f"SELECT {EVENT_COLUMNS} FROM events"
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY {order} LIMIT ${len(args)}", tuple(args), max_bytes)
        return repage(rows, [event_from_row(r) for r in rows])

    async def first_position(self, session_id: str, from_version: int) -> int | None:
        row = await self._one("SELECT position FROM events WHERE session_id = $1"
                              " AND version >= $2 ORDER BY version LIMIT 1",
                              session_id, from_version)
        return int(row[0]) if row else None

    async def events_of_types(self, session_id: str,
                              types: tuple[str, ...]) -> list[tuple[str, Any]]:
        rows = await self._all("SELECT type, data FROM events WHERE session_id = $1"
                               " AND type = ANY($2::text[]) ORDER BY position",
                               session_id, list(types))
        return [(r[0], msgspec.json.decode(r[1])) for r in rows]

    async def foreign_event_ids(self, session_id: str, event_ids: list[str]) -> list[str]:
        rows = await self._all("SELECT event_id FROM events WHERE event_id = ANY($1::text[])"
                               " AND session_id <> $2", event_ids, session_id)
        return [r[0] for r in rows]

    # --- progress steps and the runner index (sqlite/progress.py, sqlite/runner.py) --------

    async def progress_steps(self, session_id: str, after_version: int, upto: int,
                             limit: int, max_bytes: int = 0) -> Page[ProgressStep]:
        rows = await self._page(dollar(PAGE_SQL), (session_id, after_version, upto, limit),
                                max_bytes)
        return repage(rows, steps_of([(r[0], r[1], bytes(r[2])) for r in rows]))

    async def runner_events(self, session_id: str, types: tuple[str, ...], *,
                            newest_first: bool = False, before_version: int | None = None,
                            limit: int = -1) -> list[tuple[str, int, dict[str, Any]]]:
        rows = await self._all(
            "SELECT r.type, r.version, e.data FROM runner_events r JOIN events e"
            " ON e.position = r.position WHERE r.session_id = $1 AND r.type = ANY($2::text[])"
            f" AND r.version < $3 ORDER BY r.version {'DESC' if newest_first else 'ASC'}"
            " LIMIT $4", session_id, list(types),
            before_version if before_version is not None else 1 << 62,
            None if limit < 0 else limit)
        return [(r[0], r[1], _dict_decoder.decode(r[2])) for r in rows]

    # --- sessions ------------------------------------------------------------------------

    async def state_json(self, session_id: str) -> bytes | None:
        row = await self._one("SELECT state FROM sessions WHERE session_id = $1", session_id)
        return bytes(row[0]) if row else None

    async def session_host(self, session_id: str) -> str | None:
        """The host whose daemon created the session (its executors run there), if known."""
        row = await self._one("SELECT host FROM sessions WHERE session_id = $1", session_id)
        return row[0] if row else None

    async def resolve(self, prefix: str) -> list[str]:
        rows = await self._all(
            "SELECT session_id FROM sessions WHERE session_id >= $1 AND session_id < $2"
            " ORDER BY session_id LIMIT 11", prefix, prefix + "\U0010ffff")
        return [r[0] for r in rows]

    async def session_ids(self, after: str, limit: int) -> list[str]:
        rows = await self._all("SELECT session_id FROM sessions WHERE session_id > $1"
                               " ORDER BY session_id LIMIT $2", after, limit)
        return [r[0] for r in rows]

    async def list_sessions(self, filters: SessionFilters, limit: int, cursor: str | None,
                            max_bytes: int = 0) -> tuple[Page[SessionSummary], str | None]:
        sql, args = list_sessions_sql(filters, limit + 1, cursor)
        rows = await self._page(dollar(sql), args, max_bytes)
        return sessions_page(rows, limit)

    async def stale_sessions(self, statuses: Sequence[str], before: str,
                             limit: int) -> list[str]:
        rows = await self._all("SELECT session_id FROM sessions WHERE status = ANY($1::text[])"
                               " AND updated_at < $2 ORDER BY updated_at LIMIT $3",
                               list(statuses), before, limit)
        return [r[0] for r in rows]

    async def expiring_sessions(self, before: str, after: tuple[str, str] | None,
                                limit: int) -> list[tuple[str, str]]:
        start = after or ("", "")
        rows = await self._all(
            "SELECT expires_at, session_id FROM sessions WHERE expires_at IS NOT NULL"
            " AND expires_at <= $1 AND (expires_at, session_id) > ($2, $3)"
            " ORDER BY expires_at, session_id LIMIT $4", before, *start, limit)
        return [(r[0], r[1]) for r in rows]

    async def counts(self) -> tuple[int, int]:
        """Return (sessions, events), counted from the views."""
        row = await self._one("SELECT COUNT(*), COALESCE(SUM(version), 0) FROM sessions")
        return int(row[0]), int(row[1])

    async def session_totals(self, column: str) -> list[tuple[Any, int, int, int, float]]:
        if column not in ("status", "namespace", "actor_name"):
            raise ValueError(f"not a grouping column: {column}")
        rows = await self._all(
            f"SELECT {column}, COUNT(*), COALESCE(SUM(input_tokens), 0)::float8,"
            " COALESCE(SUM(output_tokens), 0)::float8,"
            # numeric: a float8 SUM past 1.8e308 raises "value out of range" (SQLite's
            # TOTAL gives inf); the Decimal becomes inf in Python.
            " COALESCE(SUM(estimated_cost::numeric), 0)"
            f" FROM sessions GROUP BY {column}")
        return [(r[0], int(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows]

    # --- messages, checkpoints, snapshots ------------------------------------------------

    async def list_messages(self, session_id: str, *, first: int, limit: int,
                            descending: bool, max_bytes: int = 0) -> Page[Message]:
        op, order = ("<=", "DESC") if descending else (">=", "ASC")
        rows = await self._page(
            "SELECT e.data, e.recorded_at FROM messages m JOIN events e ON"
            f" e.position = m.position WHERE m.session_id = $1 AND m.sequence {op} $2"
            f" ORDER BY m.sequence {order} LIMIT $3", (session_id, first, limit), max_bytes)
        return messages_page(rows)

    async def checkpoint(self, session_id: str,
                         checkpoint_id: str | None) -> StoredCheckpoint | None:
        columns = ("c.checkpoint_id, c.node_id, c.resume_from, c.created_at, c.version,"
                   " c.payload, e.data, c.position")
        source = "checkpoints c LEFT JOIN events e ON e.position = c.position"
        if checkpoint_id is None:
            row = await self._one(f"SELECT {columns} FROM {source} WHERE c.session_id = $1"
                                  " ORDER BY c.version DESC LIMIT 1", session_id)
        else:
            row = await self._one(f"SELECT {columns} FROM {source} WHERE c.session_id = $1"
                                  " AND c.checkpoint_id = $2", session_id, checkpoint_id)
        if row is None:
            return None
        memory = _dict_decoder.decode(row[6]).get("memory", {}) if row[6] is not None else {}
        return StoredCheckpoint(
            checkpoint_id=row[0], node_id=row[1], resume_from=row[2], created_at=row[3],
            version=row[4], payload=await self._payload(bytes(row[5]), row[7]), memory=memory,
        )

    async def _payload(self, payload: bytes, position: int) -> bytes:
        """A row's payload, or the one it shares with its source (a fork's rows)."""
        if payload:
            return payload
        shared = await self._one(forks.SHARED_PAYLOAD_SQL, position)
        return bytes(shared[0]) if shared else b"null"

    async def checkpoints(self, session_id: str, after_version: int = 0,
                          max_bytes: int = 0) -> Page[CheckpointRow]:
        rows = await self._page(
            "SELECT checkpoint_id, node_id, created_at, size, version FROM checkpoints"
            " WHERE session_id = $1 AND version > $2 ORDER BY version",
            (session_id, after_version), max_bytes)
        return repage(rows, [
            CheckpointRow(checkpoint_id=r[0], node_id=r[1], created_at=r[2], size=r[3],
                           version=r[4])
            for r in rows
        ])

    async def checkpoint_payloads(self, session_id: str) -> dict[str, bytes]:
        rows = await self._all("SELECT checkpoint_id, payload, position FROM checkpoints"
                               " WHERE session_id = $1", session_id)
        return {r[0]: await self._payload(bytes(r[1]), r[2]) for r in rows}

    async def snapshot(self, session_id: str, at_most: int) -> SessionState | None:
        row = await self._one("SELECT state FROM snapshots WHERE session_id = $1"
                              " AND version <= $2 ORDER BY version DESC LIMIT 1",
                              session_id, at_most)
        return self._state(row[0]) if row else None

    async def snapshots(self, session_id: str) -> dict[int, SessionState]:
        rows = await self._all("SELECT version, state FROM snapshots WHERE session_id = $1",
                               session_id)
        return {int(r[0]): self._state(r[1]) for r in rows}
