"""The single writer: takes queued commands, decides them against current views, group-commits.

Everything that must be decided atomically (next version, status checks,
idempotency, expected_version) is decided here, in one task, against the
views in its cache. One transaction per batch means one fsync per batch.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import TaskStatus

from sessiond_daemon.core import projection
from sessiond_daemon.core.bells import Bell, Followers
from sessiond_daemon.core.histories import Histories, check_import, damaged_error, out_of_bounds
from sessiond_daemon.core.hooks import NO_METRICS, Hooks
from sessiond_daemon.core.redact import Redactor, redact_data, redact_history
from sessiond_daemon.core.window import CommitWindow
from sessiond_daemon.stores.interface import (
    TEMPLATE_MARK,
    TEMPLATE_OTHER,
    Batch,
    Entry,
    EventStore,
    HasNoForks,
    HasVersion,
    Moved,
    Precondition,
    Template,
    template,
)
from sessiond_schemas.bounds import bound_message
from sessiond_schemas.errors import (
    InternalError,
    InvalidParamsError,
    InvalidTransitionError,
    OverloadedError,
    SessiondError,
    SessionImportError,
    SessionNotFoundError,
    ShuttingDownError,
    StorageError,
    VersionConflictError,
)
from sessiond_schemas.events import (
    Event,
    EventData,
    EventMeta,
    SessionCreated,
    SessionForked,
    canonical_json,
    encode_data,
    moved,
    new_id,
    now,
    typed_event,
)
from sessiond_schemas.export import chain_link
from sessiond_schemas.state import SessionState

log = structlog.get_logger("sessiond.writer")

_json = msgspec.json.Encoder()
MAX_MOVES = 8  # decisions of one batch when the store keeps moving under it (other hosts)
# How long a read of a view waits for the commit in flight that changes it (Writer.view)
# before it reads the store instead: a commit takes about a millisecond; one that takes
# longer than this (a stalled disk) leaves the read to the stored view after the wait.
LANDING_WAIT_S = 0.02



@dataclass(frozen=True, slots=True)
class Given:
    """Event data a client (events.append) or an executor gave as JSON: its Struct, and
    the object as given, encoded (unknown fields kept: what is stored), in its order and
    canonically (what is hashed). `commands.given` makes one."""

    data: EventData
    json: bytes
    canonical: bytes


# An event's data in a plan: its type's Struct as a service built it (StatusChanged(...),
# MessageAppended(...)), or Given (the Struct with the JSON it was given as).
PlanData = EventData | Given


@dataclass(slots=True)
class Plan:
    """What a command will write: its events (type, data), and how to build its result."""

    events: Sequence[tuple[str, PlanData]]
    result: Callable[[SessionState, list[Event]], Any]
    payloads: dict[int, bytes] = field(default_factory=dict)  # event index -> checkpoint payload
    # Where each event's data sits in the params, for errors that name a field (-32602);
    # None: the params are the data ("$"), as for tokens.record.
    paths: list[str] | None = None
    # Set when the plan takes out history its forks would share (a trim): the session must
    # have no forks when it commits, checked by the store inside the commit as for a
    # delete; the word says what is refused (-32003 "cannot be trimmed").
    unforked: str | None = None

    def path(self, index: int) -> str:
        return self.paths[index] if self.paths is not None and index < len(self.paths) else "$"

    def requires(self, session_id: str, exists: bool) -> list[Precondition]:
        return [HasNoForks(session_id)] if self.unforked and exists else []

    def refusal(self, p: Precondition, found: int) -> SessiondError:
        assert isinstance(p, HasNoForks) and self.unforked
        return forked_error(p.session_id, found, self.unforked)


def forked_error(session_id: str, forks: int, what: str) -> InvalidTransitionError:
    """A source's history is shared by its forks: it stays while they do (-32003)."""
    return InvalidTransitionError(
        f"session {session_id} cannot be {what}: {forks} fork(s) share its history"
        " (session.forks lists them); delete them first",
        {"session_id": session_id, "forks": forks})


def source_gone(p: HasVersion, found: int) -> str:
    """What happened to a fork's source between the fork's plan and its commit."""
    if found == 0:
        return f"session {p.session_id} was deleted"
    return (f"session {p.session_id}'s history at version {p.version} is not the one read"
            " (it was deleted and created again)")


@dataclass(slots=True)
class Delete:
    """A plan that removes the session entirely. It requires that the session has no
    forks (they share its history): -32003 when it has."""

    result: Any

    def requires(self, session_id: str, exists: bool) -> list[Precondition]:
        return [HasNoForks(session_id)]

    def refusal(self, p: Precondition, found: int) -> SessiondError:
        assert isinstance(p, HasNoForks)
        return forked_error(p.session_id, found, "deleted")


@dataclass(slots=True)
class Import:
    """A plan that stores another daemon's events as they are: ids, versions, times and
    hashes kept, new positions given. With `replace`, the session's old history goes first.

    It requires what it stands on: a history that starts with `session.forked` (a fork,
    or an imported one), its source as the event names it; a replace, that the session
    it replaces has no forks. `source_refused` makes the error when the source is gone
    (default: -32007, as for an import)."""

    events: list[Event]
    payloads: dict[str, bytes]  # checkpoint event_id -> payload
    replace: bool = False
    source_refused: Callable[[HasVersion, int], SessiondError] | None = None

    def requires(self, session_id: str, exists: bool) -> list[Precondition]:
        needs: list[Precondition] = []
        if self.replace and exists:
            needs.append(HasNoForks(session_id))
        first = self.events[0] if self.events else None
        if first is not None and isinstance(first.data, SessionForked):  # else refused
            source = first.data.from_
            needs.append(HasVersion(source.session_id, source.version, source.hash))
        return needs

    def refusal(self, p: Precondition, found: int) -> SessiondError:
        if isinstance(p, HasNoForks):
            return forked_error(p.session_id, found, "replaced by an import")
        if self.source_refused is not None:
            return self.source_refused(p, found)
        reason = (f"its fork source {source_gone(p, found)} before the import was written;"
                  " nothing was written")
        return SessionImportError(f"import failed: {reason}", {"reason": reason})


Planner = Callable[[SessionState | None], Plan | Delete | Import]


@dataclass(slots=True, eq=False)
class Command:
    """One write request waiting for the writer; `done` is set once it is decided."""

    session_id: str
    plan: Planner
    meta: EventMeta
    expected_version: int | None = None
    idempotency_key: str | None = None
    # Resolved (None) once the command is decided: what its submitter awaits. A plain
    # asyncio future, made by `submit` (an anyio Event costs a backend lookup to make).
    done: asyncio.Future[None] | None = None
    # Or, instead of `done`: called (soon after, on the loop) once the command is decided,
    # by a submitter that does not wait (the socket's write lane: serve/server.py). It takes
    # `result` or `error` off the command.
    then: Callable[[Command], None] | None = None
    result: bytes | None = None
    error: SessiondError | None = None


_DELETED = object()


def _release(waiter: asyncio.Future[SessionState | None], view: SessionState | None) -> None:
    if not waiter.done():
        waiter.set_result(view)


def scoped_key(cmd: Command) -> str | None:
    """The command's idempotency key as stored: scoped to the caller's uid ("uid:key"),
    so that one peer's key never answers another's request. (Keys stored before keys were
    scoped were given the daemon owner's uid by the migration that scoped them.)"""
    if cmd.idempotency_key is None:
        return None
    uid = cmd.meta.peer_uid if cmd.meta.peer_uid is not None else os.getuid()
    return f"{uid}:{cmd.idempotency_key}"


@dataclass(slots=True)
class _Built:
    """A command's result that quotes positions: built again if the store renumbers the
    batch (`build` None: a repeat of a key first used in the same batch)."""

    cmd: Command
    key: tuple[str, str] | None
    build: Callable[[SessionState, list[Event]], Any] | None = None
    state: SessionState | None = None
    events: list[Event] = field(default_factory=list)
    template: Template | None = None  # shared stores: the result with its positions open


@dataclass(slots=True)
class _Requirement:
    """A precondition of the batch, with the command whose plan requires it."""

    cmd: Command
    plan: Plan | Delete | Import
    precondition: Precondition


class _BatchFailed(Exception):
    """A batch's commit (or its shared read) failed; `error` is what to answer."""

    def __init__(self, error: SessiondError) -> None:
        super().__init__(error.message)
        self.error = error


class Writer:
    """Owns the write connection; the only code that appends events."""

    def __init__(self, store: EventStore, *, max_queue: int, max_batch: int,
                 cache_size: int, snapshot_every: int = 1000) -> None:
        self.store = store
        self.shared = store.capabilities.shared
        self.max_batch = max_batch
        self.cache_size = cache_size
        self.snapshot_every = snapshot_every
        # The write queue: a deque the callers append to and the writer task takes whole
        # batches from (no memory-object stream: it cost an anyio Event and a backend
        # lookup per command; bench/README, "The writer's queue").
        self.max_queue = max_queue
        self._queue: deque[Command] = deque()
        self._closed = False
        self._wake: asyncio.Future[None] | None = None  # the writer's, while it waits
        self._cache: OrderedDict[str, Entry] = OrderedDict()
        self._committing: frozenset[str] = frozenset()  # the sessions a commit in flight changes
        # Reads waiting for that commit (Writer.view), and the session each reads.
        self._landing: dict[asyncio.Future[SessionState | None], str] = {}
        self._prefetched: dict[str, Entry | None] = {}  # the batch's views read before it
        self.next_position = 1
        # Position of the last committed event (a follower added with no await after
        # reading it is rung every batch past it: core/bells.py).
        self.committed_position = 0
        self.followers = Followers()  # the live ones, called by each ring (core/bells.py)
        # Fleet mode (a store several daemons share): wakes the follower of the shared log
        # (lifecycle), which rings the bells for batches that do not follow on from
        # `committed_position` (another host's events come between); see `deliver`.
        self.wake_follower: Callable[[int], None] | None = None  # given the batch's end
        # Those who follow the bells on this host (subscriptions, HTTP tails: `watch`).
        # While there are none, the shared log is not followed at all: this host's batches
        # are rung even past a gap (nobody holds a bell to miss the events in it).
        self.watchers = 0
        self.resume_follower: Callable[[], Awaitable[None]] | None = None
        self.idle_follower: Callable[[], None] | None = None
        self.transactions = 0
        self.commands = 0
        self.rechecks = 0  # shared store: decisions taken again on the stored view
        self._rechecks = 0
        self._from_cache: set[str] = set()
        self._viewed = False
        self._rate: deque[tuple[float, int]] = deque()
        self._busy_since: float | None = None  # monotonic start of the batch in hand
        self.window = CommitWindow()  # batch sizes and commit times, for daemon.stats
        self.metrics: Hooks = NO_METRICS  # lifecycle sets Prometheus with --metrics-listen
        # Sessions whose stored history does not fold: their last good view is still
        # served; writes to them are refused (-32012) until deleted or replaced.
        self.histories = Histories(store)
        self.damaged = self.histories.damaged  # session id -> what is wrong
        # Replaces credentials in every event's data before it is decided (lifecycle
        # sets it from the config; None: nothing is redacted).
        self.redactor: Redactor | None = None
        # The host (or fleet) key that seals new events' hashes (version 2: export.py);
        # None: version 1, unkeyed (a writer made without the daemon's lifecycle).
        self.key: bytes | None = None

    # --- the callers' side ------------------------------------------------------------

    async def submit(self, command: Command) -> bytes:
        """Queue a command and wait for its result (encoded JSON). A submitter that is
        cancelled stops waiting; the command is decided all the same."""
        done = command.done = asyncio.get_running_loop().create_future()
        self.enqueue(command)
        try:
            await done
        finally:
            # Taken off the command, even when this submitter is cancelled once answered:
            # the error's traceback holds the frames that decided it, which hold the
            # command (a reference cycle, tests/test_cycles.py; a cancel before the answer
            # is `_finish`'s to clear).
            error, command.error = command.error, None
        if error is not None:
            try:  # raised with this frame no longer holding it, for the same reason
                raise error
            finally:
                del error
        assert command.result is not None
        return command.result

    def enqueue(self, command: Command) -> None:
        """Queue a command without waiting: its `done` or `then` says when it is decided.
        Raises ShuttingDownError once the writer is closing, -32008 when the queue is full."""
        if self._closed:
            raise ShuttingDownError("the daemon is shutting down")
        if len(self._queue) >= self.max_queue:
            raise OverloadedError("the write queue is full; retry later", {"retry_after_ms": 50})
        self._queue.append(command)
        self._ring_writer()

    def _ring_writer(self) -> None:
        wake = self._wake
        if wake is not None and not wake.done():
            wake.set_result(None)

    def cached(self, session_id: str) -> SessionState | None:
        """Return the committed view of a session if the writer holds it (never on a store
        other daemons write: there the store is read). Not while a commit that changes it
        is in flight: the commit's events and views may be readable before the writer
        hears back, and then the store's view is the newer; read from the store, views
        never go back in time."""
        if self.shared or session_id in self._committing:
            return None
        entry = self._cache.get(session_id)
        return entry.state if entry is not None else None

    async def view(self, session_id: str) -> SessionState | None:
        """`cached`, but a session that a commit in flight changes is answered with the
        view that commit leaves, once it has landed (waiting at most LANDING_WAIT_S): no
        store read, even if the writer has begun the next commit by the time this read
        runs again. None when the writer does not hold the view, when the commit failed,
        deleted the session or was still in flight after the wait: then the caller reads
        the store. (A commit that wrote nothing, a refused precondition, leaves the cached
        view, still current.)"""
        if session_id in self._committing and not self.shared:
            loop = asyncio.get_running_loop()
            waiter: asyncio.Future[SessionState | None] = loop.create_future()
            self._landing[waiter] = session_id
            timer = loop.call_later(LANDING_WAIT_S, _release, waiter, None)
            try:
                landed = await waiter
            finally:
                timer.cancel()
                del self._landing[waiter]
            if landed is not None:
                return landed
        return self.cached(session_id)

    async def watch(self) -> None:
        """Say that bells will be followed from now on (call before becoming a follower:
        a subscription, a tail). In fleet mode the
        first one resumes the follower of the shared log (one read of its head)."""
        self.watchers += 1
        if self.resume_follower is not None:
            try:
                await self.resume_follower()
            except BaseException:
                self.unwatch()
                raise

    def unwatch(self) -> None:
        """The end of a `watch`."""
        self.watchers -= 1
        if self.watchers == 0 and self.idle_follower is not None:
            self.idle_follower()

    @asynccontextmanager
    async def watching(self) -> AsyncIterator[None]:
        await self.watch()
        try:
            yield
        finally:
            self.unwatch()

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    @property
    def queue_capacity(self) -> int:
        return self.max_queue

    def appends_per_s(self) -> float:
        """Events committed per second over the last ten seconds."""
        self._trim_rate(time.monotonic())
        return round(sum(n for _, n in self._rate) / 10.0, 1)

    def stalled_for(self) -> float:
        """Seconds the writer has spent on the batch in hand (0 when it waits for work)."""
        return 0.0 if self._busy_since is None else time.monotonic() - self._busy_since

    def close(self) -> None:
        """Stop taking commands; the writer drains what is queued, then returns."""
        self._closed = True
        self._ring_writer()

    # --- the writer task --------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.committed_position = await self.store.last_position()
        self.next_position = self.committed_position + 1
        await self.histories.catch_up()
        task_status.started()
        queue, loop = self._queue, asyncio.get_running_loop()
        try:
            while True:
                # What the store left out of its commits for later, a step at a time when
                # it is due, a batch between steps (what is not yet due when the writer
                # stops, the store's close does).
                due = self.store.deferred_due()
                if due is not None and due <= 0:
                    await self._deferred()
                    if not queue:
                        continue
                    due = None
                if not queue:
                    if self._closed:
                        return
                    self._wake = loop.create_future()
                    timer = loop.call_later(due, self._ring_writer) if due is not None else None
                    try:
                        await self._wake
                    finally:
                        self._wake = None
                        if timer is not None:
                            timer.cancel()
                    continue
                batch = [queue.popleft() for _ in range(min(len(queue), self.max_batch))]
                # Shielded: a cancelled writer must not leave a half-run transaction
                # queued on the connection's thread.
                self._busy_since = time.monotonic()
                with anyio.CancelScope(shield=True):
                    await self._process(batch)
                self._busy_since = None
        finally:
            # Cancelled (or failed): nothing queued will be decided; say so to each.
            self._closed = True
            while queue:
                cmd = queue.popleft()
                cmd.result, cmd.error = None, ShuttingDownError("the daemon is shutting down")
                self._finish([cmd])

    async def _deferred(self) -> None:
        """A step of the store's deferred work (after a failure the store says when to
        try again)."""
        with anyio.CancelScope(shield=True):  # as a batch: never half-run on the thread
            try:
                await self.store.do_deferred()
            except SessiondError as exc:
                log.warning("store.deferred_failed", error=exc.message)
            except Exception:
                self._incident("store.deferred_crashed")

    async def _process(self, commands: list[Command]) -> None:
        """Decide and commit a batch; whatever fails, fails only the commands it concerns."""
        try:
            try:
                await self._attempt(commands)
            except _BatchFailed as failed:
                if len(commands) == 1:
                    commands[0].result, commands[0].error = None, failed.error
                elif isinstance(failed.error.data, dict) and failed.error.data.get("retryable"):
                    # The connection failed (the commit may even have landed, its answer
                    # lost): not a command's fault, and a retry here could append unkeyed
                    # writes twice. Every command gets the retryable error; the client
                    # retries under its idempotency key.
                    for cmd in commands:
                        cmd.result, cmd.error = None, failed.error
                    await self._resync()
                else:
                    # Not one command's fault as far as we can tell: each again, alone, in
                    # its own transaction, so the good ones commit and the bad one fails.
                    log.warning("writer.batch_retried_alone", commands=len(commands),
                                error=failed.error.message)
                    for cmd in commands:
                        cmd.result = cmd.error = None
                        try:
                            await self._attempt([cmd])
                        except _BatchFailed as alone:
                            cmd.result, cmd.error = None, alone.error
        except Exception:  # a bug outside any one command: fail the batch, keep the writer
            error = self._incident("writer.batch_crashed", commands=len(commands))
            for cmd in commands:
                if cmd.result is None and cmd.error is None:
                    cmd.error = error
            await self._resync()
        finally:
            self.commands += len(commands)
            self._finish(commands)

    async def _attempt(self, commands: list[Command]) -> None:
        """Decide `commands` and commit them in one transaction; on a failed commit nothing
        of the batch stays (positions, cache) and _BatchFailed says why. When the store
        moved under us (another host wrote: `Moved`), forget what it names and decide the
        batch again, a few times at most."""
        moves = 0
        while moves < MAX_MOVES:
            owners: list[_Requirement] = []
            moved = await self._attempt_once(commands, owners)
            if moved is None:
                return
            # A precondition the store found false fails the command that required it
            # (nothing was written); the others are decided again without it.
            refused = [o for o in owners if o.precondition in moved.refused]
            for o in refused:
                o.cmd.result = None
                o.cmd.error = o.plan.refusal(o.precondition, moved.refused[o.precondition])
            if moved.stale or not refused:
                moves += 1
            log.info("writer.store_moved", stale=len(moved.stale), refused=len(refused),
                     head=moved.head, rechecked=self._rechecks > 0)
            for sid in moved.stale:
                self._cache.pop(sid, None)
            self.next_position = moved.head + 1
            failed = {id(o.cmd) for o in refused}
            commands = [cmd for cmd in commands if id(cmd) not in failed]
            for cmd in commands:
                cmd.result = cmd.error = None
            if not commands:
                return
        raise _BatchFailed(StorageError(
            "storage error: other writers kept changing these sessions; nothing was written,"
            " retry", {"detail": "store moved", "retry_after_ms": 50}))

    async def _attempt_once(self, commands: list[Command],
                            owners: list[_Requirement]) -> Moved | None:
        self._rechecks = 0
        # Shared store: the sessions decided on a cached view (another host may have moved
        # them) and, of those, the ones a command was refused or answered on without a
        # commit. The commit's version check catches a stale view that writes; a refusal or
        # an answer without events it never sees, so those are decided again on the stored
        # view (one read each) before anything is answered: a right expected_version is
        # never refused for a view this host had not seen move.
        self._from_cache = set()
        suspects: set[str] = set()
        batch = Batch()
        built: list[_Built] = []
        batch.on_renumber = partial(self._renumbered, built)
        overlay: dict[str, Entry | object] = {}
        # First results of idempotency keys: those stored before this batch (read in one
        # hop for the whole batch), then those decided in it.
        keyed = [(c.session_id, key) for c in commands if (key := scoped_key(c)) is not None]
        # The views not in the cache, read with the keys: one hop for the batch, not one
        # a session. (A shared store's writer reads each view it does not hold as it
        # decides: `_load`.)
        self._prefetched = {}
        missing = [] if self.shared else list(dict.fromkeys(
            c.session_id for c in commands if c.session_id not in self._cache))
        try:
            if missing:
                self._prefetched, repeats = await self.store.prefetch(missing, keyed)
            else:
                repeats = await self.store.idempotent_results(keyed) if keyed else {}
        except SessiondError as exc:
            raise _BatchFailed(exc) from exc
        except Exception as exc:
            raise _BatchFailed(self._incident("writer.read_failed")) from exc
        first_position = self.next_position
        for cmd in commands:
            numbered = self.next_position
            self._viewed = False  # set when the command is answered with the view alone
            try:
                await self._decide(cmd, batch, overlay, repeats, built, owners)
            except SessiondError as exc:
                cmd.error = exc
            except Exception:  # a bug: answer -32603, keep the writer alive
                cmd.error = self._incident("writer.command_failed", session_id=cmd.session_id)
            if cmd.error is not None:
                cmd.result = None
                self.next_position = numbered  # a refused command leaves no gap
            if cmd.session_id in self._from_cache and (cmd.error is not None
                                                       or self._viewed):
                suspects.add(cmd.session_id)
        self._prefetched = {}
        if suspects:
            self.next_position = first_position
            self._rechecks = len(suspects)
            self.rechecks += len(suspects)
            return Moved(frozenset(suspects), first_position - 1)
        if not (batch.events or batch.deletes):
            return None
        if self.shared and batch.events:
            self._templates(batch, built)
        self._committing = frozenset(overlay)
        landed = False
        try:
            moved = await self.store.commit(batch)
            landed = moved is None
        except Exception as exc:
            self.next_position = first_position
            # It may have landed all the same (a check after COMMIT failed, the answer was
            # lost): the cached views of its sessions may be older than the store's.
            for sid in overlay:
                self._cache.pop(sid, None)
            if isinstance(exc, SessiondError):
                log.error("store.batch_failed", commands=len(commands), error=exc.message)
                raise _BatchFailed(exc) from exc
            raise _BatchFailed(self._incident("store.batch_crashed",
                                              commands=len(commands))) from exc
        finally:
            self._committing = frozenset()  # adopted below, with no await between
            # The reads waiting for this commit get the views it left (None: it failed,
            # or deleted the session; they read the store).
            for waiter, sid in self._landing.items():
                entry = overlay.get(sid) if landed else None
                _release(waiter, entry.state if isinstance(entry, Entry) else None)
        if moved is not None:
            self.next_position = first_position
            return moved
        if batch.events:  # the store may have numbered them (several hosts)
            self.next_position = batch.events[-1].position + 1
        self._adopt(overlay)
        self.transactions += 1
        self.window.add(len(commands), self.store.last_commit_s)
        self.metrics.committed(len(commands), batch.events, self.store.last_commit_s)
        now_m = time.monotonic()
        self._rate.append((now_m, len(batch.events)))
        self._trim_rate(now_m)
        self._ring(batch)
        return None

    @staticmethod
    def _templates(batch: Batch, built: list[_Built]) -> None:
        """A shared store numbers the batch in its commit: each result that quotes
        positions, built again with marked positions, becomes a Template the commit fills
        (the keyed ones go into the batch: the store stores them filled in the same
        statement)."""
        first, count = batch.events[0].position, len(batch.events)
        ids = {e.event_id for e in batch.events}
        batch.templated = True
        for b in built:
            if b.build is None or b.state is None or not b.events \
                    or b.events[-1].event_id not in ids:  # a session a later delete took
                continue
            state = b.state

            def at(base: int, events: list[Event] = b.events) -> list[Event]:
                return [moved(e, position=base + e.position - first)
                        for e in events]

            try:
                b.template = template(_json.encode(b.build(state, at(TEMPLATE_MARK))),
                                      _json.encode(b.build(state, at(TEMPLATE_OTHER))),
                                      count)
            except Exception:  # built once already: a second build that fails is a bug
                log.exception("writer.template_failed", session_id=b.cmd.session_id)
                b.template = None
            if b.template is None:
                batch.templated = False
            elif b.key is not None:
                batch.templates[b.key] = b.template

    def _renumbered(self, built: list[_Built], batch: Batch, shift: int) -> None:
        """The store numbered the batch `shift` past the writer's numbering: build again
        the results that quote positions, and the idempotency results among them. Runs
        inside the store's transaction: if a builder fails, nothing is written."""
        results: dict[tuple[str, str], bytes] = {}
        for b in built:
            if b.build is None:
                continue
            assert b.state is not None
            b.events = [moved(e, position=e.position + shift) for e in b.events]
            if b.template is not None:
                b.cmd.result = b.template.fill(batch.events[0].position)
            else:
                b.cmd.result = _json.encode(b.build(b.state, b.events))
            if b.key is not None:
                results[b.key] = b.cmd.result
        for b in built:
            if b.build is None and b.key in results:
                b.cmd.result = results[b.key]
        batch.idempotency = [(sid, key, results.get((sid, key), result))
                             for sid, key, result in batch.idempotency]

    @staticmethod
    def _incident(event: str, **context: Any) -> InternalError:
        """Log the exception in hand with a new incident id; return the -32603 naming it."""
        error_id = new_id()
        log.exception(event, error_id=error_id, **context)
        return InternalError("internal error", {"error_id": error_id})

    async def _resync(self) -> None:
        """After an unexpected failure: forget every cached view and take the next position
        from the store, so nothing uncommitted is ever built on."""
        self._cache.clear()
        try:
            self.next_position = await self.store.last_position() + 1
        except Exception:
            log.exception("writer.resync_failed")

    def _ring(self, batch: Batch) -> None:
        """Ring the batch for subscribers. In fleet mode a batch that does not follow on
        from what was rung is left to the follower, which reads it with the other hosts'
        events before it, in position order; its deletes are rung now. With nobody
        watching, nobody misses those events: the batch is rung at once, past the gap."""
        events = batch.events
        if (self.wake_follower is not None and events and self.watchers
                and events[0].position != self.committed_position + 1):
            self.wake_follower(events[-1].position)
            events = []
        self._ring_bell(events, frozenset(batch.deletes),
                        events[-1].position if events else self.committed_position)

    def _ring_bell(self, events: list[Event], deleted: frozenset[str], upto: int) -> None:
        self.committed_position = upto
        # The followers of what it touched; nothing else keeps the bell (core/bells.py).
        self.followers.ring(Bell(events, deleted))

    def deleted_elsewhere(self, deleted: frozenset[str]) -> None:
        """Fleet mode: the follower read that other hosts deleted these sessions. Ring
        them (their subscriptions end) and forget their cached views."""
        for sid in deleted:
            self._cache.pop(sid, None)
        self._ring_bell([], deleted, self.committed_position)

    async def deliver(self, events: list[Event], upto: int) -> None:
        """Fleet mode: the follower read the shared log up to `upto` (every host's events,
        in position order; positions missing were deleted). Ring what is past
        `committed_position`, and forget cached views other hosts moved on."""
        if upto <= self.committed_position:
            return
        fresh = [e for e in events if e.position > self.committed_position]
        for e in fresh:
            entry = self._cache.get(e.session_id)
            if entry is not None and entry.state.version < e.version:
                del self._cache[e.session_id]
        self._ring_bell(fresh, frozenset(), upto)

    async def _decide(self, cmd: Command, batch: Batch, overlay: dict[str, Entry | object],
                      repeats: dict[tuple[str, str], bytes], built: list[_Built],
                      owners: list[_Requirement]) -> None:
        sid = cmd.session_id
        pending = overlay.get(sid)
        entry: Entry | None
        damage: str | None = None
        if pending is _DELETED:
            entry = None
        elif pending is not None:
            assert isinstance(pending, Entry)
            entry = pending
        else:
            entry = await self._load(sid)
            damage = self.damaged.get(sid)
            batch.bases.setdefault(sid, entry.state.version if entry else 0)
        key = scoped_key(cmd)
        if key is not None:
            prior = repeats.get((sid, key))
            if prior is not None:
                cmd.result = prior
                built.append(_Built(cmd, (sid, key)))
                return
        actual = entry.state.version if entry else 0
        if entry is None and cmd.expected_version:
            # A version of a session that is not there: not found first, as for a write
            # without the condition (the caller's copy is not stale, it is gone).
            raise SessionNotFoundError(f"session {sid} not found", {"session_id": sid})
        if cmd.expected_version is not None and cmd.expected_version != actual:
            raise VersionConflictError(
                f"wrong expected version: {cmd.expected_version}"
                f" (session: {sid}, version: {actual})",
                {"expected": cmd.expected_version, "actual": actual},
            )
        plan = cmd.plan(entry.state if entry else None)
        needs = plan.requires(sid, entry is not None or damage is not None)
        self._check_in_batch(plan, needs, batch)
        if isinstance(plan, Delete):
            self._delete(sid, batch, overlay, repeats)
            self._require(cmd, plan, needs, batch, owners)
            cmd.result = _json.encode(plan.result)
            return
        if damage is not None and not (isinstance(plan, Import) and plan.replace):
            raise damaged_error(sid, damage)
        payloads: dict[str, bytes]
        if isinstance(plan, Import):
            check_import(plan.events)
            events = [moved(e, position=self.next_position + i)
                      for i, e in enumerate(redact_history(self.redactor, plan.events,
                                                           self.key))]
            self.next_position += len(events)
            state, snapshots = self._fold_with_snapshots(None, events)
            result = _json.encode(state)
            payloads = plan.payloads
            if plan.replace and (entry is not None or damage is not None):
                self._delete(sid, batch, overlay, repeats)
        elif not plan.events:  # the plan found nothing to record: answer with the view
            if entry is None:
                raise InternalError("a plan with no events for a missing session")
            self._viewed = True
            cmd.result = _json.encode(plan.result(entry.state, []))
            return
        else:
            events = self._make_events(cmd, entry, plan)
            try:
                state, snapshots = self._fold_with_snapshots(
                    entry.state if entry else None, events)
            except projection.SumOutOfBounds as exc:
                # A total would leave its bounds: the caller's numbers, refused by field.
                base = entry.state.version if entry else 0
                path = f"{plan.path(exc.version - base - 1)}.{exc.field}"
                raise InvalidParamsError(
                    f"{path[2:]}: adding {exc.value!r} would take {exc.total} of session"
                    f" {sid} past its bound; nothing was written",
                    {"detail": str(exc), "path": path}) from exc
            result = _json.encode(plan.result(state, events))
            built.append(_Built(cmd, (sid, key) if key is not None else None, plan.result,
                                state, events))
            payloads = {events[i].event_id: payload for i, payload in plan.payloads.items()}
        # Everything is decided; nothing below can fail, so the command joins whole.
        self._require(cmd, plan, needs, batch, owners)
        new_entry = Entry(state, events[-1].hash, events[-1].position)
        batch.payloads.update(payloads)
        batch.events.extend(events)
        batch.snapshots.extend(snapshots)
        batch.views[sid] = new_entry
        overlay[sid] = new_entry
        cmd.result = result
        if key is not None:
            batch.idempotency.append((sid, key, result))
            repeats[(sid, key)] = result

    @staticmethod
    def _check_in_batch(plan: Plan | Delete | Import, needs: list[Precondition],
                        batch: Batch) -> None:
        """The preconditions against the batch itself (the store checks them against what
        is committed before it): a fork of a session this batch deletes has no source; a
        session this batch forks has forks."""
        for p in needs:
            if isinstance(p, HasVersion) and p.session_id in batch.deletes:
                raise plan.refusal(p, 0)
            if isinstance(p, HasNoForks):
                forks = sum(1 for _, q in batch.requires
                            if isinstance(q, HasVersion) and q.session_id == p.session_id)
                if forks:
                    raise plan.refusal(p, forks)

    @staticmethod
    def _require(cmd: Command, plan: Plan | Delete | Import, needs: list[Precondition],
                 batch: Batch, owners: list[_Requirement]) -> None:
        batch.requires.extend((cmd.session_id, p) for p in needs)
        owners.extend(_Requirement(cmd, plan, p) for p in needs)

    @staticmethod
    def _delete(sid: str, batch: Batch, overlay: dict[str, Entry | object],
                repeats: dict[tuple[str, str], bytes]) -> None:
        """Take a session out of this batch and the store (its deletes run first)."""
        batch.drop_session(sid)
        for k in [k for k in repeats if k[0] == sid]:
            del repeats[k]
        batch.deletes.append(sid)
        overlay[sid] = _DELETED

    def _fold_with_snapshots(self, state: SessionState | None, events: list[Event],
                             ) -> tuple[SessionState, list[SessionState]]:
        """Fold `events`; also return the view at each multiple of snapshot_every passed."""
        every, done, snapshots = self.snapshot_every, 0, []
        base = state.version if state is not None else 0
        for cut in range((base // every + 1) * every, base + len(events) + 1, every):
            state = projection.fold(state, events[done:cut - base])
            snapshots.append(state)
            done = cut - base
        if done < len(events) or state is None:
            state = projection.fold(state, events[done:])
        return state, snapshots

    def _make_events(self, cmd: Command, entry: Entry | None, plan: Plan) -> list[Event]:
        """The plan's events, numbered, timed and chained, each holding the Struct it was
        built from (the fold reads it, nothing decodes it again)."""
        version = entry.state.version if entry else 0
        prev_hash = entry.last_hash if entry else ""
        namespace = entry.state.namespace if entry else None
        recorded_at = now()
        events = []
        for index, (event_type, given) in enumerate(plan.events):
            # Encoded here, or where it was given, twice: as stored (in its own order: the
            # bounds scan, the stored column, events.read and the subscribers' lines use
            # these bytes, never encoded again) and canonically, for the hash.
            data, data_json, hash_json = (
                (given.data, given.json, given.canonical) if isinstance(given, Given)
                else (given, encode_data(given), canonical_json(given)))
            if self.redactor is not None:  # credentials out before anything keeps them
                if namespace is None:
                    namespace = data.namespace if isinstance(data, SessionCreated) else "local"
                try:
                    data, data_json, hash_json = redact_data(
                        self.redactor, event_type, namespace, data, data_json, hash_json)
                except msgspec.ValidationError as exc:
                    raise InvalidParamsError(
                        f"{plan.path(index)[2:] or 'data'}: redacting a credential in it"
                        f" leaves it invalid ({exc}); nothing was written",
                        {"detail": str(exc), "path": plan.path(index)}) from exc
            bad = out_of_bounds(data_json, plan.path(index))
            if bad is not None:
                path, value = bad
                raise InvalidParamsError(f"{bound_message(path, value)}; nothing was written",
                                         {"detail": "number out of bounds", "path": path})
            version += 1
            event = typed_event(
                position=self.next_position, session_id=cmd.session_id, version=version,
                event_id=new_id(), type=event_type, recorded_at=recorded_at, data=data,
                data_json=data_json, meta=cmd.meta)
            prev_hash = chain_link(prev_hash, event, self.key, hash_json)
            events.append(moved(event, hash=prev_hash))
            self.next_position += 1
        return events

    async def _load(self, session_id: str) -> Entry | None:
        # On a shared store too the cached view is decided on: another daemon may have
        # written or deleted the session since, and then the commit's version check under
        # the row lock says so (Moved: decided again on the stored view); a refusal or an
        # answer decided on it is checked again (see _attempt_once).
        entry = self._cache.get(session_id)
        if entry is not None:
            self._cache.move_to_end(session_id)
            if self.shared:
                self._from_cache.add(session_id)
            return entry
        try:
            if session_id in self._prefetched:  # read with the batch's other views
                entry = self._prefetched.pop(session_id)
            else:
                entry = await self.store.load_entry(session_id)
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            # The stored view does not read back: fold it again from its events. Not
            # cached: the cache holds only what is committed (the next write commits it).
            log.error("writer.view_unreadable", session_id=session_id, error=str(exc))
            return await self.histories.rebuild(session_id, None)
        if entry is not None:
            self._remember(session_id, entry)
        return entry

    def _adopt(self, overlay: dict[str, Entry | object]) -> None:
        for sid, entry in overlay.items():
            self.damaged.pop(sid, None)  # deleted or replaced: the bad history is gone
            if entry is _DELETED:
                self._cache.pop(sid, None)
            else:
                assert isinstance(entry, Entry)
                self._remember(sid, entry)

    def _remember(self, session_id: str, entry: Entry) -> None:
        self._cache[session_id] = entry
        self._cache.move_to_end(session_id)
        while len(self._cache) > self.cache_size:
            self._cache.popitem(last=False)

    @staticmethod
    def _finish(commands: list[Command]) -> None:
        call_soon = None
        for cmd in commands:
            if cmd.then is not None:
                # Soon, not now: the answers are written while the next batch commits.
                call_soon = call_soon or asyncio.get_running_loop().call_soon
                call_soon(cmd.then, cmd)
                continue
            done = cmd.done
            if done is not None and not done.done():
                done.set_result(None)
            elif done is not None and done.cancelled():
                # Its submitter was cancelled: nobody raises the error, whose traceback
                # holds the frames that decided it, and they the command (a cycle).
                cmd.error = None

    def _trim_rate(self, now_m: float) -> None:
        while self._rate and self._rate[0][0] < now_m - 10.0:
            self._rate.popleft()

