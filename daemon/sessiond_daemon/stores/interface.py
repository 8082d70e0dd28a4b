"""The store interface: what the writer, the service and the features need from a store.

One module, no driver: the Protocols and the types they speak. `sqlite/` implements
them on one file; a PostgreSQL store implements the same Protocols, and
`tests/store_contract.py` holds both to them.

- `EventStore`: the event log and the views (the writer's batch commit, the reads of
  streams and of the whole log by position, views and snapshots, idempotency).
- The feature read models (`SessionQueries`, `CheckpointReads`, `GraphReads`, ...):
  each kept by the store inside the commit, from the committed events, by the rules of
  stores/models (defined once), and read by its shared queries.
- `Capabilities`: what only some stores can do (integrity check, file backup, size,
  full-text index, a log shared with other daemons). Callers ask `store.capabilities`
  instead of calling a driver's method or checking which engine they have.

To add a store (docs/architecture.md, "To add a store"): in a package of its own, write
the log (`EventStore` but the three view reads), an executor that runs the read models'
row operations (`stores.models.ops_of`, `forget`) inside `commit`, `session_totals`,
`sessions_with_process` and `process_output`; mix in `stores.models.queries.ModelQueries`
and `stores.models.views.ViewQueries`, which serve every other member of `Store` over the
store's `QueryDriver` (`dialect`, `_q_all`, `_q_page`). Name it in `stores/registry.py`
(an `Engine`: which --db URLs it claims, whether it needs a file lock, how it is made);
subclass
`tests/store_contract.py`'s `StoreContract` with a fixture that gives a fresh store.
Positions are gapless and in commit order; see `EventStore.commit` for what a store that
several daemons share must check.
"""

from __future__ import annotations

import re
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Final, Protocol, TypeVar

from sessiond_schemas.events import (
    Event,
    moved,
)
from sessiond_schemas.rpc import SearchResult
from sessiond_schemas.state import (
    Message,
    ProgressStep,
    SessionState,
    SessionSummary,
)

T = TypeVar("T")


class Page(list[T]):
    """The rows of one page; `cut` is True when the byte budget ended it before its count."""

    cut: bool = False


def repage(rows: Page[Any], items: list[T]) -> Page[T]:
    """`items` made from `rows`, as a page cut where the rows were."""
    page: Page[T] = Page(items)
    page.cut = rows.cut
    return page


@dataclass(slots=True)
class Entry:
    """A session as the writer holds it: the view, its chain head and last position."""

    state: SessionState
    last_hash: str
    last_position: int


@dataclass(frozen=True, slots=True)
class HasVersion:
    """A precondition: session `session_id` holds version `version` of its history, with
    chain hash `hash` there (its view row exists, at that version or past it, and the
    event at `version`, its own or an ancestor's below its fork point, has that hash).
    A fork's source: the fork's plan read it there. History only grows, so a source
    written since still holds it; a deleted one (or one deleted and created again under
    the same id) does not."""

    session_id: str
    version: int
    hash: str


@dataclass(frozen=True, slots=True)
class HasNoForks:
    """A precondition: no stored fork has session `session_id` as its source (a fork this
    same batch deletes does not count). A delete, a replace-import, a cleanup."""

    session_id: str


# What a batch requires of the store as committed before it; the store checks each one
# inside its commit, under its own locks (`EventStore.commit`).
Precondition = HasVersion | HasNoForks


@dataclass(slots=True)
class Batch:
    """Everything one group commit writes, in the order it is applied: deletes first, then
    events (numbered consecutively, in order), views, idempotency results, snapshots."""

    deletes: list[str] = field(default_factory=list)
    events: list[Event] = field(default_factory=list)
    views: dict[str, Entry] = field(default_factory=dict)
    payloads: dict[str, bytes] = field(default_factory=dict)  # checkpoint event_id -> payload
    idempotency: list[tuple[str, str, bytes]] = field(default_factory=list)
    snapshots: list[SessionState] = field(default_factory=list)
    # The stored version each touched session was decided from (0: no session). A store
    # shared by several writers checks them in the commit; see `EventStore.commit`.
    bases: dict[str, int] = field(default_factory=dict)
    # (the session whose command requires it, the precondition): what the batch requires
    # of the store as committed before it. The writer has already checked them against
    # the batch itself (a fork of a session this batch deletes, say, never gets here).
    requires: list[tuple[str, Precondition]] = field(default_factory=list)
    # Told the batch and the shift when a store gives the events other positions than
    # the writer's (`renumber`): the writer rebuilds the results that quote positions.
    # (Given the batch, not holding it: a callback holding its batch would make every
    # batch a reference cycle, left with all it holds for the garbage collector.)
    on_renumber: Callable[[Batch, int], None] | None = None
    # For a store that numbers the batch inside one statement (PostgreSQL's one-call
    # commit): each idempotency result (session_id, key) as a Template, which that
    # statement fills with the positions it takes. A key without one: the store commits
    # the batch in its multi-statement way (numbers first, then results).
    templates: dict[tuple[str, str], Template] = field(default_factory=dict)
    # Whether every result of the batch that quotes positions has its template (so none
    # has to be built again once the positions are known, after the commit).
    templated: bool = False

    def renumber(self, first: int) -> None:
        """Number the events from `first` on (a store that takes positions in the commit
        calls this inside its transaction, before it writes anything that holds one)."""
        if not self.events or self.events[0].position == first:
            return
        shift = first - self.events[0].position
        self.events = [moved(e, position=e.position + shift) for e in self.events]
        for entry in self.views.values():
            entry.last_position += shift
        if self.on_renumber is not None:
            self.on_renumber(self, shift)

    def drop_session(self, session_id: str) -> None:
        """Forget what this batch would write for a session that a later command deletes."""
        self.events = [e for e in self.events if e.session_id != session_id]
        self.views.pop(session_id, None)
        self.idempotency = [i for i in self.idempotency if i[0] != session_id]
        self.templates = {k: t for k, t in self.templates.items() if k[0] != session_id}
        self.snapshots = [v for v in self.snapshots if v.session_id != session_id]
        self.requires = [r for r in self.requires if r[0] != session_id]

    def sources(self) -> list[HasVersion]:
        """The HasVersion preconditions, each once, by session id."""
        found = {p for _, p in self.requires if isinstance(p, HasVersion)}
        return sorted(found, key=lambda p: (p.session_id, p.version, p.hash))

    def unforked(self) -> list[str]:
        """The sessions the batch requires to have no forks, each once, in order."""
        return sorted({p.session_id for _, p in self.requires if isinstance(p, HasNoForks)})


@dataclass(frozen=True, slots=True)
class Template:
    """A result that quotes positions of its batch's events, as text around them:
    `parts[0]`, the position of the batch's event `events[0]` (its index in the batch),
    `parts[1]`, ... (one part more than events)."""

    parts: tuple[str, ...]
    events: tuple[int, ...]

    def fill(self, first: int) -> bytes:
        """The result with the batch numbered from `first`."""
        out = [self.parts[0]]
        for part, index in zip(self.parts[1:], self.events, strict=True):
            out += [str(first + index), part]
        return "".join(out).encode()


# The positions a result is built with to find where it quotes them: the batch's event i
# at TEMPLATE_MARK + i, then at TEMPLATE_OTHER + i (no position of a real log comes near).
TEMPLATE_MARK: Final = 10**15
TEMPLATE_OTHER: Final = 2 * 10**15
_DIGITS: Final = re.compile(r"\d+")


def template(marked: bytes, other: bytes, count: int) -> Template | None:
    """The template of a result built twice, with the batch's event i at position
    TEMPLATE_MARK + i (`marked`) and at TEMPLATE_OTHER + i (`other`), of a batch of
    `count` events; None when the two do not line up (a number that moved with the
    positions but is not one of them)."""
    text = marked.decode()
    parts: list[str] = []
    events: list[int] = []
    at = 0
    for m in _DIGITS.finditer(text):
        index = int(m.group()) - TEMPLATE_MARK
        if 0 <= index < count:
            parts.append(text[at:m.start()])
            events.append(index)
            at = m.end()
    parts.append(text[at:])
    t = Template(tuple(parts), tuple(events))
    return t if t.fill(TEMPLATE_OTHER) == other else None


@dataclass(frozen=True, slots=True)
class Moved:
    """`commit` wrote nothing: the store moved under the writer (another host wrote).

    `stale`: sessions whose stored version is not the batch's base (or whose idempotency
    key another writer stored): the writer forgets their cached views and decides again.
    `head`: the store's last position now; the writer numbers its next attempt after it.
    `refused`: the batch's preconditions that do not hold, each with what the store
    found: for HasNoForks the number of forks, for HasVersion the session's stored
    version (0: it is gone). The writer fails the commands that required them and
    decides the others again.
    """

    stale: frozenset[str]
    head: int
    refused: Mapping[Precondition, int] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class SessionFilters:
    """What session.list may filter on; None means any."""

    namespace: str | None = None
    statuses: tuple[str, ...] = ()
    actor_name: str | None = None
    source: str | None = None
    created_after: str | None = None
    created_before: str | None = None


@dataclass(frozen=True, slots=True)
class CheckpointRow:
    """A stored checkpoint as checkpoint.list shows it."""

    checkpoint_id: str
    node_id: str | None
    created_at: str
    size: int
    version: int


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A stored checkpoint with its payload (JSON bytes) and the memory saved with it."""

    checkpoint_id: str
    node_id: str | None
    resume_from: str | None
    created_at: str
    version: int
    payload: bytes
    memory: dict[str, Any]


@dataclass(frozen=True, slots=True)
class ForkRow:
    session_id: str
    version: int
    forked_at: str


# --- the event log and the views -------------------------------------------------------


class EventStore(Protocol):
    """The event log and the views. Positions are global, gapless and in commit order."""

    schema_version: int
    migrated: list[int]  # the migrations this open applied
    last_commit_s: float  # seconds the last commit took, as the writer waited for it

    async def open(self) -> None: ...
    async def close(self) -> None: ...

    @property
    def capabilities(self) -> Capabilities: ...

    # The writer's side. Only the writer commits; these reads see what it committed.
    async def last_position(self) -> int:
        """The position of the last committed event (0: none)."""
        ...

    async def load_entry(self, session_id: str) -> Entry | None: ...

    async def idempotent_results(
        self, keys: list[tuple[str, str]]) -> dict[tuple[str, str], bytes]:
        """The stored first results of these (session_id, idempotency_key) pairs."""
        ...

    async def prefetch(
        self, session_ids: list[str], keys: list[tuple[str, str]],
    ) -> tuple[dict[str, Entry | None], dict[tuple[str, str], bytes]]:
        """What the writer reads before it decides a batch, in one read: the views of
        these sessions (None: no such session; a view that does not decode is left out,
        for `load_entry` to report) and, as `idempotent_results`, these keys' results."""
        ...

    def deferred_due(self) -> float | None:
        """Work the store leaves out of its commits for later (SQLite: its search index,
        which follows the log): None when there is none, else the seconds until it is due
        (0: now). The writer runs `do_deferred` when it is, between batches."""
        ...

    async def do_deferred(self) -> None:
        """A step of the deferred work (a step: the writer's batches go on between)."""
        ...

    async def idempotency_page(self, session_id: str, after: str,
                               limit: int) -> list[tuple[str, bytes]]:
        """A session's stored first results, (key, result) by key past `after`, at most
        `limit` (`sessiond migrate` copies them)."""
        ...

    async def commit(self, batch: Batch) -> Moved | None:
        """Write the whole batch in one transaction, or nothing of it.

        Raises StorageError (-32012) when the store fails; nothing is written then.
        Returns None when written. The writer numbers the events after the last position
        it knows; a store that several writers share (several hosts) takes the positions
        in the commit instead (`batch.renumber(first)`, from its counter row, as late in
        the transaction as it can) and checks, after locking the touched sessions, that
        each one's stored version is `batch.bases[sid]` and that no idempotency key of
        the batch is stored; when not, it writes nothing and returns `Moved`, and the
        writer reloads the stale sessions and decides the batch again. A store with one
        writer (SQLite: the file lock) keeps the writer's numbering and never finds a
        session stale.

        Every store checks the batch's preconditions (`batch.requires`) inside the
        transaction, before it writes anything, against what is committed: under the
        locks that order it with every other writer (a shared store locks each
        precondition's session row with the touched ones, in session_id order, and
        checks in a later statement, so that what committed while it waited is seen).
        When one fails, it writes nothing and returns `Moved` with `refused`.
        """
        ...

    async def sessions_behind(self) -> list[str]:
        """Sessions whose events go past their stored view (or that have none)."""
        ...

    # Reading the log.
    async def read_events(self, *, session_id: str | None, from_version: int,
                          after_position: int, limit: int, types: list[str] | None,
                          max_bytes: int = 0) -> Page[Event]:
        """One stream from `from_version` in version order, or (session_id None) the whole
        log past `after_position` in position order; optionally only `types`."""
        ...

    async def read_after(self, after: int, upto: int, session_id: str | None,
                         types: frozenset[str] | None, limit: int) -> list[Event]:
        """Events with after < position <= upto, in position order (for subscribers)."""
        ...

    async def first_position(self, session_id: str, from_version: int) -> int | None: ...

    async def foreign_event_ids(self, session_id: str, event_ids: list[str]) -> list[str]:
        """Which of these event ids another session already holds."""
        ...

    async def events_of_types(self, session_id: str,
                              types: tuple[str, ...]) -> list[tuple[str, Any]]:
        """A session's events of the given types, in order, as (type, decoded data)."""
        ...

    # Views and snapshots.
    async def state_json(self, session_id: str) -> bytes | None:
        """A session's stored view, as its JSON bytes."""
        ...

    async def snapshot(self, session_id: str, at_most: int) -> SessionState | None:
        """The latest stored view of a session at or before version `at_most`."""
        ...

    async def snapshots(self, session_id: str) -> dict[int, SessionState]: ...

    async def trim_point(self, session_id: str, at_most: int, before: str,
                         keep_sequence: int) -> tuple[int, str, SessionState] | None:
        """Where retention may trim to (issue 48): the latest snapshot of the session at or
        before version `at_most`, whose event was recorded before `before`, and at which
        no message from sequence `keep_sequence` on (the context's) was stored yet; as
        (version, the hash of its event, the view)."""
        ...


# --- feature read models (kept inside the commit, from the committed events) -----------


class SessionQueries(Protocol):
    """The views as lists: session.list, resolution, totals, retention."""

    async def resolve(self, prefix: str) -> list[str]: ...
    async def list_sessions(self, filters: SessionFilters, limit: int, cursor: str | None,
                            max_bytes: int = 0) -> tuple[Page[SessionSummary], str | None]: ...
    async def session_ids(self, after: str, limit: int) -> list[str]: ...
    async def stale_sessions(self, statuses: Sequence[str], before: str,
                             limit: int) -> list[str]: ...
    async def expiring_sessions(self, before: str, after: tuple[str, str] | None,
                                limit: int) -> list[tuple[str, str]]:
        """(expires_at, session_id) of sessions whose idle TTL passes at or before `before`,
        in that order, after the key `after` (a page of the expiry index)."""
        ...
    async def states(self, namespace: str, prefix: bool, after: str, limit: int,
                     max_bytes: int = 0) -> Page[bytes]: ...
    async def counts(self) -> tuple[int, int]:
        """(sessions, events), counted from the views."""
        ...

    async def session_totals(self, column: str) -> list[tuple[Any, int, int, int, float]]:
        """Per status, namespace or actor_name: sessions, input and output tokens, cost."""
        ...

    async def sessions_with_process(self) -> list[str]: ...


class MessageReads(Protocol):
    async def list_messages(self, session_id: str, *, first: int, limit: int,
                            descending: bool, max_bytes: int = 0) -> Page[Message]: ...


class CheckpointReads(Protocol):
    async def checkpoint(self, session_id: str,
                         checkpoint_id: str | None) -> StoredCheckpoint | None: ...
    async def checkpoints(self, session_id: str, after_version: int = 0,
                          max_bytes: int = 0) -> Page[CheckpointRow]: ...
    async def checkpoint_payloads(self, session_id: str) -> dict[str, bytes]: ...


class ProgressReads(Protocol):
    async def progress_steps(self, session_id: str, after_version: int, upto: int,
                             limit: int, max_bytes: int = 0) -> Page[ProgressStep]:
        """A session's graph steps with after_version < version <= upto, oldest first."""
        ...


class RunnerReads(Protocol):
    async def runner_events(self, session_id: str, types: tuple[str, ...], *,
                            newest_first: bool = False, before_version: int | None = None,
                            limit: int = -1) -> list[tuple[str, int, dict[str, Any]]]:
        """(type, version, data) of the runner index's events of `types` (the turn events,
        and the output lines that may name a resume id)."""
        ...


class ScopedStateReads(Protocol):
    async def scoped_state(self, app_name: str,
                           user_ids: list[str]) -> dict[str, dict[str, Any]]: ...


class ProcessOutputReads(Protocol):
    async def process_output(self, session_id: str, turn: int, stream: str | None,
                             after_position: int = 0,
                             max_bytes: int = 0) -> Page[tuple[int, str]]: ...


class GraphReads(Protocol):
    async def graph_checkpoints(self, session_id: str | None, ns: str | None,
                                checkpoint_id: str | None, before: str | None, limit: int,
                                offset: int, after: tuple[str, str, str] | None = None
                                ) -> list[tuple[str, str, str, bytes]]: ...
    async def graph_checkpoint_ids(self, session_id: str) -> list[tuple[str, str]]: ...
    async def graph_values(self, session_id: str, ns: str,
                           wanted: list[tuple[str, str]]) -> dict[tuple[str, str], Any]: ...
    async def graph_pending(self, session_id: str, ns: str,
                            checkpoint_ids: list[str]) -> dict[str, list[dict[str, Any]]]: ...
    async def graph_runs(self, run_ids: list[str]) -> list[tuple[str, str, str]]: ...


class ForkReads(Protocol):
    async def hash_at(self, session_id: str, version: int) -> str | None:
        """The chain hash of a session's history at `version` (an ancestor's below its
        fork point)."""
        ...

    async def fork_ancestry(self, session_id: str, limit: int) -> list[str]:
        """The session and the sources it was forked from, nearest first, at most `limit`
        of them (a chain that goes round repeats itself up to the limit)."""
        ...

    async def fork_count(self, session_id: str) -> int: ...
    async def forks_page(self, source_id: str, after: str,
                         limit: int) -> tuple[int, list[ForkRow]]:
        """(how many forks `source_id` has, those after id `after`, by id)."""
        ...


class Store(EventStore, SessionQueries, MessageReads, CheckpointReads, ScopedStateReads,
            ProcessOutputReads, GraphReads, ForkReads, ProgressReads, RunnerReads, Protocol):
    """Everything the daemon reads and writes: the log, the views and the read models."""


# --- capabilities (what only some stores can do) ---------------------------------------


class IntegrityCheck(Protocol):
    async def integrity_check(self) -> list[str]:
        """The store's own check of its storage: ["ok"] when sound."""
        ...


class FileBackup(Protocol):
    async def backup(self, target: str) -> tuple[int, int]:
        """Copy the store online to a new file; (bytes, last position in the copy)."""
        ...


class SizeCap(Protocol):
    max_bytes: int  # 0: no cap; past it writes fail with -32012

    async def db_bytes(self) -> int:
        """The store's bytes on disk, as the cap counts them (daemon.stats' db_bytes)."""
        ...


class Following(Protocol):
    """A follower of a shared log: runs until cancelled; `wake` asks for one more round,
    `hint(position)` one up to a position known committed (this host's batch). It follows
    only while `needed` (given to `following`) says so: `resume` (awaited before a new
    follower of the bells takes its mark) makes it live again from the head, `idle` says
    nobody needs it any more."""

    def wake(self) -> None: ...
    def hint(self, position: int) -> None: ...
    async def resume(self) -> None: ...
    def idle(self) -> None: ...
    async def run(self) -> None: ...


class SharedLog(Protocol):
    """Other daemons commit to this store too: how this daemon follows their commits."""

    def following(self, deliver: Callable[[list[Event], int], Awaitable[None]], *,
                  cursor: int, at: Callable[[], int],
                  deleted: Callable[[frozenset[str]], None],
                  on_state: Callable[[bool], None],
                  needed: Callable[[], bool] | None = None) -> Following:
        """A follower that hands `deliver` every committed event past `cursor`, from any
        host, in position order, with the position it reaches; `deleted` the sessions
        other hosts deleted; `at` says where this daemon already is; `on_state(connected)`
        is told when the database goes and comes back."""
        ...


class SqlAccess(Protocol):
    """Run a function on a driver connection (a store's own full-text implementation uses
    it). The connection's type is the driver's."""

    async def on_reader(self, fn: Callable[[Any], T]) -> T:
        """`fn` on a read connection (several statements, one hop)."""
        ...

    async def on_writer(self, fn: Callable[[Any], T]) -> T:
        """`fn` in a transaction of its own on the write connection (maintenance)."""
        ...


@dataclass(frozen=True)
class SearchBudget:
    """What one session.search query may cost (docs/reliability.md, "Budgets"): its terms
    and prefix terms, checked before it runs (-32602), as are the indexed events its prefix
    terms' words are in (estimated by the store from its index); while it runs, its time and (on
    SQLite, counted by the progress handler) VM steps (-32012); and it stops when its
    client goes (`gone`) or its request is cancelled (`stop`)."""

    max_terms: int = 64
    max_prefixes: int = 8
    max_prefix_matches: int = 100_000
    max_steps: int = 500_000_000
    timeout_s: float = 10.0
    gone: Callable[[], bool] = lambda: False
    stop: threading.Event = field(default_factory=threading.Event)


@dataclass(frozen=True, slots=True)
class SearchQuery:
    """One session.search, its params checked: the query text (FTS5's syntax), the
    filters, and where the page starts (`after`, the decoded cursor)."""

    text: str
    statuses: tuple[str, ...] = ()
    namespace: str | None = None
    actor_name: str | None = None
    since: str | None = None
    until: str | None = None
    limit: int = 20
    hits: int = 3
    mark: tuple[str, str] = ("\u00ab", "\u00bb")
    after: tuple[float, str] | None = None
    window: int = 5_000  # the newest matching events ranked (stores/models/search.py)


class FullText(Protocol):
    """A store's full-text index of the events (the search read model,
    stores/models/search.py) and its query: session.search, daemon.reindex, and the
    index's part of daemon.verify."""

    async def search(self, query: SearchQuery, budget: SearchBudget) -> SearchResult:
        """The query's page, within the budget (-32602 for a query the store cannot parse,
        -32012 when the budget stops it)."""
        ...

    async def clear(self) -> int:
        """Empty the index (daemon.reindex's first step); return the last position, up to
        which `rebuild_range` must run (the writer indexes what comes after)."""
        ...

    async def rebuild_range(self, after: int, upto: int) -> None:
        """Index the events with after < position <= upto the index does not hold, in one
        transaction of their own (the writer's batches go on between ranges)."""
        ...

    async def relink_forks(self) -> int:
        """Rebuild the fork links from the session.forked events; return how many."""
        ...

    async def count(self) -> int:
        """The documents the index holds."""
        ...

    async def problems(self) -> list[str]:
        """What daemon.verify finds wrong with the index: an event of an indexed type
        missing from it, or a document whose event is gone."""
        ...


@dataclass(frozen=True, slots=True)
class Capabilities:
    """What a store can do beyond the Protocols; None where it cannot."""

    # Which engine, for messages and logs: callers never compare it (they ask for a
    # capability; tests/test_layering.py).
    engine: str
    # Other daemons write this store too: a view this one cached may be stale, so the
    # writer decides on views read from the store, and reads are served from it.
    shared: bool = False
    shared_log: SharedLog | None = None  # other daemons' commits, followed (serve/lifecycle.py)
    integrity: IntegrityCheck | None = None
    backup: FileBackup | None = None
    size: SizeCap | None = None
    full_text: FullText | None = None  # session.search, daemon.reindex, verify's part


