"""The PostgreSQL store's reads: each on a pooled connection, one statement each (a paged
read runs its cursor in a transaction of its own), so no transaction spans the writer's."""

from __future__ import annotations

import re
from collections import Counter
from typing import Any

import asyncpg
import msgspec

from sessiond_daemon.stores.interface import Page, repage
from sessiond_daemon.stores.models.sql import POSTGRES, render
from sessiond_daemon.stores.models.views import ViewQueries
from sessiond_daemon.stores.postgres.errors import RETRYABLE, storage_error
from sessiond_daemon.stores.rows import EVENT_COLUMNS, event_from_row, fill_page, paging
from sessiond_schemas.events import Event
from sessiond_schemas.state import (
    SessionState,
)

_state_decoder = msgspec.json.Decoder(SessionState)
_dict_decoder = msgspec.json.Decoder(dict[str, Any])

def dollar(sql: str) -> str:
    """SQLite's `?` placeholders as PostgreSQL's $1, $2, ... (none is inside a literal in
    the shared queries)."""
    counter = iter(range(1, 1 << 16))
    return re.sub(r"\?", lambda _: f"${next(counter)}", sql)


class Reads(ViewQueries):
    """Read queries over the pool `_pool` (an asyncpg.Pool, set by open)."""

    _pool: Any
    reads: Counter[str]  # statements run, by what ran them (the fleet tests count them)
    origin: str  # the daemon's mark on the deletes it writes (store.py)
    dialect = POSTGRES

    @staticmethod
    def _state(data: bytes) -> SessionState:
        return _state_decoder.decode(data)

    async def _all(self, sql: str, *args: Any) -> list[Any]:
        self.reads["pool"] += 1
        try:
            return list(await self._pool.fetch(sql, *args))
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            raise storage_error(exc, read=True) from exc

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
            async with paging(), self._pool.acquire() as con, con.transaction(readonly=True):
                cursor = await con.cursor(sql, *args)
                page = await fill_page(cursor.fetch, max_bytes)
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            raise storage_error(exc, read=True) from exc
        return page

    # The shared read-model queries' driver (stores/models/queries.py).
    async def _q_all(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        return await self._all(render(sql, POSTGRES), *args)

    async def _q_page(self, sql: str, args: tuple[Any, ...], max_bytes: int) -> Page[Any]:
        return await self._page(render(sql, POSTGRES), args, max_bytes)

    # --- positions and events ------------------------------------------------------------

    async def head(self) -> int:
        """The last committed position: every event at or below it is committed and
        readable (positions are taken in commit order from this very row)."""
        return int((await self._one("SELECT position FROM log_head WHERE id = 1"))[0])

    async def head_and_deletions(self, after: int) -> tuple[int, list[tuple[int, str]]]:
        """`head`, and the sessions other daemons deleted after position `after` or later,
        as (the position the log stood at, session id), in that order. One statement, one
        snapshot: a delete placed below the head read is committed (it held the counter
        row until it was), so it is among them."""
        row = await self._one(
            "SELECT (SELECT position FROM log_head WHERE id = 1), ARRAY(SELECT after_position"
            " FROM deletions WHERE after_position >= $1 AND origin <> $2 ORDER BY"
            " after_position, session_id), ARRAY(SELECT session_id FROM deletions WHERE"
            " after_position >= $1 AND origin <> $2 ORDER BY after_position, session_id)",
            after, self.origin)
        return int(row[0]), list(zip(map(int, row[1]), row[2], strict=True))

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

    # --- sessions ------------------------------------------------------------------------

    async def session_host(self, session_id: str) -> str | None:
        """The host whose daemon created the session (its executors run there), if known."""
        row = await self._one("SELECT host FROM sessions WHERE session_id = $1", session_id)
        return row[0] if row else None

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

