"""The fold: the only code that knows how an event changes a SessionState."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from datetime import UTC, timedelta
from typing import Any, TypeVar

import msgspec
from msgspec.structs import replace

from sessiond_schemas.bounds import INT64_MAX
from sessiond_schemas.events import (
    EXPIRABLE,
    TERMINAL_STATUSES,
    CheckpointSaved,
    Event,
    HistoryTrimmed,
    MemoryUpdated,
    MessageAppended,
    MessagesTruncated,
    MetadataUpdated,
    PlanLinked,
    ProcessDetached,
    ProcessExited,
    ProcessStarted,
    ProgressRecorded,
    Record,
    ResultRecorded,
    SessionCompacted,
    SessionCreated,
    SessionExpired,
    SessionForked,
    StateUpdated,
    StatusChanged,
    TokensRecorded,
    TtlSet,
    Unread,
    parse_time,
)
from sessiond_schemas.state import (
    ContextStart,
    ForkLink,
    HistoryStart,
    Message,
    SessionFields,
    SessionState,
    Timestamps,
)


class FoldError(ValueError):
    """The events do not make a valid history (a bug or a corrupt store, never user input)."""


class SumOutOfBounds(FoldError):
    """Adding an event's number would take a total of the view past an int64 or to a
    non-finite float. `field` is the event's data field, `total` the view's field."""

    def __init__(self, field: str, total: str, value: Any) -> None:
        super().__init__(f"adding {field} = {value!r} would take {total} past its bound"
                         f" ({'a finite number' if isinstance(value, float) else INT64_MAX})")
        self.field, self.total, self.value = field, total, value
        self.version = 0  # of the event, set by fold


def _add(current: Any, delta: Any, field: str, total: str) -> Any:
    """`current + delta`, refused if the sum leaves int64 or is not finite."""
    out = current + delta
    if (isinstance(out, float) and not math.isfinite(out)) or (
            isinstance(out, int) and not -INT64_MAX - 1 <= out <= INT64_MAX):
        raise SumOutOfBounds(field, total, delta)
    return out


def apply(state: SessionState | None, event: Event) -> SessionState:
    """Return the state after one event; `state` itself is left unchanged."""
    return fold(state, (event,))


def fold(state: SessionState | None, events: Iterable[Event]) -> SessionState:
    """Return the state after `events`, in order; `state` itself is left unchanged.

    Each branch gets its event's data as its type's Struct (`Event.data`: typed once,
    when first read, or the Struct the writer built); the types in _UNREAD are given
    None and their data is not decoded."""
    it = iter(events)
    if state is None:
        first = next(it, None)
        if first is None or first.type not in ("session.created", "session.forked"):
            raise FoldError("a session's history must start with session.created"
                            " (or session.forked)")
        try:
            d = _typed(first)
            work = (_created(first, d) if isinstance(d, SessionCreated)
                    else _forked(first, _as(d, SessionForked)))
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise FoldError(f"event {first.event_id} (session {first.session_id}, version"
                            f" {first.version}, {first.type}) does not fold: {exc}") from exc
    else:
        work = _thaw(state)
    for event in it:
        if event.version != work.version + 1 or event.session_id != work.session_id:
            raise FoldError(
                f"event {event.event_id} (session {event.session_id}, version {event.version}) "
                f"does not follow version {work.version} of {work.session_id}"
            )
        branch = _BRANCHES.get(event.type)
        if branch is None:
            raise FoldError(f"unknown event type {event.type!r}")
        try:
            branch(work, event, None if event.type in _UNREAD else _typed(event))
        except SumOutOfBounds as exc:
            exc.version = event.version
            raise
        except FoldError:
            raise
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            # Data that does not decode (msgspec.ValidationError is a ValueError).
            raise FoldError(f"event {event.event_id} (session {event.session_id}, version"
                            f" {event.version}, {event.type}) does not fold: {exc}") from exc
        work.version = event.version
        work.timestamps.updated_at = event.recorded_at
    try:
        _derive(work)
    except (ValueError, OverflowError) as exc:  # times no daemon wrote (an imported history)
        raise FoldError(f"session {work.session_id} at version {work.version} has times"
                        f" that do not compute: {exc}") from exc
    return work


def merge_patch(target: Any, patch: Any) -> Any:
    """Apply an RFC 7396 JSON merge patch, building new dicts (the target is not changed)."""
    if not isinstance(patch, dict):
        return patch
    merged = dict(target) if isinstance(target, dict) else {}
    for key, value in patch.items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = merge_patch(merged.get(key), value)
    return merged


def _typed(event: Event) -> msgspec.Struct:
    """The event's data as its type's Struct; ValueError when it does not decode."""
    data = event.data
    if isinstance(data, Unread):
        raise ValueError(data.error)
    return data


D = TypeVar("D", bound=msgspec.Struct)


def _as(data: msgspec.Struct, kind: type[D]) -> D:
    if not isinstance(data, kind):
        raise TypeError(f"{type(data).__name__} given where {kind.__name__} was expected")
    return data


def _thaw(s: SessionState) -> SessionState:
    # Copy every container a branch appends to in place. memory, metadata,
    # input_data, result.output and last_message are only ever replaced whole.
    p, m = s.progress, s.metrics
    return replace(
        s,
        timestamps=replace(s.timestamps),
        progress=replace(
            p,
            nodes_with_failures=list(p.nodes_with_failures),
            retry_details=dict(p.retry_details),
            node_visit_counts=dict(p.node_visit_counts),
        ),
        result=replace(s.result),
        token_usage=replace(s.token_usage),
        metrics=replace(m, nodes_executed=list(m.nodes_executed)),
        problems=list(s.problems),
        decisions=list(s.decisions),
        linked_plan_ids=list(s.linked_plan_ids),
    )


def _created(event: Event, d: SessionCreated) -> SessionState:
    at = event.recorded_at
    return SessionState(
        session_id=event.session_id,
        version=event.version,
        **{f: getattr(d, f) for f in SessionFields.__struct_fields__},
        status=d.status,
        timestamps=Timestamps(
            created_at=at, updated_at=at, started_at=at if d.status == "active" else None
        ),
        input_data=d.input_data,
        metadata=d.metadata,
        checkpoint_enabled=d.checkpoint_enabled,
    )


def _forked(event: Event, d: SessionForked) -> SessionState:
    """A fork starts from its source's view at the fork point, under its own id. The pid
    is the source's process, never the fork's: a fork is data, not a process."""
    source = msgspec.convert(d.state, SessionState)
    work = _thaw(source)
    work.session_id = event.session_id
    work.version = event.version
    work.timestamps.updated_at = event.recorded_at
    work.pid = None
    work.forked_from = ForkLink(session_id=d.from_.session_id, version=d.from_.version)
    return work


def _session_created(s: SessionState, event: Event, d: None) -> None:
    raise FoldError(f"session {s.session_id} was created twice (event {event.event_id})")


def _status_changed(s: SessionState, event: Event, d: StatusChanged) -> None:
    t, p = s.timestamps, s.progress
    s.status = d.to
    if d.to == "active":
        t.started_at = t.started_at or event.recorded_at
        t.completed_at = None
        t.paused_at_time = None
        p.paused_at = None
    elif d.to == "paused":
        t.paused_at_time = event.recorded_at
        # Where it paused: the node named, else the node it was running.
        p.paused_at = d.paused_at or p.current_node
    elif d.to in TERMINAL_STATUSES:
        t.completed_at = event.recorded_at
        if d.to == "completed" and s.result.success is None:
            s.result.success = True
        elif d.to == "failed" and s.result.success is None:
            s.result.success = False
    if d.resume_from is not None:
        p.resume_from = d.resume_from
    if d.error is not None:
        s.error = d.error
        s.result.error = d.error


def _ttl_set(s: SessionState, event: Event, d: TtlSet) -> None:
    s.ttl_s = d.ttl_s


def _session_expired(s: SessionState, event: Event, d: SessionExpired) -> None:
    """The daemon ended the session for its idle TTL (features/expiry.py decides when)."""
    s.status = "expired"
    s.timestamps.completed_at = event.recorded_at


def _message_appended(s: SessionState, event: Event, d: MessageAppended) -> None:
    s.message_count += 1
    s.last_message = Message(
        message_id=d.message_id,
        sequence=d.sequence,
        role=d.role,
        content=d.content,
        timestamp=event.recorded_at,
        tool_call_id=d.tool_call_id,
        metadata=d.metadata,
    )


def _messages_truncated(s: SessionState, event: Event, d: MessagesTruncated) -> None:
    s.message_count = min(s.message_count, d.from_sequence)
    if s.context is not None and d.from_sequence <= s.context.through_sequence:
        s.context = None  # a cut behind the summary: the summary no longer stands for them
    s.last_message = (msgspec.convert(d.last_message, Message)
                      if d.last_message is not None and s.message_count else None)


def _session_compacted(s: SessionState, event: Event, d: SessionCompacted) -> None:
    """The context now starts at this summary (the history before it stays)."""
    s.context = ContextStart(session_id=event.session_id, version=event.version,
                             through_sequence=d.through_sequence,
                             recorded_at=event.recorded_at)


def _session_trimmed(s: SessionState, event: Event, d: HistoryTrimmed) -> None:
    """The stored history now starts after `through_version` (the events before are gone)."""
    s.history = HistoryStart(version=d.through_version + 1, anchor=d.anchor,
                             through_sequence=d.through_sequence)


def _tokens_recorded(s: SessionState, event: Event, d: TokensRecorded) -> None:
    u, p = s.token_usage, s.progress
    u.input_tokens = _add(u.input_tokens, d.input_tokens, "input_tokens",
                          "token_usage.input_tokens")
    u.output_tokens = _add(u.output_tokens, d.output_tokens, "output_tokens",
                           "token_usage.output_tokens")
    u.estimated_cost = _add(u.estimated_cost, d.estimated_cost, "estimated_cost",
                            "token_usage.estimated_cost")
    p.total_tokens = _add(p.total_tokens, d.input_tokens, "input_tokens", "progress.total_tokens")
    p.total_tokens = _add(p.total_tokens, d.output_tokens, "output_tokens",
                          "progress.total_tokens")


def _progress_recorded(s: SessionState, event: Event, d: ProgressRecorded) -> None:
    p, m, node = s.progress, s.metrics, d.node_id
    # The path and the edges are not kept: progress.list pages through the steps.
    p.current_node = node
    p.steps_executed += 1
    p.node_visit_counts[node] = p.node_visit_counts.get(node, 0) + 1
    p.total_latency_ms = _add(p.total_latency_ms, d.latency_ms, "latency_ms",
                              "progress.total_latency_ms")
    p.total_tokens = _add(p.total_tokens, d.tokens, "tokens", "progress.total_tokens")
    if d.retries:
        p.total_retries = _add(p.total_retries, d.retries, "retries", "progress.total_retries")
        p.retry_details[node] = _add(p.retry_details.get(node, 0), d.retries, "retries",
                                     f"progress.retry_details.{node}")
    if d.failed:
        p.had_partial_failures = True
        if node not in p.nodes_with_failures:
            p.nodes_with_failures.append(node)
    if node not in m.nodes_executed:
        m.nodes_executed.append(node)


def _checkpoint_saved(s: SessionState, event: Event, d: CheckpointSaved) -> None:
    s.latest_checkpoint_id = d.checkpoint_id
    s.checkpoint_count += 1
    s.checkpoint_enabled = True  # saving one means the session uses checkpoints


def _memory_updated(s: SessionState, event: Event, d: MemoryUpdated) -> None:
    s.memory = merge_patch(s.memory, d.patch)


def _metadata_updated(s: SessionState, event: Event, d: MetadataUpdated) -> None:
    s.metadata = merge_patch(s.metadata, d.patch)


def _result_recorded(s: SessionState, event: Event, d: ResultRecorded) -> None:
    s.result.success, s.result.output, s.result.error = d.success, d.output, d.error
    if d.error is not None:
        s.error = d.error


def _problem_recorded(s: SessionState, event: Event, d: Record) -> None:
    s.problems.append(d.body)
    s.metrics.problem_count += 1


def _decision_recorded(s: SessionState, event: Event, d: Record) -> None:
    s.decisions.append(d.body)
    s.metrics.decision_count += 1


def _plan_linked(s: SessionState, event: Event, d: PlanLinked) -> None:
    if d.plan_id not in s.linked_plan_ids:
        s.linked_plan_ids.append(d.plan_id)


def _process_started(s: SessionState, event: Event, d: ProcessStarted) -> None:
    # A new turn starts clean: the last turn's error belongs to that turn's history.
    s.pid, s.turn, s.exit_code, s.error = d.pid, d.turn, None, None


def _process_output(s: SessionState, event: Event, d: None) -> None:
    """Raw executor output is history only; it changes nothing but updated_at."""


def _process_exited(s: SessionState, event: Event, d: ProcessExited) -> None:
    s.exit_code = d.exit_code


def _process_detached(s: SessionState, event: Event, d: ProcessDetached) -> None:
    """A restart found the turn unsupervised: say why (the status change, if any, follows)."""
    if not d.imported:  # an import's mark leaves the view as it was
        s.error = d.reason


def _state_updated(s: SessionState, event: Event, d: StateUpdated) -> None:
    """Session-scoped keys land in `memory`; app and user state live in their own index."""
    if d.scope == "session":
        s.memory = {**s.memory, **d.delta}


def _stream_chunk(s: SessionState, event: Event, d: None) -> None:
    """A generic stream's bytes are history only (read back over HTTP, searched as text);
    the view records that the stream moved (updated_at)."""


def _graph_event(s: SessionState, event: Event, d: None) -> None:
    """LangGraph checkpoints, writes and prunes live in their own index (graph.get,
    graph.list); the session view records only that the thread moved (updated_at)."""


def expiry_time(last_event_at: str, ttl_s: int) -> str:
    """`last_event_at` + `ttl_s`, in the events' own time format (so times compare as text)."""
    at = parse_time(last_event_at) + timedelta(seconds=ttl_s)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def _derive(s: SessionState) -> None:
    """Recompute seed 000's computed fields from the rest of the state."""
    t, p = s.timestamps, s.progress
    start = t.started_at or t.created_at
    s.duration_ms = (
        int((parse_time(t.completed_at) - parse_time(start)).total_seconds() * 1000)
        if t.completed_at
        else 0
    )
    s.is_resumable = s.status in ("paused", "failed") and (
        p.resume_from is not None or p.paused_at is not None
    )
    s.is_resumable_from_checkpoint = s.checkpoint_enabled and s.latest_checkpoint_id is not None
    s.expires_at = (expiry_time(t.updated_at, s.ttl_s)
                    if s.ttl_s is not None and s.status in EXPIRABLE else None)
    if s.status == "failed" or s.result.success is False:
        p.execution_quality = "failed"
    elif p.total_retries > 0 or p.had_partial_failures:
        p.execution_quality = "degraded"
    else:
        p.execution_quality = "clean"


# Types whose branch reads nothing of the data: the fold does not decode theirs (a graph
# checkpoint's blobs can be megabytes), and their branch is given None. Each other
# branch is given its type's data Struct.
_UNREAD = frozenset({
    "session.created", "session.forked",  # a second creation is refused, unread
    "process.output", "graph.checkpoint", "graph.writes", "graph.pruned",  # history only
    "stream.chunk",
})

_BRANCHES: dict[str, Callable[[SessionState, Event, Any], None]] = {
    "session.created": _session_created,
    "session.forked": _session_created,
    "session.status_changed": _status_changed,
    "session.ttl_set": _ttl_set,
    "session.expired": _session_expired,
    "message.appended": _message_appended,
    "messages.truncated": _messages_truncated,
    "graph.checkpoint": _graph_event,
    "graph.writes": _graph_event,
    "graph.pruned": _graph_event,
    "state.updated": _state_updated,
    "tokens.recorded": _tokens_recorded,
    "progress.recorded": _progress_recorded,
    "checkpoint.saved": _checkpoint_saved,
    "memory.updated": _memory_updated,
    "metadata.updated": _metadata_updated,
    "result.recorded": _result_recorded,
    "problem.recorded": _problem_recorded,
    "decision.recorded": _decision_recorded,
    "plan.linked": _plan_linked,
    "process.started": _process_started,
    "process.output": _process_output,
    "process.exited": _process_exited,
    "process.detached": _process_detached,
    "stream.chunk": _stream_chunk,
    "session.compacted": _session_compacted,
    "session.trimmed": _session_trimmed,
}
