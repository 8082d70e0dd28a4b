"""The SQLite store: opening and migrating the file, the writer's batch commit, and the
reads of the log. It implements `stores.interface.Store`: the read models it keeps in the
commit are the rules' row operations (stores/models), run by executor.py; their reads are
stores/models/queries.py's; the views are sessions.py's; the search index is search.py's (the
full_text capability), kept just after the commits (INDEX_LAG_EVENTS).

The write connection is a plain sqlite3 connection living on one thread of its own
(`WriterThread`), so a whole batch transaction is one thread hop; aiosqlite would make it
one hop per statement (measured ~150 us each here). Reads use aiosqlite.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import sqlite3
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import aiosqlite
import anyio
import msgspec
import structlog

from sessiond_daemon import host
from sessiond_daemon.stores import models
from sessiond_daemon.stores.interface import Batch, Capabilities, Entry, Moved, Page, repage
from sessiond_daemon.stores.models.queries import ModelQueries
from sessiond_daemon.stores.models.search_text import INDEXED, search_rows
from sessiond_daemon.stores.models.views import state_decoder
from sessiond_daemon.stores.rows import EVENT_COLUMNS, event_from_row
from sessiond_daemon.stores.schema import SchemaRefused
from sessiond_daemon.stores.sqlite import executor, migrations, preconditions, search, sessions
from sessiond_daemon.stores.sqlite.agents import AgentReads
from sessiond_daemon.stores.sqlite.base import encode_meta, marks, storage_error
from sessiond_daemon.stores.sqlite.sessions import SessionViews
from sessiond_schemas.errors import StorageError
from sessiond_schemas.events import Event

log = structlog.get_logger("sessiond.store")
T = TypeVar("T")

# A deleted session's rows that are the log's (the read models' go by their ops first).
_LOG_TABLES = ("idempotency", "snapshots")

# Positions are never handed out twice (docs/protocol.md). The last one handed out is the
# newest event's, unless the sessions holding the newest events were deleted: then the
# delete left it in meta (only such a commit writes it, so an append costs nothing more).
_NEWEST = "SELECT COALESCE(MAX(position), 0) FROM events"
# The search index follows the log: a commit leaves its full-text rows out (FTS5 wrote a
# segment, its structure record and a size row, about 3 of a one-event commit's 8 WAL
# pages, each time), and the store indexes every event the commits left, a transaction
# per INDEX_RANGE positions, once INDEX_LAG_EVENTS indexed events wait or INDEX_LAG_S
# after the first of them (the writer runs it between batches), and before anything
# reads the index (`catch_up`: a search, verify, reindex's count), so a search still
# sees every acknowledged write. `meta` keeps the position up to which the index holds
# every event; after a crash, what lies past it is indexed as it would have been, 0.2 s
# after the open or by the first read of the index (bench/README: "The search index
# follows the log").
# A catch-up step (one transaction; the writer's batches go between steps) is bounded
# by positions, bytes and time: it indexes pieces of at most INDEX_PIECE_BYTES of events
# (or one larger event), a statement each, and takes no further piece once
# INDEX_STEP_BYTES are indexed or INDEX_STEP_S have passed. So a write waits behind at
# most INDEX_STEP_S plus one piece (issue 45 §6: by positions alone, one step took
# 7 x 16 MiB and every writer waited 15 s); docs/reliability.md, "Budgets".
INDEX_LAG_EVENTS = 256
INDEX_LAG_S = 0.2
INDEX_RANGE = 10_000  # positions per catch-up transaction, at most
INDEX_STEP_BYTES = 4 << 20
INDEX_PIECE_BYTES = 256 << 10
INDEX_STEP_S = 0.05
INDEX_RETRY_MAX_S = 5.0  # a failing catch-up is tried again after INDEX_LAG_S, doubling
_COMMIT_RULES = tuple(r for r in models.RULES if r is not search_rows)
_HIGH_WATER = "position_high_water"


def head(db: sqlite3.Connection) -> int:
    """The last position this database handed out (0: none)."""
    return int(db.execute(
        f"SELECT MAX(({_NEWEST}), COALESCE((SELECT CAST(value AS INTEGER) FROM meta"
        " WHERE key = ?), 0))", (_HIGH_WATER,)).fetchone()[0])


class WriterThread:
    """The write connection's thread: runs one call at a time, in the order given.

    Cheaper than `run_in_executor` on a one-worker pool, which wraps each call in a
    concurrent future, a work item and an asyncio future chained to it: here a call is one
    `SimpleQueue.put` out and one `call_soon_threadsafe` back (bench/README: "CPU per
    append"). A cancelled caller stops waiting; the call still runs to its end.
    """

    def __init__(self) -> None:
        self._calls: queue.SimpleQueue[tuple[Any, ...] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._run, name="sessiond-writer", daemon=True)
        self._thread.start()

    def call(self, fn: Callable[..., T], *args: Any) -> asyncio.Future[T]:
        loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self._calls.put((loop, future, fn, args))
        return future

    def _run(self) -> None:
        while (item := self._calls.get()) is not None:
            loop, future, fn, args = item
            try:
                outcome, failed = fn(*args), False
            except BaseException as exc:  # handed to the caller, as run_in_executor does
                outcome, failed = exc, True
            with contextlib.suppress(RuntimeError):  # a closed loop: nobody waits any more
                loop.call_soon_threadsafe(_settle, future, outcome, failed)
            del item, future, outcome

    def shutdown(self) -> None:
        """Run what is queued, then end the thread."""
        self._calls.put(None)
        self._thread.join()


def _settle(future: asyncio.Future[Any], outcome: Any, failed: bool) -> None:
    if future.cancelled():
        return
    if failed:
        future.set_exception(outcome)
    else:
        future.set_result(outcome)


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


class SqliteStore(SessionViews, AgentReads, ModelQueries):
    """The write connection (only the writer task uses it) and a few read connections."""

    def __init__(self, path: str, durability: str = "full", readers: int = 2,
                 max_bytes: int = 0) -> None:
        super().__init__(readers)
        self.path = path
        self.synchronous = "FULL" if durability == "full" else "NORMAL"
        self.max_bytes = max_bytes  # 0: no cap; else writes past it fail with "disk full"
        self._pool: WriterThread | None = None
        self._con: sqlite3.Connection | None = None
        self._identity: tuple[int, int] = (0, 0)  # (st_dev, st_ino) of the file we opened
        self._lost: str | None = None  # why the file at self.path is no longer ours
        self.schema_version = 0
        self.migrated: list[int] = []  # the migrations this open applied
        self.last_commit_s = 0.0  # seconds the last commit took, fsync and thread hop included
        # The search index's lag (INDEX_LAG_EVENTS), kept where the connection is used:
        # the position up to which it holds every event, the last committed one, the
        # indexed events between, and when the first of them was committed.
        self._indexed_upto = 0
        self._head = 0
        self._unindexed = 0
        self._lag_since: float | None = None
        self._retry_at = 0.0  # after a failed catch-up: when to try again, and why it failed
        self._index_error = StorageError("storage error: the search index is behind")
        self._failures = 0  # the catch-ups failed in a row
        # The search lane: a read connection for session.search alone (search.FullText).
        self._lane: aiosqlite.Connection | None = None
        self._full_text = search.FullText(self, self.catch_up, self.on_search_lane)

    @property
    def capabilities(self) -> Capabilities:
        return Capabilities(engine="sqlite", integrity=self, backup=self, size=self,
                            full_text=self._full_text)

    # --- lifecycle -------------------------------------------------------------------

    async def open(self) -> None:
        """Open the database, switch it to WAL and run pending migrations."""
        host.make_private_dirs(os.path.dirname(os.path.abspath(self.path)))
        # SQLite gives -wal and -shm the database file's mode: 0600 covers all three.
        host.create_private_file(self.path)
        self._pool = WriterThread()
        try:
            synchronous = await self._on_writer(self._open_writer)
            self._readers = [
                await _connect(self.path, self.synchronous, query_only=True)
                for _ in range(self._reader_count)
            ]
            self._lane = await _connect(self.path, self.synchronous, query_only=True)
        except SchemaRefused:
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
        if self._lane is not None:
            await self._lane.close()
            self._lane = None
        if self._pool is not None:
            await self._on_writer(self._close_writer)
            self._pool.shutdown()
            self._pool = None

    async def _on_writer(self, fn: Callable[..., T], *args: Any) -> T:
        """Run `fn` on the write connection's thread."""
        assert self._pool is not None, "store is not open"
        return await self._pool.call(fn, *args)

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
        row = con.execute("SELECT value FROM meta WHERE key = ?",
                          (migrations.INDEXED_UPTO,)).fetchone()
        self._indexed_upto = int(row[0]) if row is not None else 0
        self._head = head(con)
        if self._behind():
            self._lag_since = time.monotonic()  # what a crash left: indexed when due
        st = os.stat(self.path)
        self._identity = (st.st_dev, st.st_ino)
        self._lost = None
        return int(con.execute("PRAGMA synchronous").fetchone()[0])

    def _check_identity(self, *, look: bool = True) -> None:
        """Refuse to go on once the file at our path is not the one we have open.

        Writes into a deleted or replaced file would be acknowledged and then gone
        at the next start; from the first sign of it every commit is refused. With
        `look=False` only a loss seen before is refused (no `os.stat`): the commit
        looks once, after its COMMIT and before anyone is answered, which covers a
        file lost before the transaction as well as during it.
        """
        if self._lost is None and look:
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
            with contextlib.suppress(OSError):
                total += os.stat(self.path + suffix).st_size
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
        try:  # what is left: a stopping daemon's last commits, all that `migrate` wrote
            self._catch_up_now()
        except Exception as exc:  # the next open's writer catches up
            log.warning("store.catch_up_failed", error=str(exc))
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

    async def last_position(self) -> int:
        return await self._on_writer(lambda: head(self._w))

    async def load_entry(self, session_id: str) -> Entry | None:
        row = await self._on_writer(lambda: self._w.execute(
            "SELECT state, last_hash, last_position FROM sessions WHERE session_id = ?",
            (session_id,)).fetchone())
        if row is None:
            return None
        return Entry(state_decoder.decode(row[0]), row[1], row[2])

    async def sessions_behind(self) -> list[str]:
        """Sessions whose events go past their stored view (or that have no view): rows
        written behind the daemon's back. One walk of the (session_id, version) index."""
        return await self._on_writer(lambda: [r[0] for r in self._w.execute(
            "SELECT e.session_id FROM (SELECT session_id, MAX(version) AS v FROM events"
            " GROUP BY session_id) e LEFT JOIN sessions s ON s.session_id = e.session_id"
            " WHERE s.version IS NULL OR s.version < e.v")])

    async def idempotent_results(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        """The stored first results of these (session_id, idempotency_key) pairs, in one hop.

        A stored result is an acknowledgement: none is given from a file that is no longer
        at our path (the retry of a write that landed in a deleted file would be answered
        with that write's result, and the write lost at the next start)."""
        return await self._on_writer(self._idempotent_rows, keys)

    def _idempotent_rows(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        self._check_identity()
        found = {}
        for start in range(0, len(keys), 400):
            chunk = keys[start:start + 400]
            pairs = ", ".join("(?, ?)" for _ in chunk)
            for sid, key, result in self._w.execute(
                    "SELECT session_id, key, result FROM idempotency WHERE (session_id, key)"
                    f" IN (VALUES {pairs})", [x for pair in chunk for x in pair]):
                found[(sid, key)] = bytes(result)
        return found

    async def prefetch(
        self, session_ids: list[str], keys: list[tuple[str, str]],
    ) -> tuple[dict[str, Entry | None], dict[tuple[str, str], bytes]]:
        """The views of these sessions and the results of these keys, in one hop (a batch
        of sessions not in the writer's cache was a hop each)."""
        def read() -> tuple[dict[str, Entry | None], dict[tuple[str, str], bytes]]:
            results = self._idempotent_rows(keys) if keys else {}
            views: dict[str, Entry | None] = dict.fromkeys(session_ids)
            for start in range(0, len(session_ids), 500):
                chunk = session_ids[start:start + 500]
                for sid, state, last_hash, last_position in self._w.execute(
                        "SELECT session_id, state, last_hash, last_position FROM sessions"
                        f" WHERE session_id IN ({marks(len(chunk))})", chunk):
                    try:
                        views[sid] = Entry(state_decoder.decode(state), last_hash,
                                           last_position)
                    except (msgspec.DecodeError, msgspec.ValidationError):
                        del views[sid]  # load_entry reports it, and the writer rebuilds it
            return views, results
        return await self._on_writer(read)

    async def idempotency_page(self, session_id: str, after: str,
                               limit: int) -> list[tuple[str, bytes]]:
        rows = await self._all("SELECT key, result FROM idempotency WHERE session_id = ?"
                               " AND key > ? ORDER BY key LIMIT ?", (session_id, after, limit))
        return [(r[0], bytes(r[1])) for r in rows]

    async def commit(self, batch: Batch) -> Moved | None:
        """Write a whole batch in one transaction (one fsync), or nothing of it. No session
        is ever stale (the file lock, host.DatabaseLock, makes the writer the only one):
        `Moved` only says which preconditions do not hold, and then nothing is written."""
        started = time.perf_counter()
        try:
            moved = await self._on_writer(self._commit, batch)
        except sqlite3.IntegrityError as exc:
            # The writer decides versions and ids alone, so this is a bug, not a race.
            log.error("store.integrity_error", error=str(exc))
            raise storage_error(exc) from exc
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc
        self.last_commit_s = time.perf_counter() - started  # what the writer waited for
        return moved

    def _commit(self, batch: Batch) -> Moved | None:
        con = self._w
        self._check_identity(look=False)
        self._keep_under_cap(before_commit=True)
        con.execute("BEGIN IMMEDIATE")
        try:
            if batch.requires:
                refused = preconditions.refused(con, batch)
                if refused:
                    con.execute("ROLLBACK")
                    return Moved(frozenset(), head(con), refused)
            self._write(con, batch)
            con.execute("COMMIT")
        except BaseException:
            if con.in_transaction:
                con.execute("ROLLBACK")
            raise
        if batch.events:
            self._head = batch.events[-1].position
            indexed = sum(1 for e in batch.events if e.type in INDEXED)
            if indexed:
                self._unindexed += indexed
                if self._lag_since is None:
                    self._lag_since = time.monotonic()
        # Before anyone is answered: was that the file at our path?
        self._check_identity()
        try:
            self._keep_under_cap(before_commit=False)
        except sqlite3.Error as exc:  # committed already: the next commit tries again
            log.warning("store.checkpoint_failed", error=str(exc))
        return None

    @staticmethod
    def _write(db: sqlite3.Connection, batch: Batch) -> None:
        top = head(db) if batch.deletes else 0
        if batch.deletes:
            # The read models first: the pages they free make room for the search index's
            # delete markers (FTS5 writes them) in a database at max_db_bytes.
            executor.run(db, models.forget(batch.deletes))
        for sid in batch.deletes:
            for table in _LOG_TABLES:
                db.execute(f"DELETE FROM {table} WHERE session_id = ?", (sid,))
            search.forget_session(db, sid)  # reads the session's events
            db.execute("DELETE FROM events WHERE session_id = ?", (sid,))
            db.execute("DELETE FROM sessions WHERE session_id = ?", (sid,))
        if batch.events:
            db.executemany(
                "INSERT INTO events (position, session_id, version, event_id, type,"
                " schema_version, recorded_at, data, meta, hash)"
                " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                [
                    (e.position, e.session_id, e.version, e.event_id, e.type, e.schema_version,
                     e.recorded_at, e.data_json, encode_meta(e.meta), e.hash)
                    for e in batch.events
                ],
            )
            executor.run(db, models.ops_of(batch.events, batch.payloads, _COMMIT_RULES))
        sessions.write_views(db, batch)
        if batch.idempotency:
            db.executemany(
                "INSERT INTO idempotency (session_id, key, result) VALUES (?, ?, ?)",
                batch.idempotency,
            )
        if top and int(db.execute(_NEWEST).fetchone()[0]) < top:  # the newest went
            db.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                       (_HIGH_WATER, str(top)))

    # --- the search index's catch-up (INDEX_LAG_EVENTS) --------------------------------

    def deferred_due(self) -> float | None:
        """Seconds until the index's catch-up is due (0: now), None when it is caught up.
        Also due once INDEX_RANGE positions of events of other types are past the mark, so
        that a scan for what to index never covers more than that. After a failure, not
        before its back-off has passed (INDEX_RETRY_MAX_S)."""
        now_m = time.monotonic()
        if self._retry_at > now_m:
            return self._retry_at - now_m
        if self._unindexed >= INDEX_LAG_EVENTS or self._behind() >= INDEX_RANGE:
            return 0.0
        since = self._lag_since
        return None if since is None else max(0.0, since + INDEX_LAG_S - now_m)

    async def do_deferred(self) -> None:
        """One range of the index's catch-up, on the writer thread (the writer runs it when
        due, between batches: writes go on between ranges)."""
        since = self._lag_since
        if self._unindexed >= INDEX_LAG_EVENTS or self._behind() >= INDEX_RANGE or (
                since is not None and time.monotonic() >= since + INDEX_LAG_S):
            await self._index_step()

    async def catch_up(self) -> None:
        """Index every event committed so far that the commits left out, a range per hop
        (a read of the index calls this first). After a failure, until the back-off has
        passed (INDEX_RETRY_MAX_S), the failure again without a try."""
        if self._retry_at > time.monotonic():
            raise self._index_error
        target = self._head
        while self._indexed_upto < target:
            await self._index_step()

    def _behind(self) -> int:
        return self._head - self._indexed_upto

    async def _index_step(self) -> None:
        try:
            await self._on_writer(self._catch_up_now, 1)
        except Exception as exc:  # a full disk, say (or a bug): tried again later
            self._failures += 1
            self._retry_at = time.monotonic() + min(
                INDEX_RETRY_MAX_S, INDEX_LAG_S * 2 ** min(self._failures - 1, 16))
            self._index_error = StorageError(
                f"storage error: the search index could not take the latest events: {exc}",
                {"detail": str(exc)})
            if isinstance(exc, sqlite3.Error):
                raise self._index_error from exc
            raise
        self._retry_at, self._failures = 0.0, 0

    def _catch_up_now(self, ranges: int | None = None) -> None:
        """Index the events past the mark, at most `ranges` steps (None: all), a
        transaction each (INDEX_STEP_BYTES, INDEX_STEP_S)."""
        con = self._w
        while self._indexed_upto < self._head and ranges != 0:
            self._keep_under_cap(before_commit=True)  # max_db_bytes holds for the index too
            con.execute("BEGIN IMMEDIATE")
            try:
                upto = self._index_step_now(con)
                con.execute("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)",
                            (migrations.INDEXED_UPTO, str(upto)))
                con.execute("COMMIT")
            except BaseException:
                if con.in_transaction:
                    con.execute("ROLLBACK")
                raise
            self._indexed_upto = upto
            ranges = None if ranges is None else ranges - 1
        if self._indexed_upto >= self._head:
            self._unindexed, self._lag_since = 0, None

    def _index_step_now(self, con: sqlite3.Connection) -> int:
        """One step's pieces, in the open transaction; the position indexed up to."""
        started = time.monotonic()
        after, last, done = self._indexed_upto, min(self._head,
                                                    self._indexed_upto + INDEX_RANGE), 0
        while after < last:
            upto, size = search.piece_end(con, after, last, INDEX_PIECE_BYTES)
            search.index_range(con, after, upto)
            after, done = upto, done + size
            if done >= INDEX_STEP_BYTES or time.monotonic() - started >= INDEX_STEP_S:
                break
        return after

    # --- reads of the log ---------------------------------------------------------------

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
        where: list[str] = []
        args: list[Any] = []
        if session_id is not None:
            where.append("session_id = ? AND version >= ?")
            args.extend((session_id, from_version))
        if after_position:
            where.append("position > ?")
            args.append(after_position)
        if types:
            where.append(f"type IN ({marks(len(types))})")
            args.extend(types)
        order = "version" if session_id is not None else "position"
        rows = await self._page(
            f"SELECT {EVENT_COLUMNS} FROM events"
            + (" WHERE " + " AND ".join(where) if where else "")
            + f" ORDER BY {order} LIMIT ?",
            (*args, limit), max_bytes)
        return repage(rows, [event_from_row(r) for r in rows])

    async def read_after(self, after: int, upto: int, session_id: str | None,
                         types: frozenset[str] | None, limit: int) -> list[Event]:
        """Events with after < position <= upto, in position order (what subscribers read)."""
        where = ["position > ? AND position <= ?"]
        args: list[Any] = [after, upto]
        if session_id is not None:
            where.append("session_id = ?")
            args.append(session_id)
        if types:
            where.append(f"type IN ({marks(len(types))})")
            args.extend(sorted(types))
        rows = await self._all(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE {' AND '.join(where)}"
            " ORDER BY position LIMIT ?", (*args, limit))
        return [event_from_row(r) for r in rows]

    async def first_position(self, session_id: str, from_version: int) -> int | None:
        """Position of a session's first event at or after `from_version`."""
        row = await self._one(
            "SELECT position FROM events WHERE session_id = ? AND version >= ?"
            " ORDER BY version LIMIT 1", (session_id, from_version))
        return int(row[0]) if row else None

    async def foreign_event_ids(self, session_id: str, event_ids: list[str]) -> list[str]:
        """Which of these event ids another session already holds."""
        found: list[str] = []
        for i in range(0, len(event_ids), 500):
            chunk = event_ids[i:i + 500]
            rows = await self._all(
                f"SELECT event_id FROM events WHERE event_id IN ({marks(len(chunk))})"
                " AND session_id != ?", (*chunk, session_id))
            found += [r[0] for r in rows]
        return found

    # --- capabilities: integrity, backup, size, SQL access --------------------------------

    async def integrity_check(self) -> list[str]:
        """SQLite's own check of the file: ["ok"] when sound."""
        return [r[0] for r in await self._all("PRAGMA integrity_check")]

    async def db_bytes(self) -> int:
        """The database's bytes on disk, its WAL included (as max_db_bytes counts them)."""
        return self._file_bytes()


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
                position = dest.execute(
                    "SELECT COALESCE(MAX(position), 0) FROM events").fetchone()[0]
            finally:
                dest.close()
                source.close()
            return os.path.getsize(target), int(position)

        try:
            return await anyio.to_thread.run_sync(copy)
        except sqlite3.Error as exc:
            raise storage_error(exc) from exc

    async def on_search_lane(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        """Run `fn` on the search lane's connection, on its thread (search.FullText)."""
        assert self._lane is not None, "store is not open"
        return await self._on_connection(self._lane, fn)

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
            raise storage_error(exc) from exc

