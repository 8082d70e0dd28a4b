"""SessionState: the view of one session that the fold derives from its events."""

from __future__ import annotations

from typing import Annotated, Any, Final

import msgspec

from .bounds import Float64, Int64, NonNegInt, PosInt

MAX_TTL_S: Final = 10 * 365 * 86_400  # ten years
# A session's idle TTL: seconds after its last event at which the daemon ends it.
TtlSeconds = Annotated[int, msgspec.Meta(ge=1, le=MAX_TTL_S)]


class Timestamps(msgspec.Struct, kw_only=True):
    created_at: str
    updated_at: str
    started_at: str | None = None
    completed_at: str | None = None
    paused_at_time: str | None = None


class Progress(msgspec.Struct, kw_only=True):
    """Counts, totals and current values of a graph's steps (protocol 1.2: bounded).

    The path itself (one node per step) and the edges grow with every step, so they are
    not kept here: `progress.list` pages through the steps, and the clients'
    `session_state_dict` rebuilds `path` and `metrics.edges_traversed` whole from it.
    Per-node maps and lists are bounded by the number of distinct nodes."""

    current_node: str | None = None
    paused_at: str | None = None
    resume_from: str | None = None
    steps_executed: NonNegInt = 0
    total_tokens: NonNegInt = 0
    total_latency_ms: NonNegInt = 0
    total_retries: NonNegInt = 0
    nodes_with_failures: list[str] = []
    retry_details: dict[str, NonNegInt] = {}
    had_partial_failures: bool = False
    execution_quality: str = "clean"
    node_visit_counts: dict[str, NonNegInt] = {}


class ProgressStep(msgspec.Struct, kw_only=True):
    """One graph step, as `progress.list` shows it: its progress.recorded event's data,
    the session version that recorded it and when."""

    version: PosInt
    node_id: str
    edge: str | None = None
    latency_ms: NonNegInt = 0
    tokens: NonNegInt = 0
    retries: NonNegInt = 0
    failed: bool = False
    recorded_at: str


class Result(msgspec.Struct, kw_only=True):
    success: bool | None = None
    error: str | None = None
    output: dict[str, Any] = {}


class TokenUsage(msgspec.Struct, kw_only=True):
    input_tokens: NonNegInt = 0
    output_tokens: NonNegInt = 0
    estimated_cost: Float64 = 0.0


class Metrics(msgspec.Struct, kw_only=True):
    decision_count: NonNegInt = 0
    problem_count: NonNegInt = 0
    nodes_executed: list[str] = []  # distinct nodes, in first-visit order


class Message(msgspec.Struct, kw_only=True):
    """One message of a session, as `message.list` and `last_message` show it."""

    message_id: str
    sequence: NonNegInt
    role: str
    content: str
    timestamp: str
    tool_call_id: str | None = None
    metadata: dict[str, Any] = {}


class ForkLink(msgspec.Struct, kw_only=True):
    """A fork's source: the session and the version its history was taken at."""

    session_id: str
    version: PosInt


class ContextStart(msgspec.Struct, kw_only=True):
    """Where a session's context starts: its last compaction (session.context reads it).
    `session_id` holds the session.compacted event (a fork's source, for a compaction it
    inherited), at `version`; the context's messages are those after `through_sequence`."""

    session_id: str
    version: PosInt
    through_sequence: Int64
    recorded_at: str


class HistoryStart(msgspec.Struct, kw_only=True):
    """Where a trimmed session's stored history starts (session.trimmed): its first
    version kept, the anchor its chain goes on from (the hash of the version before),
    and the last message sequence gone (-1: none)."""

    version: PosInt
    anchor: str
    through_sequence: Int64


class SessionFields(msgspec.Struct, kw_only=True):
    """What a session is, as session.created gives it and SessionState keeps it: declared
    once, inherited by both (their other fields follow these)."""

    namespace: str = "local"
    actor_name: str | None = None
    goal_id: str | None = None
    agent_id: str | None = None
    stream_id: str | None = None
    correlation_id: str | None = None
    entry_point: str = "start"
    task: str | None = None
    working_dir: str | None = None
    model: str | None = None
    adapter: str | None = None
    source: str = "user"
    automation_level: str | None = None
    isolation_level: str = "shared"
    # Idle TTL (seconds): the daemon ends the session (status expired) this long after its
    # last event. None at session.create: the namespace's default_ttl_s, if any.
    ttl_s: TtlSeconds | None = None


class SessionState(SessionFields, kw_only=True):
    """Everything the seeds keep about a session, derived only from its events.

    Mutable so the fold can build it cheaply; `projection` never changes a
    state it was given. (JSON lists SessionFields' fields first, then these.)
    """

    session_id: str
    version: NonNegInt
    status: str
    timestamps: Timestamps
    progress: Progress = msgspec.field(default_factory=Progress)
    result: Result = msgspec.field(default_factory=Result)
    token_usage: TokenUsage = msgspec.field(default_factory=TokenUsage)
    metrics: Metrics = msgspec.field(default_factory=Metrics)
    memory: dict[str, Any] = {}
    input_data: dict[str, Any] = {}
    metadata: dict[str, Any] = {}
    problems: list[dict[str, Any]] = []
    decisions: list[dict[str, Any]] = []
    linked_plan_ids: list[str] = []
    message_count: NonNegInt = 0
    last_message: Message | None = None
    checkpoint_enabled: bool = False
    latest_checkpoint_id: str | None = None
    checkpoint_count: NonNegInt = 0
    turn: NonNegInt = 0
    pid: Int64 | None = None
    exit_code: Int64 | None = None
    error: str | None = None
    # Derived by the fold after every event (seed 000's computed fields).
    duration_ms: Int64 = 0
    is_resumable: bool = False
    is_resumable_from_checkpoint: bool = False
    # Set only on a fork (session.fork): where its history up to `version` comes from.
    forked_from: ForkLink | None = None
    # When the idle TTL ends the session: the last event's time + ttl_s, while the status
    # is pending, active or paused; else None.
    expires_at: str | None = None
    # Where the context starts: the last compaction (session.compacted), None if none or
    # if a later cut (messages.truncated) went behind it. Older views read as None.
    context: ContextStart | None = None
    # Where the stored history starts, once retention trimmed it (session.trimmed); None:
    # it is whole. Older views read as None.
    history: HistoryStart | None = None

    def to_session_state_dict(self) -> dict[str, Any]:
        """Return the seed's executor resume dict (paused_at, resume_from, memory, next_node)."""
        return {
            "paused_at": self.progress.paused_at,
            "resume_from": self.progress.resume_from,
            "memory": self.memory,
            "next_node": None,
        }


class SessionSummary(msgspec.Struct, kw_only=True):
    """One row of `session.list`."""

    session_id: str
    status: str
    namespace: str
    actor_name: str | None
    task: str | None
    created_at: str
    updated_at: str
    message_count: NonNegInt
    token_usage: TokenUsage
