"""JSON-RPC 2.0 envelopes and the params/result Struct of every method."""

from __future__ import annotations

from typing import Annotated, Any, Final, Literal

import msgspec
from msgspec import UNSET, UnsetType

from .bounds import INT64_MAX, NonNegInt, PosInt
from .events import (
    Event,
    EventType,
    GraphCheckpoint,
    GraphWrites,
    MessageFields,
    ProgressRecorded,
    SessionCreated,
    SessionId,
    Status,
    TokensRecorded,
    Typed,
)
from .state import ForkLink, Message, Progress, SessionState, SessionSummary, TokenUsage

RequestId = int | str | None
Version = NonNegInt
IdempotencyKey = Annotated[str, msgspec.Meta(min_length=1, max_length=256)]
Limit1000 = Annotated[int, msgspec.Meta(ge=1, le=1000)]
ItemId = Annotated[str, msgspec.Meta(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")]
# What becomes a path, a program argument or an environment entry: no NUL byte (the
# kernel's strings end at one).
NoNul = Annotated[str, msgspec.Meta(pattern=r"^[^\x00]*$")]

# --- envelopes ------------------------------------------------------------------


class Request(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    jsonrpc: Literal["2.0"]
    method: str
    params: msgspec.Raw | UnsetType = UNSET
    id: RequestId | UnsetType = UNSET


class ErrorObject(msgspec.Struct, kw_only=True, omit_defaults=True):
    code: int
    message: str
    data: dict[str, Any] | UnsetType = UNSET


# No defaults on `id`/`result`: `"id": null` must be written (msgspec would omit it).
class Success(msgspec.Struct, kw_only=True):
    jsonrpc: str
    id: RequestId
    result: Any


class Failure(msgspec.Struct, kw_only=True):
    jsonrpc: str
    id: RequestId
    error: ErrorObject


class Notification(msgspec.Struct, kw_only=True):
    jsonrpc: str
    method: str
    params: Any


class Response(msgspec.Struct, kw_only=True):
    """What a client decodes: either `result` or `error` is set."""

    jsonrpc: str = "2.0"
    id: RequestId | UnsetType = UNSET
    result: msgspec.Raw | UnsetType = UNSET
    error: ErrorObject | UnsetType = UNSET
    method: str | UnsetType = UNSET
    params: msgspec.Raw | UnsetType = UNSET


# --- params ----------------------------------------------------------------------


class Params(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """Base of every method's params: unknown fields are refused."""


class NoParams(Params, kw_only=True, forbid_unknown_fields=True):
    pass


class BackupParams(Params, kw_only=True, forbid_unknown_fields=True):
    path: Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[^\x00]+$")]


class EventInput(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    type: EventType
    data: dict[str, Any] = {}


class SessionCreateParams(SessionCreated, kw_only=True, forbid_unknown_fields=True):
    session_id: SessionId | None = None
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None
    # Appended with session.created, all or nothing (as events.append takes them).
    events: Annotated[list[EventInput], msgspec.Meta(max_length=10_000)] = []


class SessionRef(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str


class SessionGetParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    at_version: PosInt | None = None


class SessionResolveParams(Params, kw_only=True, forbid_unknown_fields=True):
    prefix: Annotated[str, msgspec.Meta(min_length=4)]


class SessionListParams(Params, kw_only=True, forbid_unknown_fields=True):
    namespace: str | None = None
    status: list[Status] | None = None
    actor_name: str | None = None
    source: str | None = None
    created_after: str | None = None
    created_before: str | None = None
    limit: Limit1000 = 50
    cursor: str | None = None


class WriteParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None


class SessionTransitionParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    to: Status
    reason: str | None = None
    error: str | None = None
    paused_at: str | None = None
    resume_from: str | None = None


class SessionResumeParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    checkpoint_id: str | None = None


class SessionDeleteParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    pass


class MessageAppendParams(MessageFields, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None


class MessageAppendManyParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    messages: Annotated[list[MessageFields], msgspec.Meta(min_length=1, max_length=10_000)]


class MessageListParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    limit: Limit1000 = 100
    offset: NonNegInt = 0
    after_sequence: Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)] | None = None
    order: Literal["asc", "desc"] = "asc"


class TokensRecordParams(TokensRecorded, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None


class ProgressRecordParams(ProgressRecorded, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    expected_version: Version | None = None
    idempotency_key: IdempotencyKey | None = None


class CheckpointSaveParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    checkpoint_id: ItemId | None = None
    node_id: str | None = None
    resume_from: str | None = None
    memory: dict[str, Any] = {}
    payload: Any = None


class CheckpointGetParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    checkpoint_id: str | None = None


class MemoryUpdateParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    patch: dict[str, Any]


class EventsAppendParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    events: Annotated[list[EventInput], msgspec.Meta(min_length=1, max_length=10_000)]


class EventsReadParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str | None = None
    from_version: PosInt | None = None
    from_position: NonNegInt | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=10_000)] = 1000
    types: list[EventType] | None = None


class SessionCleanupParams(Params, kw_only=True, forbid_unknown_fields=True):
    # At most 100,000 days (274 years): older cut-offs fall outside the calendar.
    older_than_days: Annotated[float, msgspec.Meta(ge=0, le=100_000)] = 7
    statuses: list[Status] = msgspec.field(
        default_factory=lambda: ["completed", "failed", "cancelled", "killed"])
    dry_run: bool = False


class SessionImportParams(Params, kw_only=True, forbid_unknown_fields=True):
    document: Any
    on_conflict: Literal["error", "skip", "replace"] = "error"


class EventsSubscribeParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str | None = None
    from_position: NonNegInt | None = None
    from_version: PosInt | None = None
    types: list[EventType] | None = None


class EventsUnsubscribeParams(Params, kw_only=True, forbid_unknown_fields=True):
    subscription: str


# --- results ---------------------------------------------------------------------


PROTOCOL_VERSION: Final = "1.1"
"""major.minor of this API: a minor release adds methods and optional fields; a major one
may remove or change them. 1.0 was sessiond 0.1.0, whose ping had neither field below."""


class PingResult(msgspec.Struct, kw_only=True):
    pong: bool
    version: str  # the daemon's release
    uptime_s: float
    protocol: str = "1.0"  # PROTOCOL_VERSION of the daemon (absent before 1.1)
    methods: list[str] = []  # every method the daemon serves (absent before 1.1)


class StatsResult(msgspec.Struct, kw_only=True):
    sessions: int
    events: int
    last_position: int
    db_bytes: int
    connections: int
    subscriptions: int
    write_queue_depth: int
    appends_per_s: float
    uptime_s: float
    write_transactions: int
    write_commands: int
    # From protocol 1.1 (None from an older daemon: unknown, not zero): the database's
    # schema version, and health figures for `sessionctl top`: the last minute's commits,
    # the queue's capacity, running executors, and sessions by status.
    schema_version: int | None = None
    write_queue_capacity: int | None = None
    commit_batch_size: float | None = None
    commit_latency_ms: float | None = None
    commit_latency_max_ms: float | None = None
    executors_running: int | None = None
    sessions_by_status: dict[str, int] | None = None


class WriteResult(msgspec.Struct, kw_only=True):
    session_id: str
    version: int
    position: int


class ResolveResult(msgspec.Struct, kw_only=True):
    session_id: str


class SessionListResult(msgspec.Struct, kw_only=True):
    sessions: list[SessionSummary]
    next_cursor: str | None
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`


class ResumeInfo(msgspec.Struct, kw_only=True):
    paused_at: str | None
    resume_from: str | None
    memory: dict[str, Any]
    next_node: str | None
    checkpoint_id: str | None


class SessionResumeResult(msgspec.Struct, kw_only=True):
    state: SessionState
    resume: ResumeInfo


class DeleteResult(msgspec.Struct, kw_only=True):
    deleted: bool


class MessageAppendResult(WriteResult, kw_only=True):
    message_id: str
    sequence: int


class MessagePopResult(msgspec.Struct, kw_only=True):
    session_id: str
    version: int
    position: int | None  # None: there was nothing to pop, nothing was written
    message: Message | None


class MessageClearResult(msgspec.Struct, kw_only=True):
    session_id: str
    version: int
    position: int | None  # None: there was nothing to clear, nothing was written
    removed: int


class MessageAppendManyResult(WriteResult, kw_only=True):
    message_ids: list[str]
    first_sequence: int


class MessageListResult(msgspec.Struct, kw_only=True):
    messages: list[Message]
    total: int
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`


class TokensRecordResult(WriteResult, kw_only=True):
    token_usage: TokenUsage


class ProgressRecordResult(WriteResult, kw_only=True):
    progress: Progress


class CheckpointSaveResult(WriteResult, kw_only=True):
    checkpoint_id: str


class CheckpointGetResult(msgspec.Struct, kw_only=True):
    checkpoint_id: str
    node_id: str | None
    resume_from: str | None
    memory: dict[str, Any]
    payload: Any
    created_at: str
    version: int


class CheckpointInfo(msgspec.Struct, kw_only=True):
    checkpoint_id: str
    node_id: str | None
    created_at: str
    size: int
    version: int


class CheckpointListParams(SessionRef, kw_only=True, forbid_unknown_fields=True):
    after_version: NonNegInt = 0  # the `next` of the previous page


class CheckpointListResult(msgspec.Struct, kw_only=True):
    checkpoints: list[CheckpointInfo]
    next: int | None = None  # set when the page ended at max_page_bytes: the after_version
    truncated_by_bytes: bool = False


class MemoryUpdateResult(WriteResult, kw_only=True):
    memory: dict[str, Any]


class EventsReadResult(msgspec.Struct, kw_only=True):
    events: list[Event]
    next: int | None
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`


class VerifyProblem(msgspec.Struct, kw_only=True):
    session_id: str | None
    problem: str


class VerifyResult(msgspec.Struct, kw_only=True):
    ok: bool
    checked_sessions: int
    problems: list[VerifyProblem]


class BackupResult(msgspec.Struct, kw_only=True):
    path: str
    bytes: int
    position: int


class CleanupResult(msgspec.Struct, kw_only=True):
    deleted: int
    session_ids: list[str]


class SubscribeResult(msgspec.Struct, kw_only=True):
    subscription: str
    position: int  # events after this position follow


class UnsubscribeResult(msgspec.Struct, kw_only=True):
    ok: bool


class SubscriptionEvent(msgspec.Struct, kw_only=True):
    subscription: str
    event: Event


class SubscriptionCaughtUp(msgspec.Struct, kw_only=True):
    subscription: str
    position: int


class SubscriptionDropped(msgspec.Struct, kw_only=True):
    subscription: str
    reason: str
    last_position: int


# method name -> (params type, result type). The daemon decodes params with the
# first; the client decodes results with the second.
# --- executors -----------------------------------------------------------------

Adapter = Literal["jsonl", "codex", "claude"]


class SessionSpawnParams(Params, kw_only=True, forbid_unknown_fields=True):
    argv: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[^\x00]+$")]],
                    msgspec.Meta(min_length=1)]
    cwd: NoNul | None = None  # absolute; default: the daemon's working directory
    env: dict[NoNul, NoNul] = {}  # added to the daemon's environment
    adapter: Adapter = "jsonl"
    task: str | None = None  # the first user message, written to the process's stdin
    model: str | None = None
    source: str = "user"
    session_id: SessionId | None = None
    namespace: str | None = None
    metadata: dict[str, Any] = {}


class SessionInjectParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    message: Annotated[str, msgspec.Meta(min_length=1)]


class SessionOutputParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    turn: PosInt | None = None  # default: the latest turn
    stream: Literal["stdout", "stderr"] | None = None  # default: both, in arrival order
    after_position: NonNegInt = 0  # the `next` of the previous page


class OutputResult(msgspec.Struct, kw_only=True):
    turn: int
    lines: list[str]
    next: int | None = None  # set when the page ended at max_page_bytes: the after_position
    truncated_by_bytes: bool = False


class SessionTrajectoryParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    full: bool = False
    max_output_len: PosInt = 200


class Step(msgspec.Struct, kw_only=True):
    type: str
    summary: str
    details: dict[str, Any] = {}
    turn: int = 0


class TrajectoryResult(msgspec.Struct, kw_only=True):
    steps: list[Step]


# --- graphs (LangGraph checkpoints) ----------------------------------------------


class GraphPutParams(GraphCheckpoint, kw_only=True, forbid_unknown_fields=True):
    session_id: SessionId


class GraphPutWritesParams(GraphWrites, kw_only=True, forbid_unknown_fields=True):
    session_id: SessionId


class GraphGetParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    ns: str = ""
    checkpoint_id: str | None = None  # default: the latest in `ns`


class GraphListParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str | None = None  # default: every thread
    ns: str | None = None  # default: every namespace
    checkpoint_id: str | None = None
    before: str | None = None  # only checkpoint ids below this one
    filter: dict[str, Any] = {}  # metadata keys that must be equal
    limit: NonNegInt | None = None
    cursor: str | None = None  # the `next` of the previous page


class PendingWrite(msgspec.Struct, kw_only=True):
    task_id: str
    channel: str
    value: Typed
    task_path: str = ""


class GraphTuple(msgspec.Struct, kw_only=True):
    session_id: str
    thread_id: str
    ns: str
    checkpoint_id: str
    parent_id: str | None
    checkpoint: Typed
    metadata: dict[str, Any]
    metadata_typed: Typed | None
    channel_versions: dict[str, str]
    channel_values: dict[str, Typed]
    pending_writes: list[PendingWrite]


class GraphGetResult(msgspec.Struct, kw_only=True):
    tuple: GraphTuple | None


class GraphListResult(msgspec.Struct, kw_only=True):
    tuples: list[GraphTuple]
    next: str | None = None  # set when the page ended at max_page_bytes: the next cursor
    truncated_by_bytes: bool = False


class GraphRunsParams(Params, kw_only=True, forbid_unknown_fields=True):
    run_ids: list[str]


class GraphCopyParams(Params, kw_only=True, forbid_unknown_fields=True):
    source_session_id: str
    target_session_id: SessionId
    target_thread_id: str


class GraphPruneParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_ids: list[str]
    strategy: Literal["keep_latest", "delete"] = "keep_latest"


class GraphChangeResult(msgspec.Struct, kw_only=True):
    checkpoints: int  # checkpoints pruned, deleted or copied
    sessions: list[str]  # sessions written to


# --- scoped state and bulk views (Google ADK) ------------------------------------


class StateGetParams(Params, kw_only=True, forbid_unknown_fields=True):
    app_name: Annotated[str, msgspec.Meta(min_length=1)]
    user_ids: list[str] = []


class StateGetResult(msgspec.Struct, kw_only=True):
    app: dict[str, Any]
    users: dict[str, dict[str, Any]]


class SessionStatesParams(Params, kw_only=True, forbid_unknown_fields=True):
    namespace: Annotated[str, msgspec.Meta(min_length=1)]
    prefix: bool = False  # every namespace that starts with `namespace`
    limit: Limit1000 = 1000
    cursor: str | None = None  # the `next` of the previous page


class SessionStatesResult(msgspec.Struct, kw_only=True):
    states: list[SessionState]
    next: str | None
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`


# --- search and fork (docs/protocol.md: session.search, session.fork) --------------------

SearchQuery = Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]


class SessionSearchParams(Params, kw_only=True, forbid_unknown_fields=True):
    query: SearchQuery  # FTS5 query syntax: words, "phrases", prefix*, AND OR NOT, NEAR()
    status: list[Status] | None = None
    namespace: str | None = None
    actor_name: str | None = None
    since: str | None = None  # the matching event's time, RFC 3339
    until: str | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 20  # sessions per page
    hits: Annotated[int, msgspec.Meta(ge=1, le=20)] = 3  # snippets per session
    mark: tuple[Annotated[str, msgspec.Meta(max_length=16)],
                Annotated[str, msgspec.Meta(max_length=16)]] = ("\u00ab", "\u00bb")
    cursor: str | None = None


class SearchHit(msgspec.Struct, kw_only=True):
    """One matching event: a message (with its sequence) or a session field."""

    position: int
    version: int
    type: str
    recorded_at: str
    snippet: str  # the match between the two `mark` strings
    sequence: int | None = None  # message.appended only
    role: str | None = None
    current: bool | None = None  # the message is still in the conversation (not popped)


class SearchSession(msgspec.Struct, kw_only=True):
    session_id: str
    status: str
    namespace: str
    actor_name: str | None
    task: str | None
    updated_at: str
    # bm25 of its best hit; for a broad query minus its newest match's position. Lower first.
    score: float
    matches: int  # events of the session that match
    hits: list[SearchHit]


class SearchResult(msgspec.Struct, kw_only=True):
    sessions: list[SearchSession]
    # False when more events matched than one query ranks (the newest 5,000 were):
    # narrow the query or add filters to reach older ones.
    complete: bool = True
    next_cursor: str | None = None


class SessionForkParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    at_version: PosInt | None = None  # default: the latest
    new_session_id: SessionId | None = None
    idempotency_key: IdempotencyKey | None = None


class SessionForksParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    limit: Limit1000 = 100
    cursor: str | None = None


class ForkInfo(msgspec.Struct, kw_only=True):
    session_id: str
    version: int  # the source's version the fork was taken at
    forked_at: str


class ForksResult(msgspec.Struct, kw_only=True):
    session_id: str
    forked_from: ForkLink | None  # this session's own source
    count: int
    forks: list[ForkInfo]
    next_cursor: str | None = None


class ReindexResult(msgspec.Struct, kw_only=True):
    indexed: int  # events in the search index after the rebuild
    forks: int


METHODS: Final[dict[str, tuple[type[msgspec.Struct], Any]]] = {
    "daemon.ping": (NoParams, PingResult),
    "daemon.stats": (NoParams, StatsResult),
    "daemon.verify": (NoParams, VerifyResult),
    "daemon.backup": (BackupParams, BackupResult),
    "session.create": (SessionCreateParams, SessionState),
    "session.get": (SessionGetParams, SessionState),
    "session.resolve": (SessionResolveParams, ResolveResult),
    "session.list": (SessionListParams, SessionListResult),
    "session.transition": (SessionTransitionParams, SessionState),
    "session.resume": (SessionResumeParams, SessionResumeResult),
    "session.delete": (SessionDeleteParams, DeleteResult),
    "session.cleanup": (SessionCleanupParams, CleanupResult),
    "session.export": (SessionRef, Any),
    "session.import": (SessionImportParams, SessionState),
    "message.append": (MessageAppendParams, MessageAppendResult),
    "message.append_many": (MessageAppendManyParams, MessageAppendManyResult),
    "message.list": (MessageListParams, MessageListResult),
    "message.pop": (WriteParams, MessagePopResult),
    "message.clear": (WriteParams, MessageClearResult),
    "tokens.record": (TokensRecordParams, TokensRecordResult),
    "progress.record": (ProgressRecordParams, ProgressRecordResult),
    "checkpoint.save": (CheckpointSaveParams, CheckpointSaveResult),
    "checkpoint.get": (CheckpointGetParams, CheckpointGetResult),
    "checkpoint.list": (CheckpointListParams, CheckpointListResult),
    "memory.update": (MemoryUpdateParams, MemoryUpdateResult),
    "events.append": (EventsAppendParams, WriteResult),
    "events.read": (EventsReadParams, EventsReadResult),
    "events.subscribe": (EventsSubscribeParams, SubscribeResult),
    "events.unsubscribe": (EventsUnsubscribeParams, UnsubscribeResult),
    "session.spawn": (SessionSpawnParams, SessionState),
    "session.inject": (SessionInjectParams, SessionState),
    "session.kill": (SessionRef, SessionState),
    "session.output": (SessionOutputParams, OutputResult),
    "session.trajectory": (SessionTrajectoryParams, TrajectoryResult),
    "graph.put": (GraphPutParams, WriteResult),
    "graph.put_writes": (GraphPutWritesParams, WriteResult),
    "graph.get": (GraphGetParams, GraphGetResult),
    "graph.list": (GraphListParams, GraphListResult),
    "graph.delete_runs": (GraphRunsParams, GraphChangeResult),
    "graph.copy": (GraphCopyParams, GraphChangeResult),
    "graph.prune": (GraphPruneParams, GraphChangeResult),
    "state.get": (StateGetParams, StateGetResult),
    "session.states": (SessionStatesParams, SessionStatesResult),
    "session.search": (SessionSearchParams, SearchResult),
    "session.fork": (SessionForkParams, SessionState),
    "session.forks": (SessionForksParams, ForksResult),
    "daemon.reindex": (NoParams, ReindexResult),
}
