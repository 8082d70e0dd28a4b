"""The PostgreSQL store: the SqliteStore surface over one database that many daemons share.

One batch is one transaction on the writer's connection:
1. every session the batch touches is locked (`SELECT … FOR UPDATE`, in session_id
   order, so two hosts never deadlock) and its stored version compared with the one
   the writer decided from (`batch.bases`; a session the batch deletes too, since a
   delete may carry an expected_version); an idempotency key another host stored
   first counts too. Those sessions come back as `Moved.stale` and nothing is written:
   the writer reloads them and decides again;
2. deletes, views (a session the writer thought new but another host created is
   stale), snapshots: nothing that holds a position;
3. then the positions: one statement moves the counter row (`UPDATE log_head SET
   position = position + n RETURNING position`), inserts the events numbered from it
   and queues one NOTIFY. The writer's numbering is only provisional: the batch is
   renumbered (`Batch.renumber`), and the writer rebuilds the results that quote
   positions, inside the transaction; then the read models (the rules' row operations,
   stores/models, built before the positions were taken and shifted to them by
   executor.py) and the idempotency results; then COMMIT. The counter's row
   lock orders commits, so positions are gapless and in commit order: a reader of
   `position > cursor` never skips an event that commits late, and a rollback gives its
   positions back (Commanded EventStore's design; a sequence or bigserial would leave
   holes and commit out of order). Another host committing first never refuses a batch:
   only a stale session or key does.
"""

from __future__ import annotations

import contextlib
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, Final

import asyncpg
import msgspec
import structlog

from sessiond_daemon.stores import models
from sessiond_daemon.stores.interface import (
    Batch,
    Capabilities,
    Entry,
    Following,
    Moved,
    Precondition,
    Store,
)
from sessiond_daemon.stores.models.ops import Op
from sessiond_daemon.stores.postgres import executor, onecall, preconditions, schema, search
from sessiond_daemon.stores.postgres.dsn import redact
from sessiond_daemon.stores.postgres.errors import RETRYABLE, storage_error
from sessiond_daemon.stores.postgres.models import ModelReads
from sessiond_daemon.stores.schema import LOG_TABLES, SchemaTooNew
from sessiond_schemas.errors import StorageError
from sessiond_schemas.events import Event, new_id

log = structlog.get_logger("sessiond.store")

# A read that has not answered in this long is on a dead connection (a half-open one
# after a failover, say): it fails, retryable, instead of hanging its request.
READ_TIMEOUT_S = 60.0

CHANNEL: Final = "sessiond_events"  # the NOTIFY channel; the payload is a hint only
_json = msgspec.json.Encoder()


async def _kept_as_is(con: Any) -> None:
    """The read pool's reset on release: nothing past what asyncpg always does (roll back
    an open transaction, drop listeners). The readers set no session state (no SET, no
    LISTEN, no advisory lock, no cursor outlives its transaction), so asyncpg's default
    reset query (`pg_advisory_unlock_all(); CLOSE ALL; UNLISTEN *; RESET ALL`), one more
    round trip on every release, would restore nothing (with it a pooled read took 2x
    the wall time and 1.7x the daemon's CPU: bench/README.md, "The read pool's reset")."""


class _Abort(Exception):
    """Roll the batch's transaction back and answer `stale`."""

    def __init__(self, stale: Sequence[str] = (),
                 refused: Mapping[Precondition, int] | None = None) -> None:
        self.stale = frozenset(stale)
        self.refused = dict(refused or {})


def bases(batch: Batch) -> dict[str, int]:
    """The version each touched session had when the writer decided the batch (0: none):
    `batch.bases` when the writer says, else the one before each session's first event
    here (0 before a session's first), or its view's."""
    if batch.bases:
        return dict(batch.bases)
    expected: dict[str, int] = {}
    for e in batch.events:  # a fork's first event is at the source's version + 1
        new = e.type in ("session.created", "session.forked")
        expected.setdefault(e.session_id, 0 if new else e.version - 1)
    for sid, entry in batch.views.items():
        expected.setdefault(sid, entry.state.version)
    return expected


_LOCK: Final = ("SELECT session_id, version FROM sessions WHERE session_id = ANY($1::text[])"
                " ORDER BY session_id FOR UPDATE")
_VIEWS: Final = """
    INSERT INTO sessions (session_id, version, status, namespace, actor_name, source, task,
        created_at, updated_at, message_count, input_tokens, output_tokens, estimated_cost,
        last_hash, host, state, expires_at)
    SELECT v.sid, v.ver, v.st, v.ns, v.actor, v.src, v.task, v.created, v.updated, v.mc,
        v.inp, v.outp, v.cost, v.hash, $15, v.state, v.exp
    FROM unnest($1::text[], $2::bigint[], $3::text[], $4::text[], $5::text[], $6::text[],
        $7::text[], $8::text[], $9::text[], $10::bigint[], $11::bigint[], $12::bigint[],
        $13::float8[], $14::text[], $16::bytea[], $17::text[])
        AS v(sid, ver, st, ns, actor, src, task, created, updated, mc, inp, outp, cost, hash,
             state, exp)
    ON CONFLICT (session_id) DO UPDATE SET version = excluded.version,
        status = excluded.status, namespace = excluded.namespace,
        actor_name = excluded.actor_name, source = excluded.source, task = excluded.task,
        created_at = excluded.created_at, updated_at = excluded.updated_at,
        message_count = excluded.message_count, input_tokens = excluded.input_tokens,
        output_tokens = excluded.output_tokens, estimated_cost = excluded.estimated_cost,
        last_hash = excluded.last_hash, state = excluded.state,
        expires_at = excluded.expires_at
    RETURNING session_id, xmax = 0 AS inserted"""
_KEYS: Final = ("SELECT i.session_id FROM idempotency i JOIN unnest($1::text[], $2::text[])"
                " AS k(session_id, key) USING (session_id, key)")
_IDEMPOTENCY: Final = """
    INSERT INTO idempotency (session_id, key, result)
    SELECT * FROM unnest($1::text[], $2::text[], $3::bytea[])"""
# The positions: the counter row moved by the batch's size, the events numbered from it
# in the batch's order, the wake-up; back comes the first position. The row lock is held
# from here to COMMIT, so everything that needs no position comes before.
_EVENTS: Final = """
    WITH head AS (
        UPDATE log_head SET position = position + $1 WHERE id = 1
        RETURNING position, extract(epoch FROM clock_timestamp()) AS locked_at),
    ins AS (
        INSERT INTO events (position, session_id, version, event_id, type, schema_version,
            recorded_at, data, meta, hash)
        SELECT head.position - $1 + e.n, e.sid, e.ver, e.eid, e.typ, e.sv, e.rec, e.dat,
            e.met, e.hsh
        FROM head, unnest($2::text[], $3::bigint[], $4::text[], $5::text[], $6::int[],
            $7::text[], $8::bytea[], $9::bytea[], $10::text[]) WITH ORDINALITY
            AS e(sid, ver, eid, typ, sv, rec, dat, met, hsh, n))
    SELECT position - $1 + 1, locked_at, pg_notify($11, position::text) FROM head"""


class _Counted:
    """The writer's connection as a commit uses it, counting the statements it sends (each
    one round trip) and those sent while the counter row is locked."""

    __slots__ = ("_con", "locked_at", "locked_from", "sent")

    def __init__(self, con: Any) -> None:
        self._con = con
        self.sent = 0
        self.locked_from = 0  # statements sent before the one that moves the counter row
        # When the server took the counter row's lock (its clock, seconds since the epoch;
        # held to COMMIT's answer, taken on this host's clock: the same on one machine).
        self.locked_at = 0.0

    def lock(self) -> None:
        """The next statement moves the counter row: the lock is held from it to COMMIT."""
        self.locked_from = self.sent

    async def fetch(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        return await self._con.fetch(*args, **kwargs)

    async def fetchrow(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        return await self._con.fetchrow(*args, **kwargs)

    async def fetchval(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        return await self._con.fetchval(*args, **kwargs)

    async def execute(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1
        return await self._con.execute(*args, **kwargs)

    async def executemany(self, *args: Any, **kwargs: Any) -> Any:
        self.sent += 1  # one round trip: asyncpg pipelines the rows
        return await self._con.executemany(*args, **kwargs)


# Each deleted session, placed in the log's commit order: after the position the log
# stands at, read under the counter row's lock (no commit moves it until this one is
# done), and the wake-up (a delete-only batch has no events statement to send it).
# A delete's NOTIFY names no new position (the head does not move): its payload is not a
# number, so a listener takes it as a plain wake-up (a round that reads the deletes).
_DELETIONS: Final = """
    WITH head AS (SELECT position FROM log_head WHERE id = 1 FOR UPDATE),
    ins AS (
        INSERT INTO deletions (after_position, session_id, origin)
        SELECT head.position, d.sid, $2 FROM head, unnest($1::text[]) AS d(sid)
        ON CONFLICT DO NOTHING)
    SELECT pg_notify($3, 'deleted ' || position) FROM head"""


class PostgresStore(ModelReads):
    """The writer's connection (only the writer task uses it) and a pool for reads."""

    def __init__(self, url: str, *, password: str | None = None, readers: int = 2,
                 host_name: str | None = None, connect_timeout_s: float = 5.0,
                 statement_timeout_s: float = 30.0) -> None:
        self.url = url
        self.password = password
        # A server that is down fails a commit after this long, retryable, instead of
        # holding the writer (asyncpg's own default is 60 s).
        self.connect_timeout_s = connect_timeout_s
        self.host_name = host_name
        # Every statement, the writer's and the readers', ends after this long (a lock
        # held from psql, say): the commit fails retryable instead of stopping every write
        # (and the watchdog with them). 0: none.
        # And which schema this code writes: past a newer release's migration, its fence
        # refuses this host's writes (schema.fence).
        self.server_settings = {"statement_timeout": str(int(statement_timeout_s * 1000)),
                                schema.SETTING: str(schema.LATEST)}
        self._reader_count = readers
        self._con: Any = None  # asyncpg.Connection of the writer
        self._pool: Any = None  # asyncpg.Pool of the readers
        self.schema_version = 0
        self.migrated: list[int] = []  # the migrations this open applied
        self.last_commit_s = 0.0
        self.moved = 0  # batches refused because another daemon moved a session
        # Statements run outside a commit, by what ran them ("pool": the readers; "view",
        # "keys", "head": the writer's): a daemon that only writes reads none per write.
        self.reads: Counter[str] = Counter()
        # The commits' own timing since the start (daemon.stats `store_commits`, B12).
        # Commit a batch the function takes in one statement (migration 8, onecall.py).
        self.one_call = True
        self._locked_at = 0.0
        self.figures: dict[str, float] = dict.fromkeys(
            ("commits", "one_call", "events", "round_trips", "locked_round_trips",
             "locked_s", "locked_in_statement_s", "commit_s", "moved"), 0.0)
        # This daemon's mark on the deletes it writes (the `deletions` rows): the follower
        # passes over its own, which the writer's bell has rung already.
        self.origin = new_id()
        self.max_bytes = 0  # no cap (SizeCap): the server's own quotas and disks decide
        self._full_text = search.FullText(self)

    @property
    def capabilities(self) -> Capabilities:
        """Shared by several daemons (their commits followed), its size, and full-text
        search (postgres/search.py); no file to check or copy, no cap."""
        return Capabilities(engine="postgresql", shared=True, shared_log=self, size=self,
                            full_text=self._full_text)

    async def db_bytes(self) -> int:
        """What the store's tables take in the database, their indexes and TOAST included
        (not the rest of the database, which other applications may share): daemon.stats'
        db_bytes. One catalog read, whatever the tables hold."""
        row = await self._one(
            "SELECT COALESCE(SUM(pg_total_relation_size(to_regclass(t))), 0)"
            " FROM unnest($1::text[]) AS t", list(schema.TABLES))
        return int(row[0])

    def following(self, deliver: Callable[[list[Event], int], Awaitable[None]], *,
                  cursor: int, at: Callable[[], int],
                  deleted: Callable[[frozenset[str]], None],
                  on_state: Callable[[bool], None],
                  needed: Callable[[], bool] | None = None) -> Following:
        """The follower of every host's commits (following.py)."""
        from sessiond_daemon.stores.postgres.following import (
            SharedLogFollower,  # listener.py imports our CHANNEL
        )

        return SharedLogFollower(self, self.connect, deliver, cursor=cursor, at=at,
                                 deleted=deleted, on_state=on_state, needed=needed)

    # --- lifecycle -------------------------------------------------------------------

    async def connect(self) -> Any:
        """A new connection to the database (the listener opens its own with this)."""
        return await asyncpg.connect(self.url, password=self.password,
                                     timeout=self.connect_timeout_s,
                                     server_settings=self.server_settings)

    async def open(self) -> None:
        """Connect, run pending migrations under the advisory lock, open the read pool."""
        try:
            self._con = await self.connect()
            # A migration may rebuild an index of every event: no statement timeout for it.
            await self._con.execute("SET statement_timeout = 0")
            self.migrated = await schema.migrate(self._con, redact(self.url))
            await self._con.execute("RESET statement_timeout")
            self.schema_version = await schema.schema_version(self._con)
            self._pool = await asyncpg.create_pool(
                self.url, password=self.password, min_size=1, max_size=self._reader_count,
                timeout=self.connect_timeout_s, command_timeout=READ_TIMEOUT_S,
                server_settings=self.server_settings, reset=_kept_as_is)
        except SchemaTooNew:
            await self.close()
            raise
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            await self.close()
            raise StorageError(f"cannot open database {redact(self.url)}: {exc}",
                               {"detail": str(exc),
                                "retryable": isinstance(exc, RETRYABLE)}) from exc
        log.info("store.opened", db=redact(self.url), schema_version=self.schema_version,
                 migrated=self.migrated)

    async def close(self) -> None:
        if self._pool is not None:
            await self._pool.close()
            self._pool = None
        if self._con is not None:
            await self._con.close()
            self._con = None

    async def _writer(self) -> Any:
        """The writer's connection, opened again if the last one was lost."""
        if self._con is None or self._con.is_closed():
            self._con = await self.connect()
        return self._con

    def _drop_writer(self) -> None:
        """After a connection failure: the next use opens a new connection (the old one's
        protocol state may still think a statement runs on it)."""
        con, self._con = self._con, None
        if con is not None:
            con.terminate()

    async def _run(self, fn: Any) -> Any:
        """Run `fn(connection)` on the writer's connection; driver errors become -32012."""
        try:
            return await fn(await self._writer())
        except RETRYABLE as exc:
            self._drop_writer()
            raise storage_error(exc) from exc
        except asyncpg.PostgresError as exc:
            raise storage_error(exc) from exc

    # --- the writer's side -------------------------------------------------------------

    async def last_position(self) -> int:
        """The position of the last committed event (the counter row)."""
        self.reads["head"] += 1
        return int(await self._run(
            lambda c: c.fetchval("SELECT position FROM log_head WHERE id = 1")))

    async def load_entry(self, session_id: str) -> Entry | None:
        self.reads["view"] += 1
        row = await self._run(lambda c: c.fetchrow(
            "SELECT s.state, s.last_hash, (SELECT position FROM events e WHERE"
            " e.session_id = s.session_id ORDER BY version DESC LIMIT 1)"
            " FROM sessions s WHERE s.session_id = $1", session_id))
        if row is None:
            return None
        return Entry(self._state(row[0]), row[1], int(row[2] or 0))

    async def sessions_behind(self) -> list[str]:
        """Sessions whose events go past their stored view (or that have no view)."""
        rows = await self._run(lambda c: c.fetch(
            "SELECT e.session_id FROM (SELECT session_id, MAX(version) AS v FROM events"
            " GROUP BY session_id) e LEFT JOIN sessions s ON s.session_id = e.session_id"
            " WHERE s.version IS NULL OR s.version < e.v"))
        return [r[0] for r in rows]

    def deferred_due(self) -> float | None:
        """Nothing is left out of a commit here: the search index is written in it."""
        return None

    async def do_deferred(self) -> None:
        return None

    async def idempotent_results(self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        """The stored first results of these (session_id, idempotency_key) pairs, from
        whichever daemon stored them."""
        if not keys:
            return {}
        self.reads["keys"] += 1
        rows = await self._run(lambda c: c.fetch(
            "SELECT i.session_id, i.key, i.result FROM idempotency i JOIN unnest($1::text[],"
            " $2::text[]) AS k(session_id, key) USING (session_id, key)",
            [k[0] for k in keys], [k[1] for k in keys]))
        return {(r[0], r[1]): bytes(r[2]) for r in rows}

    async def prefetch(
        self, session_ids: list[str], keys: list[tuple[str, str]],
    ) -> tuple[dict[str, Entry | None], dict[tuple[str, str], bytes]]:
        """The views of these sessions and the results of these keys (the writer of a
        shared store reads its views as it decides, with `load_entry`)."""
        views: dict[str, Entry | None] = {}
        for sid in session_ids:
            with contextlib.suppress(msgspec.DecodeError, msgspec.ValidationError):
                views[sid] = await self.load_entry(sid)
        return views, await self.idempotent_results(keys)

    async def idempotency_page(self, session_id: str, after: str,
                               limit: int) -> list[tuple[str, bytes]]:
        rows = await self._all("SELECT key, result FROM idempotency WHERE session_id = $1"
                               " AND key > $2 ORDER BY key LIMIT $3", session_id, after, limit)
        return [(r[0], bytes(r[1])) for r in rows]

    async def commit(self, batch: Batch) -> Moved | None:
        """Write the whole batch in one transaction, or nothing of it: None when written,
        `Moved` when another daemon wrote first (see the module's docstring)."""
        started = time.perf_counter()
        want = bases(batch)
        # The read models' ops, the documents' tsvectors built too, before any lock is
        # taken; they point at the writer's numbering, which the commit's may shift.
        ops = executor.documents(models.ops_of(batch.events, batch.payloads))
        numbered = batch.events[0].position if batch.events else 0
        args = self._one_call(batch, want, ops, numbered) if self.one_call else None
        try:
            con = await self._writer()
            counted = _Counted(con)
            try:
                if args is not None:
                    moved = await self._call(con, batch, args)
                    if moved is not None:
                        return moved
                    counted.sent, counted.locked_at = -1, self._locked_at  # one, no BEGIN
                else:
                    async with con.transaction():
                        await self._write(counted, batch, want, ops, numbered)
            except _Abort as abort:
                self.moved += 1
                self.figures["moved"] += 1
                return Moved(abort.stale, await self._head(con), abort.refused)
            except asyncpg.UniqueViolationError as exc:
                if exc.constraint_name not in ("events_session_version", "sessions_pkey"):
                    log.error("store.integrity_error", error=str(exc))
                    raise
                # Another daemon created one of these sessions at the same moment.
                self.moved += 1
                self.figures["moved"] += 1
                return Moved(frozenset(sid for sid, v in want.items() if v == 0),
                             await self._head(con))
            except asyncpg.PostgresError as exc:
                if exc.sqlstate != onecall.RACED:
                    raise
                self.moved += 1  # another host created one of the batch's new sessions
                self.figures["moved"] += 1
                return Moved(frozenset(str(exc.detail or "").split(",")),
                             await self._head(con))
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            if isinstance(exc, RETRYABLE):
                self._drop_writer()
            raise storage_error(exc) from exc
        ended = time.perf_counter()
        locked_to = time.time()
        self.last_commit_s = ended - started
        f = self.figures
        f["commits"] += 1
        f["events"] += len(batch.events)
        one = counted.sent < 0
        f["one_call"] += one
        f["round_trips"] += 1 if one else counted.sent + 2  # BEGIN and COMMIT besides
        if counted.locked_at:
            f["locked_round_trips"] += 1 if one else counted.sent - counted.locked_from + 1
            f["locked_s"] += max(0.0, locked_to - counted.locked_at)
        f["commit_s"] += self.last_commit_s
        return None

    def _one_call(self, batch: Batch, want: dict[str, int], ops: list[Op],
                  numbered: int) -> list[Any] | None:
        """The arguments of sessiond_commit for this batch (onecall.py); None when it is
        one the function does not take (deletes, preconditions, ops other than inserts, a
        result that quotes positions without its template: the results are filled after
        the statement, when nothing can be rolled back)."""
        if batch.deletes or batch.requires or not batch.events or not batch.templated or any(
                (sid, key) not in batch.templates for sid, key, _ in batch.idempotency):
            return None
        rows = onecall.ops_json(ops, numbered)
        if rows is None:
            return None
        r_no: list[int] = []
        r_part: list[str] = []
        r_event: list[int | None] = []
        for no, (sid, key, _) in enumerate(batch.idempotency, 1):
            t = batch.templates[(sid, key)]
            r_no += [no] * len(t.parts)
            r_part += t.parts
            r_event += [*t.events, None]
        views = _view_columns(batch.views) if batch.views else [[] for _ in range(16)]
        ev, snaps = batch.events, batch.snapshots
        sids = sorted(want)
        return [
            sids, [want[s] for s in sids],
            [i[0] for i in batch.idempotency], [i[1] for i in batch.idempotency],
            *views[:14], self.host_name, *views[14:],
            [v.session_id for v in snaps], [v.version for v in snaps],
            [_json.encode(v) for v in snaps],
            [e.session_id for e in ev], [e.version for e in ev], [e.event_id for e in ev],
            [e.type for e in ev], [e.schema_version for e in ev], [e.recorded_at for e in ev],
            [e.data_json for e in ev], [_json.encode(e.meta) for e in ev],
            [e.hash for e in ev],
            _json.encode(rows).decode(), r_no, r_part, r_event, CHANNEL]

    async def _call(self, con: Any, batch: Batch, args: list[Any]) -> Moved | None:
        """The batch in one statement: sessiond_commit, its own transaction."""
        first, stale, locked_at, held = await con.fetchrow(onecall.CALL, *args)
        if stale:
            self.moved += 1
            self.figures["moved"] += 1
            return Moved(frozenset(stale), int(first))
        self._locked_at = float(locked_at)
        self.figures["locked_in_statement_s"] += float(held)
        batch.renumber(int(first))  # the results are filled from their templates
        return None

    @staticmethod
    async def _head(con: Any) -> int:
        return int(await con.fetchval("SELECT position FROM log_head WHERE id = 1"))

    async def _write(self, con: _Counted, batch: Batch, want: dict[str, int],
                     ops: list[Op], numbered: int) -> None:
        # The sessions the preconditions name are locked with the touched ones, in one
        # session_id order: a fork (its source) and a delete of it wait for each other.
        named = {p.session_id for _, p in batch.requires}
        touched = sorted({*want, *batch.deletes, *named})
        stored = {r[0]: int(r[1]) for r in await con.fetch(_LOCK, touched)}
        # A delete too is decided from a version (a client's expected_version): checked.
        stale = {sid for sid, version in want.items() if stored.get(sid, 0) != version}
        if batch.idempotency:
            keyed = [i for i in batch.idempotency if i[0] not in batch.deletes]
            stale |= {r[0] for r in await con.fetch(
                _KEYS, [i[0] for i in keyed], [i[1] for i in keyed])}
        refused = await preconditions.refused(con, batch, stored) if batch.requires else {}
        if stale or refused:
            raise _Abort(sorted(stale), refused)
        if batch.deletes:
            await executor.run(con, models.forget(batch.deletes))
            for table in LOG_TABLES:  # the read models' rows went by their ops
                await con.execute(f"DELETE FROM {table} WHERE session_id = ANY($1::text[])",
                                  batch.deletes)
            # After the events: their delete waits for a reindex range that holds them
            # (FOR SHARE) to commit, so this statement sees and takes that range's rows too.
            await search.forget(con, batch.deletes)
        if batch.views:
            new = {sid for sid in batch.views if sid not in stored or sid in batch.deletes}
            columns = _view_columns(batch.views)
            rows = await con.fetch(_VIEWS, *columns[:14], self.host_name, *columns[14:])
            raced = [r[0] for r in rows if r[0] in new and not r[1]]
            if raced:
                raise _Abort(raced)
        if batch.snapshots:
            await con.executemany(
                "INSERT INTO snapshots (session_id, version, state) VALUES ($1, $2, $3)"
                " ON CONFLICT (session_id, version) DO UPDATE SET state = excluded.state",
                [(v.session_id, v.version, _json.encode(v)) for v in batch.snapshots])
        if batch.deletes:  # late: the counter row stays locked from here to COMMIT
            await con.execute(_DELETIONS, sorted(set(batch.deletes)), self.origin, CHANNEL)
        ev = batch.events
        if ev:
            con.lock()
            first, con.locked_at, _ = await con.fetchrow(
                _EVENTS, len(ev), [e.session_id for e in ev], [e.version for e in ev],
                [e.event_id for e in ev], [e.type for e in ev],
                [e.schema_version for e in ev], [e.recorded_at for e in ev],
                [e.data_json for e in ev], [_json.encode(e.meta) for e in ev],
                [e.hash for e in ev], CHANNEL)
            con.locked_at = float(con.locked_at)
            batch.renumber(int(first))  # the writer's results follow (idempotency too)
            await executor.run(con, ops, batch.events[0].position - numbered)
        if batch.idempotency:
            items = batch.idempotency
            await con.execute(_IDEMPOTENCY, [i[0] for i in items], [i[1] for i in items],
                              [i[2] for i in items])


def _view_columns(views: Mapping[str, Entry]) -> list[list[Any]]:
    """The views as the columns of _VIEWS ($1..$14, then $16 and $17: state, expires_at), in
    session_id order (two daemons inserting the same new sessions wait, never deadlock)."""
    rows = []
    for sid in sorted(views):
        entry = views[sid]
        s, u = entry.state, entry.state.token_usage
        rows.append((s.session_id, s.version, s.status, s.namespace, s.actor_name, s.source,
                     s.task, s.timestamps.created_at, s.timestamps.updated_at, s.message_count,
                     u.input_tokens, u.output_tokens, u.estimated_cost, entry.last_hash,
                     _json.encode(s), s.expires_at))
    return [list(column) for column in zip(*rows, strict=True)]


if TYPE_CHECKING:
    def _is_a_store(store: PostgresStore) -> Store:
        """mypy checks here that PostgresStore implements every store Protocol."""
        return store
