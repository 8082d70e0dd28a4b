"""The SQLite store's read side: the read connections, paged queries, and driver errors.

The store (store.py), its views (sessions.py) and the shared read-model queries
(stores/models/queries.py, through `_q_all` / `_q_page`) build on this.
"""

from __future__ import annotations

import itertools
import sqlite3
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

import aiosqlite
import msgspec

from sessiond_daemon.stores.interface import Page
from sessiond_daemon.stores.models.sql import SQLITE, render
from sessiond_daemon.stores.rows import fill_page, paging
from sessiond_schemas.errors import StorageError
from sessiond_schemas.events import EventMeta

T = TypeVar("T")

_json = msgspec.json.Encoder()


def storage_error(exc: sqlite3.Error, *, read: bool = False) -> StorageError:
    """A driver error as the contract's -32012: a failed write says nothing was written,
    a failed read says it was a read (the same code and words as the PostgreSQL store's)."""
    if read:
        return StorageError(f"storage error while reading: {exc} (a read: nothing was"
                            " changed)", {"detail": str(exc), "read": True})
    return StorageError(f"storage error: {exc}; nothing was written", {"detail": str(exc)})


def encode(value: Any) -> bytes:
    return _json.encode(value)


# An event's meta as stored: the fields at their default (mostly null) are left out, and
# decoding as EventMeta puts them back, so the event (and its hash) is the same. ~40
# bytes less per event (bench/README: "CPU per append").
_StoredMeta = msgspec.defstruct(
    "_StoredMeta", [(f.name, Any, f.default) for f in msgspec.structs.fields(EventMeta)],
    omit_defaults=True)


def encode_meta(meta: EventMeta) -> bytes:
    """The stored bytes of an event's meta (read back with an EventMeta decoder)."""
    return _json.encode(_StoredMeta(*msgspec.structs.astuple(meta)))


def marks(n: int) -> str:
    """`?, ?, ...`: n placeholders."""
    return ", ".join("?" * n)


class SqliteReads:
    """A few read connections, used in turn; one statement each, so no transaction
    spans awaits."""

    _readers: list[aiosqlite.Connection]
    _next_reader: Iterator[int]
    dialect = SQLITE

    def __init__(self, readers: int) -> None:
        self._reader_count = readers
        self._readers = []
        self._next_reader = itertools.cycle(range(readers))

    def _r(self) -> aiosqlite.Connection:
        return self._readers[next(self._next_reader)]

    async def _one(self, sql: str, args: tuple[Any, ...] = ()) -> Any:
        try:
            async with self._r().execute(sql, args) as cur:
                return await cur.fetchone()
        except sqlite3.Error as exc:
            raise storage_error(exc, read=True) from exc

    async def _all(self, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        try:
            async with self._r().execute(sql, args) as cur:
                return list(await cur.fetchall())
        except sqlite3.Error as exc:
            raise storage_error(exc, read=True) from exc

    async def _page(self, sql: str, args: tuple[Any, ...], max_bytes: int) -> Page[Any]:
        """The rows of a paged query, stopping before the row that would pass `max_bytes`
        (0: no budget). The first row always comes, however large. Rows are fetched a few
        at a time, guessed from the sizes seen, so a page never holds much past its budget."""
        try:
            return await self._paged(sql, args, max_bytes)
        except sqlite3.Error as exc:
            raise storage_error(exc, read=True) from exc

    async def _paged(self, sql: str, args: tuple[Any, ...], max_bytes: int) -> Page[Any]:
        page: Page[Any] = Page()
        async with paging(), self._r().execute(sql, args) as cur:
            if not max_bytes:
                page.extend(await cur.fetchall())
                return page
            return await fill_page(cur.fetchmany, max_bytes)

    # The shared read-model queries' driver (stores/models/queries.py).
    async def _q_all(self, sql: str, args: tuple[Any, ...]) -> list[Any]:
        return await self._all(render(sql, SQLITE), args)

    async def _q_page(self, sql: str, args: tuple[Any, ...], max_bytes: int) -> Page[Any]:
        return await self._page(render(sql, SQLITE), args, max_bytes)

    async def on_reader(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` with a read connection on that connection's thread (several statements,
        one hop); driver errors become -32012."""
        return await self._on_connection(self._r(), fn)

    async def _on_connection(self, db: aiosqlite.Connection,
                             fn: Callable[[sqlite3.Connection], T]) -> T:
        try:
            # aiosqlite's own thread for this connection (private, and untyped, API)
            result: T = await db._execute(fn, db._conn)  # type: ignore[no-untyped-call]
        except sqlite3.Error as exc:
            raise storage_error(exc, read=True) from exc
        return result
