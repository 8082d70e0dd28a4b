"""The SQLite store: opening and migrating, the writer's batch commit, and the read queries.

Everything that knows it is talking to SQLite lives here and in migrations.py
(the schema); the writer and the service see only `Batch`, `Entry`, Structs and
the contract's errors.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import itertools
import os
import sqlite3
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any, Final, TypeVar

import aiosqlite
import anyio
import msgspec
import structlog

from sessiond_schemas.errors import InvalidParamsError, StorageError
from sessiond_schemas.events import Event, EventMeta, MessageAppended
from sessiond_schemas.rpc import CheckpointGetResult, CheckpointInfo
from sessiond_schemas.state import Message, SessionState, SessionSummary, TokenUsage

from . import forks, host, migrations, search
from .migrations import SESSION_TABLES

log = structlog.get_logger("sessiond.store")
T = TypeVar("T")

_json = msgspec.json.Encoder()
_state_decoder = msgspec.json.Decoder(SessionState)
_meta_decoder = msgspec.json.Decoder(EventMeta)
_message_decoder = msgspec.json.Decoder(MessageAppended)
_dict_decoder = msgspec.json.Decoder(dict[str, Any])

# The byte budget of one page of a paged read (message.list, events.read, ...). The
# server sets it for each request: max_page_bytes, or a share of it for a batch item.
page_budget: ContextVar[int] = ContextVar("page_budget", default=4 << 20)


class Page(list[T]):
    """The rows of one page; `cut` is True when the byte budget ended it before its count."""

    cut: bool = False


def _row_bytes(row: Any) -> int:
    """About what a row weighs in an answer: its text and blob columns."""
    return sum(len(v) for v in row if isinstance(v, (str, bytes))) + 16

@dataclass(slots=True)
class Entry:
    """A session as the writer holds it: the view, its chain head and last position."""

    state: SessionState
    last_hash: str
    last_position: int


@dataclass(slots=True)
class Batch:
    """Everything one group commit writes, in the order it is applied."""

    deletes: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    views: dict[str, Entry] = field(default_factory=dict)
    payloads: dict[str, bytes] = field(default_factory=dict)  # checkpoint event_id -> payload
    idempotency: list[tuple[str, str, bytes]] = field(default_factory=list)
    snapshots: list[SessionState] = field(default_factory=list)

    def drop_session(self, session_id: str) -> None:
        """Forget what this batch would write for a session that a later command deletes."""
        self.events = [e for e in self.events if e.session_id != session_id]
        self.views.pop(session_id, None)
        self.idempotency = [i for i in self.idempotency if i[0] != session_id]
        self.snapshots = [v for v in self.snapshots if v.session_id != session_id]


def _open_cause(path: str) -> str | None:
    """Why SQLite could not open `path`, when the file system says (its own message,
    "unable to open database file", does not)."""
    directory = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path):
        return "it is a directory; give the path of a database file"
    readonly = False
    with contextlib.suppress(OSError):
        readonly = bool(os.statvfs(directory).f_flag & os.ST_RDONLY)
    if readonly:
        return f"the file system holding {directory} is read-only"
    # WAL needs the file and, beside it, -wal and -shm files: all must be writable.
    for target, what in ((path, "the file"), (path + "-wal", "its -wal file"),
                         (path + "-shm", "its -shm file")):
        if os.path.exists(target) and not os.access(target, os.R_OK | os.W_OK):
            return (f"permission denied: {what} {target} is not readable and writable by uid"
                    f" {os.geteuid()}")
    if not os.access(directory, os.W_OK | os.X_OK):
        return (f"permission denied: uid {os.geteuid()} cannot create files in {directory}"
                " (SQLite needs its -wal and -shm files there)")
    return None


def _storage_error(exc: sqlite3.Error) -> StorageError:
    return StorageError(f"storage error: {exc}; nothing was written", {"detail": str(exc)})


async def _connect(path: str, synchronous: str, *, query_only: bool) -> aiosqlite.Connection:
    db = await aiosqlite.connect(path, isolation_level=None, check_same_thread=False)
    await db.execute("PRAGMA busy_timeout = 5000")
    await db.execute("PRAGMA foreign_keys = ON")
    # synchronous is per connection and never stored in the file: set it on each.
    await db.execute(f"PRAGMA synchronous = {synchronous}")
    if query_only:
        await db.execute("PRAGMA query_only = ON")
    await search.register_async(db)  # the search index's text function
    return db


class SqliteStore:
    """The write connection (only the writer task uses it) and a few read connections.

    The write connection is a plain sqlite3 connection living on one worker
    thread, so a whole batch transaction is one thread hop; aiosqlite would make
    it one hop per statement (measured ~150 us each here). Reads use aiosqlite.
    """

    def __init__(self, path: str, durability: str = "full", readers: int = 2,
                 max_bytes: int = 0) -> None:
        self.path = path
        self.synchronous = "FULL" if durability == "full" else "NORMAL"
        self.max_bytes = max_bytes  # 0: no cap; else writes past it fail with "disk full"
        self._reader_count = readers
        self._pool: ThreadPoolExecutor | None = None
        self._con: sqlite3.Connection | None = None
        self._readers: list[aiosqlite.Connection] = []
        self._next_reader = itertools.cycle(range(readers))
        self._identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file we opened
        self._lost: str | None = None  # why the file at self.path is no longer ours
        self.schema_version = 0
        self.migrated: list[int] = []  # the migrations this open applied
        self.last_commit_s = 0.0  # seconds the last commit took, fsync and thread hop included

    # --- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Open the database, switch it to WAL and run pending migrations."""
        host.make_private_dirs(os.path.dirname(os.path.abspath(self.path)))
        # SQLite gives -wal and -shm the database file's mode: 0600 covers all three.
        host.create_private_file(self.path)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sessiond-writer")
        try:
            synchronous = await self._on_writer(self._open_writer)
            self._readers = [
                await _connect(self.path, self.synchronous, query_only=True)
                for _ in range(self._reader_count)
            ]
        except migrations.SchemaRefused:
            await self.close()
            raise
        except sqlite3.DatabaseError as exc:
            await self.close()
            cause = _open_cause(self.path)
            raise StorageError(
                f"cannot open database {self.path}: {cause} (SQLite: {exc})" if cause else
                f"cannot open database {self.path}: {exc}. The file is left untouched: restore"
                " it from a backup, or move it aside to start with an empty database.",
                {"detail": str(exc), **({"cause": cause} if cause else {})},
            ) from exc
        log.info("store.opened", path=self.path, synchronous=synchronous,
                 schema_version=self.schema_version)

    async def close(self) -> None:
        """Checkpoint the WAL and close every connection."""
        for db in self._readers:
            await db.close()
        self._readers = []
        if self._pool is not None:
            await self._on_writer(self._close_writer)
            self._pool.shutdown(wait=True)
            self._pool = None

    async def _on_writer(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on the write connection's thread."""
        assert self._pool is not None, "store is not open"
        return await asyncio.get_running_loop().run_in_executor(self._pool, fn, *args)

    def _open_writer(self) -> int:
        con = sqlite3.connect(self.path, isolation_level=None)
        self._con = con
        con.execute("PRAGMA busy_timeout = 5000")
        con.execute("PRAGMA foreign_keys = ON")
        search.register(con)  # before migration 4 builds the index with it
        migrations.refuse_newer(con, self.path)  # before anything is changed
        # synchronous is per connection and never stored in the file: set it on each.
        con.execute(f"PRAGMA synchronous = {self.synchronous}")
        con.execute("PRAGMA journal_mode = WAL")
        if self.max_bytes:
            page = con.execute("PRAGMA page_size").fetchone()[0]
            con.execute(f"PRAGMA max_page_count = {max(1, self.max_bytes // page)}")
        self.migrated = migrations.migrate(con, self.path)
        self.schema_version = migrations.schema_version(con)
        st = os.stat(self.path)
        self._identity = (st.st_dev, st.st_ino)
        self._lost = None
        return int(con.execute("PRAGMA synchronous").fetchone()[0])

    def _check_identity(self) -> None:
        """Refuse to go on once the file at our path is not the one we have open.

        Writes into a deleted or replaced file would be acknowledged and then gone
        at the next start; from the first sign of it every commit is refused.
        """
        if self._lost is None:
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._lost = "was deleted"
            except OSError as exc:
                raise StorageError(f"storage error: cannot check the database file {self.path}:"
                                   f" {exc.strerror}", {"detail": str(exc)}) from exc
            else:
                if (st.st_dev, st.st_ino) != self._identity:
                    self._lost = "was replaced by another file"
            if self._lost is not None:
                log.error("store.database_file_lost", path=self.path, why=self._lost)
        if self._lost is not None:
            raise StorageError(
                f"storage error: the database file {self.path} {self._lost} while sessiond"
                " was running; writes are refused, since they would be lost. Restart sessiond"
                " (after putting the database back, if that was not meant)",
                {"detail": f"database file {self._lost}", "path": self.path})

    def _file_bytes(self) -> int:
        """The database's bytes on disk with its WAL (a missing file counts 0)."""
        total = 0
        for suffix in ("", "-wal"):
            try:
                total += os.stat(self.path + suffix).st_size
            except OSError:
                pass
        return total

    def _keep_under_cap(self, *, before_commit: bool) -> None:
        """max_db_bytes counts the WAL: past it, checkpoint the WAL into the file and
        truncate it; before a commit, refuse when even that leaves no room."""
        if not self.max_bytes or self._file_bytes() <= self.max_bytes:
            return
        self._w.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        size = self._file_bytes()
        if before_commit and size > self.max_bytes:
            raise sqlite3.OperationalError(
                f"database or disk is full: {size} bytes with the WAL,"
                f" max_db_bytes is {self.max_bytes}")

    def _close_writer(self) -> None:
        if self._con is None:
            return
        try:
            self._con.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        except sqlite3.Error as exc:
            log.warning("store.checkpoint_failed", error=str(exc))
        self._con.close()
        self._con = None

    @property
    def _w(self) -> sqlite3.Connection:
        assert self._con is not None, "store is not open"
        return self._con

    def _r(self) -> aiosqlite.Connection:
        return self._readers[next(self._next_reader)]

    @staticmethod
    async def _one(db: aiosqlite.Connection, sql: str, args: tuple[Any, ...] = ()) -> Any:
        async with db.execute(sql, args) as cur:
            return await cur.fetchone()

    @staticmethod
    async def _all(db: aiosqlite.Connection, sql: str, args: tuple[Any, ...] = ()) -> list[Any]:
        async with db.execute(sql, args) as cur:
            return list(await cur.fetchall())

    @staticmethod
    async def _page(db: aiosqlite.Connection, sql: str, args: tuple[Any, ...],
                    max_bytes: int) -> Page[Any]:
        """The rows of a paged query, stopping before the row that would pass `max_bytes`
        (0: no budget). The first row always comes, however large. Rows are fetched a few
        at a time, guessed from the sizes seen, so a page never holds much past its budget."""
        page: Page[Any] = Page()
        async with db.execute(sql, args) as cur:
            if not max_bytes:
                page.extend(await cur.fetchall())
                return page
            used, chunk = 0, 1
            while rows := await cur.fetchmany(chunk):
                for row in rows:
                    size = _row_bytes(row)
                    if page and used + size > max_bytes:
                        page.cut = True
                        return page
                    page.append(row)
                    used += size
                chunk = max(1, min(1024, (max_bytes - used) // (used // len(page)) + 1))
        return page

    # --- the writer's side (each call is one hop to the write thread) ----------------

    async def last_position(self) -> int:
        return await self._on_writer(
            lambda: int(self._w.execute("SELECT COALESCE(MAX(position), 0) FROM events").fetchone()[0]))

    async def load_entry(self, session_id: str) -> Entry | None:
        row = await self._on_writer(lambda: self._w.execute(
            "SELECT state, last_hash, last_position FROM sessions WHERE session_id = ?",
            (session_id,)).fetchone())
        if row is None:
            return None
        return Entry(_state_decoder.decode(row[0]), row[1], row[2])

    async def sessions_behind(self) -> list[str]:
        """Sessions whose events go past their stored view (or that have no view): rows
        written behind the daemon's back. One walk of the (session_id, version) index."""
        return await self._on_writer(lambda: [r[0] for r in self._w.execute(
            "SELECT e.session_id FROM (SELECT session_id, MAX(version) AS v FROM events"
            " GROUP BY session_id) e LEFT JOIN sessions s ON s.session_id = e.session_id"
            " WHERE s.version IS NULL OR s.version < e.v")])

    async def idempotent_results(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        """The stored first results of these (session_id, idempotency_key) pairs, in one hop."""
        def read() -> dict[tuple[str, str], bytes]:
            found = {}
            for start in range(0, len(keys), 400):
                chunk = keys[start:start + 400]
                pairs = ", ".join("(?, ?)" for _ in chunk)
                for sid, key, result in self._w.execute(
                        "SELECT session_id, key, result FROM idempotency WHERE (session_id, key)"
                        f" IN (VALUES {pairs})", [x for pair in chunk for x in pair]):
                    found[(sid, key)] = bytes(result)
            return found
        return await self._on_writer(read)

    async def commit(self, batch: Batch) -> None:
        """Write a whole batch in one transaction (one fsync), or nothing of it."""
        started = time.perf_counter()
        try:
            await self._on_writer(self._commit, batch)
        except sqlite3.IntegrityError as exc:
            # The writer decides versions and ids alone, so this is a bug, not a race.
            log.error("store.integrity_error", error=str(exc))
            raise _storage_error(exc) from exc
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc
        self.last_commit_s = time.perf_counter() - started  # what the writer waited for

    def _commit(self, batch: Batch) -> None:
        con = self._w
        self._check_identity()
        self._keep_under_cap(before_commit=True)
        con.execute("BEGIN IMMEDIATE")
        try:
            self._write(con, batch)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        # Before anyone is answered: was that the file at our path?
        self._check_identity()
        try:
            self._keep_under_cap(before_commit=False)
        except sqlite3.Error as exc:  # committed already: the next commit tries again
            log.warning("store.checkpoint_failed", error=str(exc))

    @staticmethod
    def _write(db: sqlite3.Connection, batch: Batch) -> None:
        for sid in batch.deletes:
            search.forget_session(db, sid)
            for table in SESSION_TABLES:
                db.execute(f"DELETE FROM {table} WHERE session_id = ?", (sid,))
        if batch.events:
            db.executemany(
                "INSERT INTO events (position, session_id, version, event_id, type,"
                " schema_version, recorded_at, data, meta, hash)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (e.position, e.session_id, e.version, e.event_id, e.type, e.schema_version,
                     e.recorded_at, _json.encode(e.data), _json.encode(e.meta), e.hash)
                    for e in batch.events
                ],
            )
            search.index(db, batch.events)
            # The indexes of messages and graphs, in event order: a truncation or a prune
            # removes what came before it.
            messages: list[tuple[str, int, int]] = []
            for e in batch.events:
                if e.type == "message.appended":
                    messages.append((e.session_id, e.data["sequence"], e.position))
                elif e.type == "messages.truncated":
                    _insert_messages(db, messages)
                    messages = []
                    db.execute("DELETE FROM messages WHERE session_id = ? AND sequence >= ?",
                               (e.session_id, e.data["from_sequence"]))
                elif e.type.startswith("graph."):
                    _index_graph_event(db, e)
                elif e.type == "state.updated":
                    _index_scoped_state(db, e)
                elif e.type == "session.forked":
                    _insert_messages(db, messages)
                    messages = []
                    forks.index(db, e)
            _insert_messages(db, messages)
            checkpoints = [
                (e.session_id, e.data["checkpoint_id"], e.position, e.version,
                 e.data.get("node_id"), e.data.get("resume_from"), e.recorded_at,
                 e.data["size"], batch.payloads[e.event_id])
                for e in batch.events
                if e.type == "checkpoint.saved"
            ]
            if checkpoints:
                db.executemany(
                    "INSERT OR REPLACE INTO checkpoints (session_id, checkpoint_id, position,"
                    " version, node_id, resume_from, created_at, size, payload)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    checkpoints,
                )
        if batch.views:
            db.executemany(
                "INSERT OR REPLACE INTO sessions (session_id, version, status, namespace,"
                " actor_name, source, task, created_at, updated_at, message_count, input_tokens,"
                " output_tokens, estimated_cost, last_position, last_hash, state)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [_view_row(entry) for entry in batch.views.values()],
            )
        if batch.idempotency:
            db.executemany(
                "INSERT INTO idempotency (session_id, key, result) VALUES (?, ?, ?)",
                batch.idempotency,
            )
        if batch.snapshots:
            db.executemany(
                "INSERT OR REPLACE INTO snapshots (session_id, version, state) VALUES (?, ?, ?)",
                [(v.session_id, v.version, _json.encode(v)) for v in batch.snapshots],
            )

    # --- reads (read connections; one statement each, so no transaction spans awaits) ---

    async def on_reader(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` with a read connection on that connection's thread (several statements,
        one hop); driver errors become -32012."""
        db = self._r()
        try:
            return await db._execute(fn, db._conn)  # aiosqlite's own thread for this connection
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc

    async def on_writer(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` in a transaction of its own on the write connection (maintenance)."""
        def run() -> T:
            con = self._w
            self._check_identity()
            con.execute("BEGIN IMMEDIATE")
            try:
                result = fn(con)
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
            return result
        try:
            return await self._on_writer(run)
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc

    async def state_json(self, session_id: str) -> bytes | None:
        row = await self._one(
            self._r(), "SELECT state FROM sessions WHERE session_id = ?", (session_id,)
        )
        return bytes(row[0]) if row else None

    async def checkpoint_payloads(self, session_id: str) -> dict[str, bytes]:
        rows = await self._all(self._r(), "SELECT checkpoint_id, payload FROM checkpoints"
                               " WHERE session_id = ?", (session_id,))
        return {r[0]: bytes(r[1]) for r in rows}

    async def foreign_event_ids(self, session_id: str, event_ids: list[str]) -> list[str]:
        """Which of these event ids another session already holds."""
        found: list[str] = []
        for i in range(0, len(event_ids), 500):
            chunk = event_ids[i:i + 500]
            rows = await self._all(
                self._r(), f"SELECT event_id FROM events WHERE event_id IN"
                f" ({', '.join('?' * len(chunk))}) AND session_id != ?", (*chunk, session_id))
            found += [r[0] for r in rows]
        return found

    async def integrity_check(self) -> list[str]:
        """SQLite's own check of the file: ["ok"] when sound."""
        return [r[0] for r in await self._all(self._r(), "PRAGMA integrity_check")]

    async def session_ids(self, after: str, limit: int) -> list[str]:
        """Session ids in id order, after `after` (for walking every session)."""
        rows = await self._all(self._r(), "SELECT session_id FROM sessions WHERE session_id > ?"
                               " ORDER BY session_id LIMIT ?", (after, limit))
        return [r[0] for r in rows]

    async def snapshots(self, session_id: str) -> dict[int, SessionState]:
        rows = await self._all(self._r(), "SELECT version, state FROM snapshots"
                               " WHERE session_id = ?", (session_id,))
        return {r[0]: _state_decoder.decode(r[1]) for r in rows}

    async def stale_sessions(self, statuses: list[str], before: str, limit: int) -> list[str]:
        """Sessions in one of `statuses` whose last event is older than `before`."""
        rows = await self._all(
            self._r(),
            f"SELECT session_id FROM sessions WHERE status IN ({', '.join('?' * len(statuses))})"
            " AND updated_at < ? ORDER BY updated_at LIMIT ?",
            (*statuses, before, limit))
        return [r[0] for r in rows]

    async def events_of_types(self, session_id: str,
                              types: tuple[str, ...]) -> list[tuple[str, Any]]:
        """A session's events of the given types, in order, as (type, decoded data)."""
        rows = await self._all(
            self._r(),
            f"SELECT type, data FROM events WHERE session_id = ?"
            f" AND type IN ({', '.join('?' * len(types))}) ORDER BY position",
            (session_id, *types))
        return [(r[0], msgspec.json.decode(r[1])) for r in rows]

    async def process_output(self, session_id: str, turn: int, stream: str | None,
                             after_position: int = 0,
                             max_bytes: int = 0) -> Page[tuple[int, str]]:
        """The output lines of one executor turn (one stream, or both), in order, as
        (position, line), from after `after_position`."""
        rows = await self._page(
            self._r(), "SELECT data, position FROM events WHERE session_id = ?"
            " AND type = 'process.output' AND position > ?"
            " AND json_extract(data, '$.turn') = ? AND (? IS NULL OR"
            " coalesce(json_extract(data, '$.stream'), 'stdout') = ?) ORDER BY position",
            (session_id, after_position, turn, stream, stream), max_bytes)
        return repage(rows, [(r[1], msgspec.json.decode(r[0])["line"]) for r in rows])

    async def sessions_with_process(self) -> list[str]:
        """Active sessions whose view names a process: candidates for restart recovery."""
        rows = await self._all(
            self._r(), "SELECT session_id FROM sessions WHERE status = 'active'"
            " AND json_extract(state, '$.pid') IS NOT NULL")
        return [r[0] for r in rows]

    @staticmethod
    def _graph_where(session_id: str | None, ns: str | None, checkpoint_id: str | None,
                     before: str | None) -> tuple[str, list[Any]]:
        where, args = [], []
        for column, op, value in (("session_id", "=", session_id), ("ns", "=", ns),
                                  ("checkpoint_id", "=", checkpoint_id),
                                  ("checkpoint_id", "<", before)):
            if value is not None:
                where.append(f"gc.{column} {op} ?")
                args.append(value)
        return (" WHERE " + " AND ".join(where) if where else ""), args

    async def graph_checkpoints(self, session_id: str | None, ns: str | None,
                                checkpoint_id: str | None, before: str | None, limit: int,
                                offset: int, after: tuple[str, str, str] | None = None
                                ) -> list[tuple[str, str, str, bytes]]:
        """(session_id, ns, checkpoint_id, event data) of indexed checkpoints, newest id first
        (then by session_id, ns); only those past `after`, such a triple, when given."""
        where, args = self._graph_where(session_id, ns, checkpoint_id, before)
        if after is not None:
            where += (" AND " if where else " WHERE ") + (
                "(gc.checkpoint_id < ? OR (gc.checkpoint_id = ? AND (gc.session_id > ?"
                " OR (gc.session_id = ? AND gc.ns > ?))))")
            args += [after[2], after[2], after[0], after[0], after[1]]
        rows = await self._all(
            self._r(), "SELECT gc.session_id, gc.ns, gc.checkpoint_id, e.data"
            " FROM graph_checkpoints gc JOIN events e ON e.position = gc.position" + where
            + " ORDER BY gc.checkpoint_id DESC, gc.session_id, gc.ns LIMIT ? OFFSET ?",
            (*args, limit, offset))
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    async def graph_checkpoint_ids(self, session_id: str) -> list[tuple[str, str]]:
        """(ns, checkpoint_id) of a thread's indexed checkpoints, newest id first."""
        rows = await self._all(self._r(), "SELECT ns, checkpoint_id FROM graph_checkpoints"
                               " WHERE session_id = ? ORDER BY checkpoint_id DESC", (session_id,))
        return [(r[0], r[1]) for r in rows]

    async def graph_values(self, session_id: str, ns: str,
                           wanted: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
        """The stored values of these (channel, version) pairs, from the events holding them."""
        found: dict[tuple[str, str], Any] = {}
        for start in range(0, len(wanted), 400):
            chunk = wanted[start:start + 400]
            pairs = ", ".join("(?, ?)" for _ in chunk)
            rows = await self._all(
                self._r(), "SELECT gb.channel, gb.version, e.position, e.data FROM graph_blobs gb"
                " JOIN events e ON e.position = gb.position WHERE gb.session_id = ? AND gb.ns = ?"
                f" AND (gb.channel, gb.version) IN (VALUES {pairs})",
                (session_id, ns, *(x for pair in chunk for x in pair)))
            decoded: dict[int, Any] = {}
            for channel, version, position, data in rows:
                if position not in decoded:
                    decoded[position] = msgspec.json.decode(data)
                found[(channel, version)] = decoded[position]["blobs"][channel]
        return found

    async def graph_pending(self, session_id: str, ns: str,
                            checkpoint_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Each checkpoint's pending writes, by task then idx."""
        found: dict[str, list[dict[str, Any]]] = {}
        for start in range(0, len(checkpoint_ids), 400):
            chunk = checkpoint_ids[start:start + 400]
            rows = await self._all(
                self._r(), "SELECT gw.checkpoint_id, gw.item, e.position, e.data"
                " FROM graph_writes gw JOIN events e ON e.position = gw.position"
                " WHERE gw.session_id = ? AND gw.ns = ?"
                f" AND gw.checkpoint_id IN ({', '.join('?' * len(chunk))})"
                " ORDER BY gw.checkpoint_id, gw.task_id, gw.idx", (session_id, ns, *chunk))
            decoded: dict[int, Any] = {}
            for checkpoint_id, item, position, data in rows:
                if position not in decoded:
                    decoded[position] = msgspec.json.decode(data)
                w = decoded[position]
                found.setdefault(checkpoint_id, []).append({
                    "task_id": w["task_id"], "task_path": w.get("task_path", ""),
                    "channel": w["writes"][item]["channel"], "value": w["writes"][item]["value"]})
        return found

    async def graph_runs(self, run_ids: list[str]) -> list[tuple[str, str, str]]:
        """(session_id, ns, checkpoint_id) of checkpoints made by any of these runs."""
        rows = await self._all(
            self._r(), "SELECT session_id, ns, checkpoint_id FROM graph_checkpoints WHERE run_id"
            f" IN ({', '.join('?' * len(run_ids))}) ORDER BY session_id", tuple(run_ids))
        return [(r[0], r[1], r[2]) for r in rows]

    async def scoped_state(self, app_name: str, user_ids: list[str]) -> dict[str, dict[str, Any]]:
        """App state (under '') and each listed user's state, as stored by state.updated."""
        users = ["", *user_ids]
        found: dict[str, dict[str, Any]] = {u: {} for u in users}
        for start in range(0, len(users), 500):
            chunk = users[start:start + 500]
            rows = await self._all(
                self._r(), "SELECT user_id, key, value FROM scoped_state WHERE app_name = ?"
                f" AND user_id IN ({', '.join('?' * len(chunk))})", (app_name, *chunk))
            for user, key, value in rows:
                found[user][key] = msgspec.json.decode(value)
        return found

    async def states(self, namespace: str, prefix: bool, after: str,
                     limit: int, max_bytes: int = 0) -> Page[bytes]:
        """Stored views of sessions in a namespace (or under a namespace prefix), by id."""
        if prefix:
            where, args = "namespace >= ? AND namespace < ?", (namespace, namespace + "\U0010ffff")
        else:
            where, args = "namespace = ?", (namespace,)
        rows = await self._page(self._r(), f"SELECT state FROM sessions WHERE {where}"
                                " AND session_id > ? ORDER BY session_id LIMIT ?",
                                (*args, after, limit), max_bytes)
        return repage(rows, [bytes(r[0]) for r in rows])

    async def backup(self, target: str) -> tuple[int, int]:
        """Copy the database online (SQLite's backup API: one consistent snapshot while
        writers go on) to a new file; return (bytes, last position in the copy)."""
        def copy() -> tuple[int, int]:
            source = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)  # never overwrite
            os.close(fd)
            dest = sqlite3.connect(target)
            try:
                source.backup(dest)
                dest.execute("PRAGMA journal_mode = WAL")
                position = dest.execute("SELECT COALESCE(MAX(position), 0) FROM events").fetchone()[0]
            finally:
                dest.close()
                source.close()
            return os.path.getsize(target), int(position)

        try:
            return await anyio.to_thread.run_sync(copy)
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc

    async def snapshot(self, session_id: str, at_most: int) -> SessionState | None:
        """The latest stored view of a session at or before version `at_most`."""
        row = await self._one(
            self._r(),
            "SELECT state FROM snapshots WHERE session_id = ? AND version <= ?"
            " ORDER BY version DESC LIMIT 1",
            (session_id, at_most),
        )
        return _state_decoder.decode(row[0]) if row else None

    async def resolve(self, prefix: str) -> list[str]:
        # A range scan on the primary key; GLOB-free so '_' and '%' stay literal.
        rows = await self._all(
            self._r(),
            "SELECT session_id FROM sessions WHERE session_id >= ? AND session_id < ?"
            " ORDER BY session_id LIMIT 11",
            (prefix, prefix + "\U0010ffff"),
        )
        return [r[0] for r in rows]

    async def list_sessions(
        self, filters: SessionFilters, limit: int, cursor: str | None, max_bytes: int = 0
    ) -> tuple[Page[SessionSummary], str | None]:
        sql, args = list_sessions_sql(filters, limit + 1, cursor)
        rows = await self._page(self._r(), sql, args, max_bytes)
        page = repage(rows, [
            SessionSummary(
                session_id=r[0], status=r[1], namespace=r[2], actor_name=r[3], task=r[4],
                created_at=r[5], updated_at=r[6], message_count=r[7],
                token_usage=TokenUsage(input_tokens=r[8], output_tokens=r[9],
                                       estimated_cost=r[10]),
            )
            for r in rows[:limit]
        ])
        more = len(rows) > limit or rows.cut
        page.cut = rows.cut and len(rows) < limit  # not when only the look-ahead row was cut
        next_cursor = _encode_cursor(page[-1].created_at, page[-1].session_id) if more else None
        return page, next_cursor

    async def list_messages(
        self, session_id: str, *, first: int, limit: int, descending: bool, max_bytes: int = 0
    ) -> Page[Message]:
        """Read `limit` messages (or `max_bytes` of them) starting at sequence `first`,
        walking the primary key."""
        rows = await self._page(self._r(), messages_page_sql(descending),
                                (session_id, first, limit), max_bytes)
        messages: Page[Message] = repage(rows, [])
        for data, recorded_at in rows:
            m = _message_decoder.decode(data)
            messages.append(Message(
                message_id=m.message_id, sequence=m.sequence, role=m.role, content=m.content,
                timestamp=recorded_at, tool_call_id=m.tool_call_id, metadata=m.metadata,
            ))
        return messages

    async def read_events(
        self,
        *,
        session_id: str | None,
        from_version: int,
        after_position: int,
        limit: int,
        types: list[str] | None,
        max_bytes: int = 0,
    ) -> Page[Event]:
        where, args = [], []  # type: tuple[list[str], list[Any]]
        if session_id is not None:
            where.append("session_id = ? AND version >= ?")
            args.extend((session_id, from_version))
        if after_position:
            where.append("position > ?")
            args.append(after_position)
        if types:
            where.append(f"type IN ({', '.join('?' * len(types))})")
            args.extend(types)
        order = "version" if session_id is not None else "position"
        rows = await self._page(
            self._r(),
            f"SELECT {_EVENT_COLUMNS} FROM events"
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY {order} LIMIT ?",
            (*args, limit),
            max_bytes,
        )
        return repage(rows, [_event_from_row(r) for r in rows])

    async def read_after(self, after: int, upto: int, session_id: str | None,
                         types: frozenset[str] | None, limit: int) -> list[Event]:
        """Events with after < position <= upto, in position order (what subscribers read)."""
        where, args = ["position > ? AND position <= ?"], [after, upto]  # type: tuple[list[str], list[Any]]
        if session_id is not None:
            where.append("session_id = ?")
            args.append(session_id)
        if types:
            where.append(f"type IN ({', '.join('?' * len(types))})")
            args.extend(sorted(types))
        rows = await self._all(
            self._r(),
            f"SELECT {_EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)}"
            " ORDER BY position LIMIT ?",
            (*args, limit),
        )
        return [_event_from_row(r) for r in rows]

    async def first_position(self, session_id: str, from_version: int) -> int | None:
        """Position of a session's first event at or after `from_version`."""
        row = await self._one(
            self._r(),
            "SELECT position FROM events WHERE session_id = ? AND version >= ?"
            " ORDER BY version LIMIT 1",
            (session_id, from_version),
        )
        return int(row[0]) if row else None

    async def checkpoint(self, session_id: str, checkpoint_id: str | None) -> CheckpointGetResult | None:
        columns = "checkpoint_id, node_id, resume_from, created_at, version, payload, position"
        if checkpoint_id is None:
            row = await self._one(
                self._r(),
                f"SELECT {columns} FROM checkpoints WHERE session_id = ?"
                " ORDER BY version DESC LIMIT 1",
                (session_id,),
            )
        else:
            row = await self._one(
                self._r(),
                f"SELECT {columns} FROM checkpoints WHERE session_id = ? AND checkpoint_id = ?",
                (session_id, checkpoint_id),
            )
        if row is None:
            return None
        saved = await self._one(self._r(), "SELECT data FROM events WHERE position = ?", (row[6],))
        memory = _dict_decoder.decode(saved[0]).get("memory", {}) if saved else {}
        return CheckpointGetResult(
            checkpoint_id=row[0], node_id=row[1], resume_from=row[2], created_at=row[3],
            version=row[4], payload=msgspec.Raw(bytes(row[5])), memory=memory,
        )

    async def checkpoints(self, session_id: str, after_version: int = 0,
                          max_bytes: int = 0) -> Page[CheckpointInfo]:
        rows = await self._page(
            self._r(),
            "SELECT checkpoint_id, node_id, created_at, size, version FROM checkpoints"
            " WHERE session_id = ? AND version > ? ORDER BY version",
            (session_id, after_version),
            max_bytes,
        )
        return repage(rows, [
            CheckpointInfo(checkpoint_id=r[0], node_id=r[1], created_at=r[2], size=r[3],
                           version=r[4])
            for r in rows
        ])

    async def counts(self) -> tuple[int, int]:
        """Return (sessions, events), counted from the views."""
        row = await self._one(
            self._r(), "SELECT COUNT(*), COALESCE(SUM(version), 0) FROM sessions"
        )
        return int(row[0]), int(row[1])

    async def session_totals(self, column: str) -> list[tuple[Any, int, int, int, float]]:
        """Per value of an indexed sessions column (status, namespace, actor_name): sessions,
        input tokens, output tokens, cost. One GROUP BY over the views, never the events.
        TOTAL, not SUM: each session's counts fit int64, their sum across sessions may not
        (SUM would raise "integer overflow"); a gauge is a float anyway."""
        if column not in ("status", "namespace", "actor_name"):
            raise ValueError(f"not a grouping column: {column}")
        try:
            rows = await self._all(self._r(), (
                f"SELECT {column}, COUNT(*), TOTAL(input_tokens), TOTAL(output_tokens),"
                f" TOTAL(estimated_cost) FROM sessions GROUP BY {column}"))
        except sqlite3.Error as exc:
            raise _storage_error(exc) from exc
        return [(r[0], int(r[1]), int(r[2]), int(r[3]), float(r[4])) for r in rows]

    def db_bytes(self) -> int:
        """The database's bytes on disk, its WAL included (as max_db_bytes counts them)."""
        return self._file_bytes()


@dataclass(frozen=True, slots=True)
class SessionFilters:
    """What session.list may filter on; None means any."""

    namespace: str | None = None
    statuses: tuple[str, ...] = ()
    actor_name: str | None = None
    source: str | None = None
    created_after: str | None = None
    created_before: str | None = None


def list_sessions_sql(f: SessionFilters, limit: int, cursor: str | None) -> tuple[str, tuple[Any, ...]]:
    """The session.list query: newest first, resumed after the cursor's (created_at, id)."""
    where: list[str] = []
    args: list[Any] = []
    for column, value in (("namespace", f.namespace), ("actor_name", f.actor_name),
                          ("source", f.source)):
        if value is not None:
            where.append(f"{column} = ?")
            args.append(value)
    if f.statuses:
        where.append(f"status IN ({', '.join('?' * len(f.statuses))})")
        args.extend(f.statuses)
    if f.created_after is not None:
        where.append("created_at > ?")
        args.append(f.created_after)
    if f.created_before is not None:
        where.append("created_at < ?")
        args.append(f.created_before)
    if cursor is not None:
        where.append("(created_at, session_id) < (?, ?)")
        args.extend(_decode_cursor(cursor))
    sql = (
        "SELECT session_id, status, namespace, actor_name, task, created_at, updated_at,"
        " message_count, input_tokens, output_tokens, estimated_cost FROM sessions"
        + (" WHERE " + " AND ".join(where) if where else "")
        + " ORDER BY created_at DESC, session_id DESC LIMIT ?"
    )
    return sql, (*args, limit)


def _index_graph_event(db: sqlite3.Connection, e: Event) -> None:
    """Keep the graph_* indexes in step with one graph.* event."""
    d, sid = e.data, e.session_id
    if e.type == "graph.checkpoint":
        run_id = d.get("metadata", {}).get("run_id")
        db.execute("INSERT OR REPLACE INTO graph_checkpoints (session_id, ns, checkpoint_id,"
                   " run_id, position) VALUES (?, ?, ?, ?, ?)",
                   (sid, d.get("ns", ""), d["checkpoint_id"],
                    run_id if isinstance(run_id, str) else None, e.position))
        db.executemany("INSERT OR REPLACE INTO graph_blobs (session_id, ns, channel, version,"
                       " position) VALUES (?, ?, ?, ?, ?)",
                       [(sid, d.get("ns", ""), channel, d["channel_versions"][channel], e.position)
                        for channel in d.get("blobs", {})])
    elif e.type == "graph.writes":
        # A repeated (task, idx) keeps the first write, except for the special channels
        # (negative idx: errors, interrupts), where the latest wins, as LangGraph's savers do.
        for item, w in enumerate(d["writes"]):
            verb = "INSERT OR REPLACE" if w["idx"] < 0 else "INSERT OR IGNORE"
            db.execute(f"{verb} INTO graph_writes (session_id, ns, checkpoint_id, task_id, idx,"
                       " position, item) VALUES (?, ?, ?, ?, ?, ?, ?)",
                       (sid, d.get("ns", ""), d["checkpoint_id"], d["task_id"], w["idx"],
                        e.position, item))
    elif e.type == "graph.pruned":
        for ns, checkpoint_id in d["checkpoints"]:
            for table in ("graph_checkpoints", "graph_writes"):
                db.execute(f"DELETE FROM {table} WHERE session_id = ? AND ns = ?"
                           " AND checkpoint_id = ?", (sid, ns, checkpoint_id))


def _index_scoped_state(db: sqlite3.Connection, e: Event) -> None:
    """App and user keys of a state.updated event (session keys live in the view)."""
    d = e.data
    if d["scope"] == "session":
        return
    user = d["user_id"] if d["scope"] == "user" else ""  # '' is the app's own state
    db.executemany("INSERT OR REPLACE INTO scoped_state (app_name, user_id, key, value,"
                   " position) VALUES (?, ?, ?, ?, ?)",
                   [(d["app_name"], user, k, _json.encode(v), e.position)
                    for k, v in d["delta"].items()])


def _insert_messages(db: sqlite3.Connection, rows: list[tuple[str, int, int]]) -> None:
    if rows:
        db.executemany("INSERT INTO messages (session_id, sequence, position) VALUES (?, ?, ?)",
                       rows)


def messages_page_sql(descending: bool) -> str:
    """The page query of message.list: a range on the (session_id, sequence) key, then LIMIT."""
    op, order = ("<=", "DESC") if descending else (">=", "ASC")
    return (
        "SELECT e.data, e.recorded_at FROM messages m JOIN events e ON e.position = m.position"
        f" WHERE m.session_id = ? AND m.sequence {op} ? ORDER BY m.sequence {order} LIMIT ?"
    )


def _view_row(entry: Entry) -> tuple[Any, ...]:
    s = entry.state
    u = s.token_usage
    return (
        s.session_id, s.version, s.status, s.namespace, s.actor_name, s.source, s.task,
        s.timestamps.created_at, s.timestamps.updated_at, s.message_count, u.input_tokens,
        u.output_tokens, u.estimated_cost, entry.last_position, entry.last_hash, _json.encode(s),
    )


# The columns _event_from_row reads, in its order.
_EVENT_COLUMNS: Final = (
    "position, session_id, version, event_id, type, schema_version, recorded_at, data, meta, hash")


def _event_from_row(r: Any) -> Event:
    return Event(
        position=r[0], session_id=r[1], version=r[2], event_id=r[3], type=r[4],
        schema_version=r[5], recorded_at=r[6], data=_dict_decoder.decode(r[7]),
        meta=_meta_decoder.decode(r[8]), hash=r[9],
    )


def repage(rows: Page[Any], items: list[T]) -> Page[T]:
    """`items` made from `rows`, as a page cut where the rows were."""
    page: Page[T] = Page(items)
    page.cut = rows.cut
    return page


def _encode_cursor(created_at: str, session_id: str) -> str:
    return base64.urlsafe_b64encode(_json.encode([created_at, session_id])).decode()


def _decode_cursor(cursor: str) -> tuple[str, str]:
    try:
        created_at, session_id = msgspec.json.decode(
            base64.urlsafe_b64decode(cursor.encode()), type=tuple[str, str]
        )
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidParamsError(
            "`cursor` is not a cursor this daemon returned", {"detail": str(exc), "path": "$.cursor"}
        ) from exc
    return created_at, session_id
