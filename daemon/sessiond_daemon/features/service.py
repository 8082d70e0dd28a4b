"""The service layer: one handler per contract method, turning params into commands and reads."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from importlib.metadata import PackageNotFoundError, version
from typing import Any, cast

import msgspec

from sessiond_daemon.core import projection
from sessiond_daemon.core.commands import (
    Commands,
    check_transition,
    created_view,
    default_ttl,
    params_command,
    require,
    sequenced,
)
from sessiond_daemon.core.histories import unreadable_error
from sessiond_daemon.core.request import page_budget
from sessiond_daemon.core.writer import Command, Delete, Plan, PlanData, Planner, Writer
from sessiond_daemon.features import forks
from sessiond_daemon.features.retention import check_version, gone
from sessiond_daemon.stores.interface import Page, SessionFilters, Store, repage
from sessiond_schemas import rpc, streams
from sessiond_schemas.bounds import INT64_MAX, bound_message, json_out_of_bounds
from sessiond_schemas.errors import (
    AmbiguousIdError,
    CheckpointNotFoundError,
    InvalidParamsError,
    OverloadedError,
    SessionExistsError,
    SessionNotFoundError,
    VersionConflictError,
)
from sessiond_schemas.events import (
    DATA_TYPES,
    CheckpointSaved,
    Event,
    EventMeta,
    MemoryUpdated,
    MessageAppended,
    MessageFields,
    MessagesTruncated,
    ProgressRecorded,
    Record,
    SessionCreated,
    Status,
    StatusChanged,
    TokensRecorded,
    TtlSet,
    new_id,
    parse_time,
)
from sessiond_schemas.state import ForkLink, Message, SessionState

__all__ = [
    "APPEND_INPUTS", "RUNNER_ONLY", "VERSION", "LiveFigures", "Service", "StatusChangeInput",
    "invalid_params", "normalise_time",
]

try:
    VERSION = version("sessiond")
except PackageNotFoundError:  # running from a source tree
    VERSION = "0+unknown"

_json = msgspec.json.Encoder()


class StatusChangeInput(msgspec.Struct, kw_only=True):
    """`session.status_changed` as events.append takes it: `from` is the daemon's to fill."""

    to: Status
    from_: Status | None = msgspec.field(default=None, name="from")
    reason: str | None = None
    error: str | None = None
    paused_at: str | None = None
    resume_from: str | None = None


# What events.append validates each type's data with; None: not appendable that way.
APPEND_INPUTS: dict[str, type[msgspec.Struct] | None] = {
    **DATA_TYPES,
    "session.created": None,
    "checkpoint.saved": None,
    "message.appended": MessageFields,
    "session.status_changed": StatusChangeInput,
    "messages.truncated": None,
    "graph.checkpoint": None,
    "graph.writes": None,
    "graph.pruned": None,
    "session.forked": None,
    "session.ttl_set": None,
    "session.expired": None,
    "session.compacted": rpc.CompactionInput,
    "session.trimmed": None,
}
_INSTEAD = {"session.created": "session.create", "checkpoint.saved": "checkpoint.save",
            "messages.truncated": "message.pop or message.clear",
            "graph.checkpoint": "graph.put", "graph.writes": "graph.put_writes",
            "graph.pruned": "graph.prune or graph.delete_runs", "session.forked": "session.fork",
            "session.ttl_set": "session.set_ttl",
            "session.expired": "session.set_ttl (the daemon ends a session whose TTL passed)",
            "session.trimmed": "session.trim"}
# How often a write planned from reads (message.pop, message.clear, replace_from) is tried
# when other writes keep coming between its read and its commit.
READ_TRIES = 64

# Written only by the daemon's executor runner: their pids are what it signals, so a
# client never writes them (docs/security.md). Imported copies are history only.
RUNNER_ONLY = frozenset({"process.started", "process.output", "process.exited",
                         "process.detached"})


def _data_paths(inputs: list[tuple[str, dict[str, Any]]]) -> list[str]:
    """Where each events[i].data sits in the params (errors name the field)."""
    return [f"$.events[{i}].data" for i in range(len(inputs))]


def _write_result(state: SessionState, events: list[Event], **extra: Any) -> dict[str, Any]:
    return {"session_id": state.session_id, "version": state.version,
            "position": events[-1].position, **extra}


def _cut_result(state: SessionState, events: list[Event], popped: Message | None,
                removed: int, pop: bool) -> dict[str, Any]:
    """message.pop answers with the message taken out; message.clear with how many."""
    return {"session_id": state.session_id, "version": state.version,
            "position": events[-1].position if events else None,
            **({"message": popped} if pop else {"removed": removed})}


def _too_busy(session_id: str, method: str) -> OverloadedError:
    """A write planned from reads (message.pop, message.clear, replace_from) lost READ_TRIES
    times in a row to writes that came between its read and its commit: it ends, -32008,
    retryable, instead of trying for ever."""
    return OverloadedError(
        f"{method}: session {session_id} changed between the read and the write"
        f" {READ_TRIES} times in a row (other writes keep coming); nothing was written:"
        " retry later, or pass expected_version",
        {"retry_after_ms": 100, "detail": "session too busy", "session_id": session_id,
         "tries": READ_TRIES})


def _message_data(m: MessageFields, sequence: int) -> MessageAppended:
    return MessageAppended(message_id=new_id(), sequence=sequence, role=m.role,
                           content=m.content, tool_call_id=m.tool_call_id, metadata=m.metadata)


def normalise_time(value: str | None, path: str) -> str | None:
    if value is None:
        return None
    try:
        return parse_time(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except ValueError as exc:
        raise InvalidParamsError(f"{path[2:]} is not an RFC 3339 time: {value!r}",
                                 {"detail": str(exc), "path": path}) from exc


@dataclass(frozen=True, slots=True)
class LiveFigures:
    """The figures of daemon.stats that the server knows, not the store."""

    connections: int = 0
    subscriptions: int = 0
    executors_running: int = 0
    reply_bytes_held: int = 0
    reply_bytes_budget: int = 0
    connections_paused: int = 0
    connections_closed_by_budget: int = 0


class Service:
    """The contract's session, message and event methods over one store and its writer."""

    def __init__(self, commands: Commands, store: Store, writer: Writer) -> None:
        self.commands = commands
        self.store = store
        self.writer = writer
        self.started = time.monotonic()
        self._live: Callable[[], LiveFigures] = LiveFigures

    def on_stats(self, figures: Callable[[], LiveFigures]) -> None:
        """Register where daemon.stats reads connections, subscriptions and executors."""
        self._live = figures

    # The session's current view (the commands' own), read by the handlers below.

    async def state(self, session_id: str) -> SessionState:
        return await self.commands.state(session_id)

    # --- daemon ---------------------------------------------------------------------

    async def daemon_ping(self, p: rpc.NoParams, meta: EventMeta) -> rpc.PingResult:
        return rpc.PingResult(pong=True, version=VERSION,
                              uptime_s=round(time.monotonic() - self.started, 3),
                              protocol=rpc.PROTOCOL_VERSION, methods=sorted(rpc.METHODS))

    async def daemon_stats(self, p: rpc.NoParams, meta: EventMeta) -> rpc.StatsResult:
        sessions, events = await self.store.counts()
        by_status = {r[0]: r[1] for r in await self.store.session_totals("status")}
        window, live = self.writer.window.figures(), self._live()
        return rpc.StatsResult(
            sessions=sessions, events=events,
            last_position=self.writer.committed_position,
            db_bytes=await size.db_bytes() if (size := self.store.capabilities.size) else 0,
            connections=live.connections, subscriptions=live.subscriptions,
            write_queue_depth=self.writer.queue_depth,
            appends_per_s=self.writer.appends_per_s(),
            uptime_s=round(time.monotonic() - self.started, 3),
            write_transactions=self.writer.transactions,
            write_commands=self.writer.commands,
            schema_version=self.store.schema_version,
            write_queue_capacity=self.writer.queue_capacity,
            commit_batch_size=window["commit_batch_size"],
            commit_latency_ms=window["commit_latency_ms"],
            commit_latency_max_ms=window["commit_latency_max_ms"],
            executors_running=live.executors_running,
            sessions_by_status=by_status,
            reply_bytes_held=live.reply_bytes_held,
            reply_bytes_budget=live.reply_bytes_budget,
            connections_paused=live.connections_paused,
            connections_closed_by_budget=live.connections_closed_by_budget,
            # Only a shared store keeps them (PostgresStore.figures).
            store_commits=dict(figures) if (figures := getattr(self.store, "figures", None))
            else None,
            redacted_events=redactor.events if (redactor := self.writer.redactor) else 0,
            redacted=dict(redactor.counts) if redactor else {},
        )

    # --- sessions -------------------------------------------------------------------

    async def session_create(self, p: rpc.SessionCreateParams, meta: EventMeta) -> msgspec.Raw:
        sid = p.session_id or new_id()
        fields = {f: getattr(p, f) for f in SessionCreated.__struct_fields__}
        if fields["ttl_s"] is None:
            fields["ttl_s"] = default_ttl(self.commands.limits.default_ttl_s, p.namespace)
        data = SessionCreated(**fields)
        self.commands.check_event_size(data, "session.created data")
        if streams.KEY in p.metadata:
            _check_stream(p.metadata[streams.KEY], f"$.metadata.{streams.KEY}")
        inputs = self._appendable(p.events)

        def plan(state: SessionState | None) -> Plan:
            if state is not None:
                raise SessionExistsError(f"session {sid} already exists", {"session_id": sid})
            if not inputs:
                return Plan([("session.created", data)], lambda s, ev: s)
            return Plan([("session.created", data), *sequenced(created_view(sid, data), inputs)],
                        lambda s, ev: s, paths=["$", *_data_paths(inputs)])

        return await self.commands.submit(sid, meta, plan, idempotency_key=p.idempotency_key,
                                          expected_version=p.expected_version)

    async def session_states(self, p: rpc.SessionStatesParams,
                             meta: EventMeta) -> rpc.SessionStatesResult:
        rows = await self.store.states(p.namespace, p.prefix, p.cursor or "", p.limit,
                                       max_bytes=page_budget.get())
        states = [msgspec.json.decode(r, type=SessionState) for r in rows]
        return rpc.SessionStatesResult(
            states=states, truncated_by_bytes=rows.cut,
            next=states[-1].session_id if len(states) == p.limit or rows.cut else None)

    async def state_get(self, p: rpc.StateGetParams, meta: EventMeta) -> rpc.StateGetResult:
        found = await self.store.scoped_state(p.app_name, p.user_ids)
        return rpc.StateGetResult(app=found.pop(""), users=found)

    async def session_get(self, p: rpc.SessionGetParams,
                          meta: EventMeta) -> SessionState | msgspec.Raw:
        if p.at_version is None:
            state = await self.writer.view(p.session_id)
            if state is not None:
                return state
            raw = await self.store.state_json(p.session_id)
            if raw is None:
                require(None, p.session_id)
            return msgspec.Raw(raw)  # the stored view as it is stored: no decode, no encode
        return await self.state_at(p.session_id, p.at_version)

    async def state_at(self, session_id: str, version: int) -> SessionState:
        """The session's view as it was at `version` (session.get's time travel). A fork's
        view at or below its fork point is its source's then (walked up iteratively, each
        session once, at most forks.WALK_LIMIT of them), under the fork's identity. A
        history that does not read back or fold is -32012, never -32603."""
        current = await self.state(session_id)
        check_version(current, version, f"version {version}")
        if version > current.version:
            raise InvalidParamsError(
                f"at_version {version} is past session {session_id}'s version {current.version}",
                {"detail": "at_version too large", "path": "$.at_version"},
            )
        holder, view, seen = session_id, current, {session_id}
        while (link := view.forked_from) is not None and version <= link.version:
            if link.session_id in seen or len(seen) >= forks.WALK_LIMIT:
                raise unreadable_error(session_id, LookupError(
                    f"its fork chain goes round or past {forks.WALK_LIMIT} links at"
                    f" {link.session_id}"))
            holder = link.session_id
            seen.add(holder)
            try:
                view = await self.state(holder)
            except SessionNotFoundError as exc:
                raise unreadable_error(session_id, LookupError(
                    f"its fork source {holder} is gone")) from exc
        state = await self._fold_at(holder, view.forked_from, version)
        if holder == session_id:
            return state
        return msgspec.structs.replace(state, session_id=current.session_id,
                                       forked_from=current.forked_from)

    async def _fold_at(self, session_id: str, link: ForkLink | None,
                       version: int) -> SessionState:
        """Fold a session's own events forward from the nearest snapshot to `version`: at
        most snapshot_every events to read."""
        try:
            base = await self.store.snapshot(session_id, version)
            start = base.version + 1 if base is not None else (link.version + 1 if link else 1)
            events = await self.store.read_events(
                session_id=session_id, from_version=start, after_position=0,
                limit=version - start + 1, types=None)
            state = projection.fold(base, events) if events else base
        except (msgspec.DecodeError, msgspec.ValidationError, projection.FoldError,
                KeyError, TypeError, ValueError) as exc:
            raise unreadable_error(session_id, exc) from exc
        if state is None:  # neither a snapshot nor events: the stored history is gone
            raise unreadable_error(session_id, LookupError(f"no events up to version {version}"))
        return state

    async def session_resolve(self, p: rpc.SessionResolveParams,
                              meta: EventMeta) -> rpc.ResolveResult:
        if self.writer.cached(p.prefix) is not None or await self.store.state_json(p.prefix):
            return rpc.ResolveResult(session_id=p.prefix)
        candidates = await self.store.resolve(p.prefix)
        if not candidates:
            raise SessionNotFoundError(f"no session id starts with {p.prefix!r}",
                                       {"session_id": p.prefix})
        if len(candidates) > 1:
            raise AmbiguousIdError(
                f"{p.prefix!r} matches several sessions; give more characters",
                {"candidates": candidates[:10]},
            )
        return rpc.ResolveResult(session_id=candidates[0])

    async def session_list(self, p: rpc.SessionListParams,
                           meta: EventMeta) -> rpc.SessionListResult:
        filters = SessionFilters(
            namespace=p.namespace, statuses=tuple(p.status or ()), actor_name=p.actor_name,
            source=p.source,
            created_after=normalise_time(p.created_after, "$.created_after"),
            created_before=normalise_time(p.created_before, "$.created_before"))
        sessions, cursor = await self.store.list_sessions(filters, p.limit, p.cursor,
                                                          max_bytes=page_budget.get())
        return rpc.SessionListResult(sessions=sessions, next_cursor=cursor,
                                     truncated_by_bytes=sessions.cut)

    async def session_transition(self, p: rpc.SessionTransitionParams,
                                 meta: EventMeta) -> msgspec.Raw:
        def plan(state: SessionState | None) -> Plan:
            s = require(state, p.session_id)
            check_transition(p.session_id, s.status, p.to)
            data = StatusChanged(from_=cast(Status, s.status), to=p.to, reason=p.reason,
                                 error=p.error, paused_at=p.paused_at, resume_from=p.resume_from)
            return Plan([("session.status_changed", data)], lambda s, ev: s)

        return await self.commands.submit_params(p, meta, plan)

    async def session_set_ttl(self, p: rpc.SessionSetTtlParams,
                              meta: EventMeta) -> msgspec.Raw:
        def plan(state: SessionState | None) -> Plan:
            require(state, p.session_id)
            return Plan([("session.ttl_set", TtlSet(ttl_s=p.ttl_s))], lambda s, ev: s)

        return await self.commands.submit_params(p, meta, plan)

    async def session_resume(self, p: rpc.SessionResumeParams, meta: EventMeta) -> msgspec.Raw:
        checkpoint = None
        if p.checkpoint_id is not None:
            await self.state(p.session_id)
            checkpoint = await self.store.checkpoint(p.session_id, p.checkpoint_id)
            if checkpoint is None:
                raise CheckpointNotFoundError(
                    f"checkpoint {p.checkpoint_id} not found in session {p.session_id}",
                    {"checkpoint_id": p.checkpoint_id})

        def plan(state: SessionState | None) -> Plan:
            s = require(state, p.session_id)
            check_transition(p.session_id, s.status, "active")
            pr = s.progress
            resume_from = pr.resume_from or pr.paused_at
            memory = s.memory
            if checkpoint is not None:
                resume_from = checkpoint.resume_from or checkpoint.node_id or resume_from
                memory = checkpoint.memory
            resume = rpc.ResumeInfo(paused_at=pr.paused_at, resume_from=resume_from,
                                    memory=memory, next_node=None,
                                    checkpoint_id=p.checkpoint_id)
            data = StatusChanged(from_=cast(Status, s.status), to="active", reason="resumed",
                                 resume_from=resume_from)
            return Plan([("session.status_changed", data)],
                        lambda st, ev: rpc.SessionResumeResult(state=st, resume=resume))

        return await self.commands.submit_params(p, meta, plan)

    async def session_delete(self, p: rpc.SessionDeleteParams, meta: EventMeta) -> msgspec.Raw:
        def plan(state: SessionState | None) -> Delete:
            if p.session_id not in self.writer.damaged:  # a damaged one may have no view
                require(state, p.session_id)
            return Delete(rpc.DeleteResult(deleted=True))

        # A source's forks share its history: the Delete requires it has none (-32003).
        return await self.commands.submit_params(p, meta, plan)

    # --- messages -------------------------------------------------------------------

    def message_append(self, p: rpc.MessageAppendParams, meta: EventMeta) -> Command:
        self.commands.check_message(p)

        def plan(state: SessionState | None) -> Plan:
            data = _message_data(p, require(state, p.session_id).message_count)
            return Plan([("message.appended", data)], lambda s, ev: _write_result(
                s, ev, message_id=data.message_id, sequence=data.sequence))

        return params_command(p, meta, plan)

    async def message_append_many(self, p: rpc.MessageAppendManyParams,
                                  meta: EventMeta) -> msgspec.Raw:
        for m in p.messages:
            self.commands.check_message(m)
        if p.replace_from is not None:
            return await self._replace_messages(p, meta, p.replace_from)

        def plan(state: SessionState | None) -> Plan:
            first = require(state, p.session_id).message_count
            datas = [_message_data(m, first + i) for i, m in enumerate(p.messages)]
            return Plan([("message.appended", d) for d in datas], lambda s, ev: _write_result(
                s, ev, message_ids=[d.message_id for d in datas], first_sequence=first),
                paths=[f"$.messages[{i}]" for i in range(len(datas))])

        return await self.commands.submit_params(p, meta, plan)

    async def _submit_as_read(self, p: rpc.WriteParams, meta: EventMeta, plan: Planner,
                              version: int) -> msgspec.Raw | None:
        """Submit a plan made from reads of the session at `version`, requiring that version
        (or the caller's `expected_version`, 0 included); None when another write came
        between, so the caller reads again and retries, READ_TRIES times at most
        (then `_too_busy`)."""
        try:
            return await self.commands.submit(
                p.session_id, meta, plan, idempotency_key=p.idempotency_key,
                expected_version=version if p.expected_version is None
                else p.expected_version)
        except VersionConflictError:
            if p.expected_version is not None:
                raise  # the caller's own condition: theirs to handle
            return None

    async def _replace_messages(self, p: rpc.MessageAppendManyParams, meta: EventMeta,
                                start: int) -> msgspec.Raw:
        """append_many with `replace_from`: one messages.truncated (reason "replaced") and
        the new messages from `start` on, in one write at the version the cut was read at
        (the caller's `expected_version` if given; else retried, as message.pop)."""
        for _ in range(READ_TRIES):
            state = await self.state(p.session_id)
            if start > state.message_count:
                raise InvalidParamsError(
                    f"replace_from {start} is past session {p.session_id}'s "
                    f"{state.message_count} messages",
                    {"detail": "replace_from too large", "path": "$.replace_from"})
            edge = await self.store.list_messages(p.session_id, first=start - 1, limit=1,
                                                  descending=False) if start else []
            new_last = edge[0] if edge else None

            def plan(s: SessionState | None, new_last: Message | None = new_last) -> Plan:
                s = require(s, p.session_id)
                cut = MessagesTruncated(
                    from_sequence=start, reason="replaced",
                    last_message=msgspec.to_builtins(new_last) if new_last else None)
                datas = [_message_data(m, start + i) for i, m in enumerate(p.messages)]
                events: list[tuple[str, PlanData]] = [("messages.truncated", cut)]
                events += [("message.appended", d) for d in datas]
                return Plan(events, lambda st, ev: _write_result(
                    st, ev, message_ids=[d.message_id for d in datas], first_sequence=start),
                    paths=["$.replace_from", *(f"$.messages[{i}]" for i in range(len(datas)))])

            if (done := await self._submit_as_read(p, meta, plan, state.version)) is not None:
                return done
        raise _too_busy(p.session_id, "message.append_many")

    async def message_list(self, p: rpc.MessageListParams,
                           meta: EventMeta) -> rpc.MessageListResult:
        state = await self.state(p.session_id)
        total = state.message_count
        after = p.after_sequence
        if p.order == "asc":
            first = (after + 1 if after is not None else 0) + p.offset
            if state.history is not None and first <= state.history.through_sequence:
                raise gone(state, f"message {first}")
            # Past the last possible sequence (an int64) nothing is left to read.
            messages = Page() if first > INT64_MAX else await self.store.list_messages(
                p.session_id, first=first, limit=p.limit, descending=False,
                max_bytes=page_budget.get())
        else:
            first = total - 1 - p.offset
            if state.history is not None and 0 <= first <= state.history.through_sequence:
                raise gone(state, f"message {first}")
            messages = Page() if first < 0 else await self.store.list_messages(
                p.session_id, first=first, limit=p.limit, descending=True,
                max_bytes=page_budget.get())
            if after is not None:
                messages = repage(messages, [m for m in messages if m.sequence > after])
        return rpc.MessageListResult(messages=messages, total=total,
                                     truncated_by_bytes=messages.cut)

    async def message_pop(self, p: rpc.WriteParams, meta: EventMeta) -> msgspec.Raw:
        """Take the last message out of the conversation and return it (history keeps it)."""
        return await self._truncate(p, meta, keep=lambda count: count - 1, reason="popped")

    async def message_clear(self, p: rpc.WriteParams, meta: EventMeta) -> msgspec.Raw:
        """Take every message out of the conversation (history keeps them)."""
        return await self._truncate(p, meta, keep=lambda count: 0, reason="cleared")

    async def _truncate(self, p: rpc.WriteParams, meta: EventMeta,
                        keep: Callable[[int], int], reason: str) -> msgspec.Raw:
        # The messages around the cut are read first; the write then requires the
        # version they were read at, and is retried if another write came between.
        pop = reason == "popped"
        for _ in range(READ_TRIES):
            state = await self.state(p.session_id)
            count, kept = state.message_count, max(0, keep(state.message_count))
            edge = await self.store.list_messages(p.session_id, first=kept - 1, limit=2,
                                                  descending=False) if count else []
            new_last = edge[0] if kept and edge else None
            popped = edge[-1] if pop and edge else None

            def plan(s: SessionState | None, kept: int = kept, count: int = count,
                     new_last: Message | None = new_last, popped: Message | None = popped) -> Plan:
                s = require(s, p.session_id)
                if kept >= count:  # nothing to take out: nothing is written
                    return Plan([], lambda st, ev: _cut_result(st, ev, None, 0, pop))
                data = MessagesTruncated(
                    from_sequence=kept, reason=reason,
                    last_message=msgspec.to_builtins(new_last) if new_last else None)
                return Plan([("messages.truncated", data)], lambda st, ev: _cut_result(
                    st, ev, popped, count - kept, pop))

            if (done := await self._submit_as_read(p, meta, plan, state.version)) is not None:
                return done
        raise _too_busy(p.session_id, "message.pop" if pop else "message.clear")

    # --- tokens, progress, memory, checkpoints --------------------------------------

    async def tokens_record(self, p: rpc.TokensRecordParams, meta: EventMeta) -> msgspec.Raw:
        data = TokensRecorded(input_tokens=p.input_tokens, output_tokens=p.output_tokens,
                              estimated_cost=p.estimated_cost, model=p.model)

        def plan(state: SessionState | None) -> Plan:
            require(state, p.session_id)
            return Plan([("tokens.recorded", data)],
                        lambda s, ev: _write_result(s, ev, token_usage=s.token_usage))

        return await self.commands.submit_params(p, meta, plan)

    async def progress_record(self, p: rpc.ProgressRecordParams, meta: EventMeta) -> msgspec.Raw:
        data = ProgressRecorded(node_id=p.node_id, edge=p.edge, latency_ms=p.latency_ms,
                                tokens=p.tokens, retries=p.retries, failed=p.failed)

        def plan(state: SessionState | None) -> Plan:
            require(state, p.session_id)
            return Plan([("progress.recorded", data)],
                        lambda s, ev: _write_result(s, ev, progress=s.progress))

        return await self.commands.submit_params(p, meta, plan)

    async def memory_update(self, p: rpc.MemoryUpdateParams, meta: EventMeta) -> msgspec.Raw:
        self.commands.check_event_size(p.patch, "memory patch")

        def plan(state: SessionState | None) -> Plan:
            require(state, p.session_id)
            return Plan([("memory.updated", MemoryUpdated(patch=p.patch))],
                        lambda s, ev: _write_result(s, ev, memory=s.memory))

        return await self.commands.submit_params(p, meta, plan)

    async def checkpoint_save(self, p: rpc.CheckpointSaveParams, meta: EventMeta) -> msgspec.Raw:
        payload = _json.encode(p.payload)
        self.commands.check_size(len(payload), self.commands.limits.max_checkpoint_bytes,
                                 "checkpoint payload")
        bad = json_out_of_bounds(p.payload, "$.payload", encoded=payload)
        if bad is not None:
            raise InvalidParamsError(bound_message(*bad), {"detail": "number out of bounds",
                                                           "path": bad[0]})
        self.commands.check_event_size(p.memory, "checkpoint memory")
        cid = p.checkpoint_id or new_id()
        data = CheckpointSaved(checkpoint_id=cid, size=len(payload), memory=p.memory,
                               node_id=p.node_id, resume_from=p.resume_from)

        def plan(state: SessionState | None) -> Plan:
            require(state, p.session_id)
            return Plan([("checkpoint.saved", data)],
                        lambda s, ev: _write_result(s, ev, checkpoint_id=cid),
                        payloads={0: payload})

        return await self.commands.submit_params(p, meta, plan)

    async def checkpoint_get(self, p: rpc.CheckpointGetParams,
                             meta: EventMeta) -> rpc.CheckpointGetResult:
        await self.state(p.session_id)
        found = await self.store.checkpoint(p.session_id, p.checkpoint_id)
        if found is None:
            cid = p.checkpoint_id or "latest"
            raise CheckpointNotFoundError(
                f"checkpoint {cid} not found in session {p.session_id}", {"checkpoint_id": cid})
        return rpc.CheckpointGetResult(
            checkpoint_id=found.checkpoint_id, node_id=found.node_id,
            resume_from=found.resume_from, created_at=found.created_at, version=found.version,
            payload=msgspec.Raw(found.payload), memory=found.memory)

    async def progress_list(self, p: rpc.ProgressListParams,
                            meta: EventMeta) -> rpc.ProgressListResult:
        """A page of the graph's steps (the path the view no longer keeps), oldest first."""
        state = await self.state(p.session_id)
        upto = min(p.at_version or state.version, state.version)
        rows = await self.store.progress_steps(p.session_id, p.after_version, upto,
                                               p.limit + 1, max_bytes=page_budget.get())
        more = len(rows) > p.limit or rows.cut
        steps = rows[:p.limit]
        return rpc.ProgressListResult(
            steps=steps, total=state.progress.steps_executed,
            next=steps[-1].version if more and steps else None,
            truncated_by_bytes=rows.cut and len(steps) < p.limit)

    async def checkpoint_list(self, p: rpc.CheckpointListParams,
                              meta: EventMeta) -> rpc.CheckpointListResult:
        await self.state(p.session_id)
        page = await self.store.checkpoints(p.session_id, p.after_version,
                                            max_bytes=page_budget.get())
        infos = [rpc.CheckpointInfo(checkpoint_id=c.checkpoint_id, node_id=c.node_id,
                                    created_at=c.created_at, size=c.size, version=c.version)
                 for c in page]
        return rpc.CheckpointListResult(checkpoints=infos, truncated_by_bytes=page.cut,
                                        next=page[-1].version if page.cut else None)

    # --- raw events -----------------------------------------------------------------

    def events_append(self, p: rpc.EventsAppendParams, meta: EventMeta) -> Command:
        inputs = self._appendable(p.events)

        def plan(state: SessionState | None) -> Plan:
            s = require(state, p.session_id)
            return Plan(sequenced(s, inputs), _write_result,
                        paths=_data_paths(inputs))

        return params_command(p, meta, plan)

    def _appendable(self, items: list[rpc.EventInput]) -> list[tuple[str, dict[str, Any]]]:
        """Validate events.append items (type, shape, size); return them as (type, data)."""
        inputs: list[tuple[str, dict[str, Any]]] = []
        for i, item in enumerate(items):
            path = f"$.events[{i}].data"
            if item.type in RUNNER_ONLY:
                raise InvalidParamsError(
                    f"events[{i}]: {item.type} is written only by the daemon's executor runner"
                    " (session.spawn); a client cannot append it",
                    {"detail": "runner-only event type", "path": f"$.events[{i}].type"})
            shape = APPEND_INPUTS[item.type]
            if shape is None:
                raise InvalidParamsError(
                    f"events[{i}]: {item.type} cannot be appended with events.append;"
                    f" use {_INSTEAD[item.type]}",
                    {"detail": "type not appendable", "path": f"$.events[{i}].type"})
            typed: Any = None
            try:
                if shape is not Record:  # a Record is any object: its body
                    typed = msgspec.convert(item.data, shape)
            except msgspec.ValidationError as exc:
                raise invalid_params(exc, path, f"invalid {item.type} data") from exc
            self.commands.check_event_size(item.data, f"events[{i}].data")
            if isinstance(typed, MessageFields):  # as message.append checks it
                self.commands.check_message(typed)
            elif item.type == "metadata.updated" and isinstance(patch := item.data.get(
                    "patch"), dict) and streams.KEY in patch:
                _check_stream(patch[streams.KEY], f"{path}.patch.{streams.KEY}")
            inputs.append((item.type, item.data))
        return inputs

    async def events_read(self, p: rpc.EventsReadParams, meta: EventMeta) -> rpc.EventsReadResult:
        if p.session_id is None and p.from_version is not None:
            raise InvalidParamsError("from_version needs a session_id",
                                     {"detail": "from_version without session_id",
                                      "path": "$.from_version"})
        if p.session_id is not None:
            state = await self.state(p.session_id)
            if p.from_version is not None:
                check_version(state, p.from_version, f"version {p.from_version}")
        try:
            events = await self.store.read_events(
                session_id=p.session_id, from_version=p.from_version or 1,
                after_position=p.from_position or 0, limit=p.limit,
                types=list(p.types) if p.types else None, max_bytes=page_budget.get())
        except (msgspec.DecodeError, msgspec.ValidationError) as exc:
            raise unreadable_error(p.session_id, exc) from exc
        nxt = None
        if len(events) == p.limit or events.cut:
            nxt = events[-1].version + 1 if p.session_id is not None else events[-1].position
        return rpc.EventsReadResult(events=events, next=nxt, truncated_by_bytes=events.cut)


def _check_stream(value: Any, path: str) -> None:
    """A stream's settings (`metadata.stream`, or a patch of it: null removes), as the
    HTTP face serves them (sessiond_schemas.streams): -32602 where they do not fit."""
    if value is None:
        return
    try:
        streams.settings(value)
    except msgspec.ValidationError as exc:
        raise invalid_params(exc, path, "invalid stream settings (the HTTP face's)") from exc


def invalid_params(exc: msgspec.ValidationError, base: str = "$",
                   context: str = "invalid params") -> InvalidParamsError:
    """Turn msgspec's "detail - at `$.x`" into -32602 with `detail` and the full `path`."""
    detail, sep, at = str(exc).rpartition(" - at `")
    if not sep:
        detail, at = str(exc), "$"
    path = base + at.rstrip("`")[1:]
    # Our own checks (__post_init__) name their field first: point the path at it.
    named = re.match(r"`(\w+)`", detail)
    if named and not path.endswith("." + named.group(1)):
        path += "." + named.group(1)
    return InvalidParamsError(f"{context}: {detail} (at {path})", {"detail": detail, "path": path})
