"""The API, written once: each method names its RPC method and result type.

A method here builds a `Call` (the RPC method, its params, how to decode the result);
the `rpc_method` descriptor hands it to the client's `_run`, which answers at once on
`Client` (a `SyncCaller`) and returns an awaitable on `AsyncClient` (an `AsyncCaller`).
So every method is blocking on `Client`, awaitable on `AsyncClient`, and typed on both:
`Client().append_message(...)` is a `MessageAppendResult`, and the same call on
`AsyncClient` a coroutine of one.
"""

from __future__ import annotations

import functools
import inspect
import json
import math
import types
from collections.abc import Callable, Coroutine
from typing import Any, Concatenate, Generic, Literal, ParamSpec, TextIO, TypeVar, overload

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.errors import InvalidParamsError, SessionExportError
from sessiond_schemas.events import Role, Status
from sessiond_schemas.rpc.executors import Adapter
from sessiond_schemas.state import ProgressStep, SessionState

from ._wire import raise_for

T = TypeVar("T")
R = TypeVar("R")
P = ParamSpec("P")


_decoders: dict[Any, msgspec.json.Decoder[Any]] = {}


def _decoder(result_type: Any) -> msgspec.json.Decoder[Any]:
    decoder = _decoders.get(result_type)
    if decoder is None:
        decoder = _decoders[result_type] = msgspec.json.Decoder(result_type)
    return decoder


class Call(Generic[T]):
    """One request to make: the RPC method, its params, and how its result is decoded."""

    __slots__ = ("decode", "method", "params")

    def __init__(self, method: str, params: dict[str, Any],
                 decode: Callable[[msgspec.Raw], T]) -> None:
        self.method, self.params, self.decode = method, params, decode

    @staticmethod
    def of(method: str, result_type: type[T], /, **params: Any) -> Call[T]:
        """A call whose result is decoded as `result_type`."""
        return Call(method, params, _decoder(result_type).decode)

    @staticmethod
    def picked(method: str, result_type: type[R], pick: Callable[[R], T], /,
               **params: Any) -> Call[T]:
        """A call whose result is decoded as `result_type`, then reduced by `pick`."""
        decode = _decoder(result_type).decode
        return Call(method, params, lambda raw: pick(decode(raw)))

    def finish(self, reply: rpc.Response) -> T:
        """The decoded result of `reply`, or the error it carries raised."""
        return self.decode(raise_for(reply))


def whole_state(state: SessionState, steps: list[ProgressStep]) -> dict[str, Any]:
    """`state` as a dict with the lists the view no longer keeps (protocol 1.2) put back
    whole from its steps: `progress.path` and `metrics.edges_traversed`, as Hive's
    session state and protocol 1.1's view carried them."""
    whole: dict[str, Any] = msgspec.to_builtins(state)
    whole["progress"]["path"] = [s.node_id for s in steps]
    whole["metrics"]["edges_traversed"] = [s.edge for s in steps if s.edge is not None]
    return whole


def decoded(method: str, result_type: Any, params: dict[str, Any]) -> Call[Any]:
    """The call behind the clients' generic `call(method, result_type, **params)`."""
    return Call(method, params, _decoder(result_type).decode)


def export_page(session_id: str, cursor: str | None) -> Call[dict[str, Any]]:
    """One page of session.export (the first without a cursor)."""
    params: dict[str, Any] = {"session_id": session_id}
    if cursor is not None:  # a daemon before paged exports knows no cursor
        params["cursor"] = cursor
    return Call.of("session.export", dict[str, Any], **params)


class ExportDocument:
    """session.export's pages put together into the contract's single export document.

    `add` takes each page in turn and returns the cursor of the next (None when done). The
    document is `document` in memory, or, with `out`, written to that text file as the
    pages come (a page at a time in memory): the same JSON document either way."""

    def __init__(self, out: TextIO | None = None, session_id: str = "") -> None:
        self.out = out
        self.session_id = session_id
        self.document: dict[str, Any] = {}
        self.events = self.checkpoints = 0
        self._list = ""  # the list `out` is in: "events", then "checkpoints"

    def add(self, page: dict[str, Any]) -> str | None:
        """Take the next page; return the next page's cursor (None: done). A document that
        cannot be written to `out` (disk full, a closed pipe) raises SessionExportError."""
        try:
            return self._add(page)
        except OSError as exc:
            where = getattr(self.out, "name", "its file")
            raise SessionExportError(
                f"cannot write the export of session {self.session_id} to {where}:"
                f" {exc.strerror or exc} (the file holds part of it: export again)",
                {"detail": str(exc), "session_id": self.session_id,
                 "events_written": self.events}) from exc

    def _add(self, page: dict[str, Any]) -> str | None:
        if "next_cursor" not in page:  # the whole document in one answer
            self.events, self.checkpoints = len(page["events"]), len(page["checkpoints"])
            if self.out is None:
                self.document = page
            else:
                self.out.write(json.dumps(page, ensure_ascii=False, indent=1) + "\n")
            return None
        if not self.document and not self._list:  # the first page
            head = {k: page[k] for k in ("format", "format_version", "exported_at")}
            self.document = {**head, "events": [], "checkpoints": []}
            if self.out is not None:
                self.out.write(json.dumps(head, ensure_ascii=False)[:-1] + ', "events": [')
                self._list, self._first = "events", True
        for key in ("events", "checkpoints"):
            for item in page[key]:
                self._item(key, item)
        if page["next_cursor"] is not None:
            return str(page["next_cursor"])
        tail = {"session": page["session"], "checksum": page["checksum"]}
        if self.out is None:
            self.document |= tail
        else:
            self._enter("checkpoints")
            self.out.write("], " + json.dumps(tail, ensure_ascii=False)[1:] + "\n")
        return None

    def _enter(self, key: str) -> None:
        assert self.out is not None
        if self._list != key:
            self.out.write('], "checkpoints": [')
            self._list, self._first = key, True

    def _item(self, key: str, item: Any) -> None:
        if key == "events":
            self.events += 1
        else:
            self.checkpoints += 1
        if self.out is None:
            self.document[key].append(item)
            return
        self._enter(key)
        self.out.write(("\n" if self._first else ",\n") + json.dumps(item, ensure_ascii=False))
        self._first = False


class SyncCaller:
    """A client whose calls answer at once."""

    def _run(self, call: Call[T]) -> T:
        raise NotImplementedError


class AsyncCaller:
    """A client whose calls are awaited."""

    async def _run(self, call: Call[T]) -> T:
        raise NotImplementedError


class rpc_method(Generic[P, T]):  # a decorator, named as one
    """A client method: blocking on a SyncCaller, a coroutine on an AsyncCaller.

    `inspect.signature` shows the method's own keyword parameters and its result type
    (awaited, on an AsyncCaller), on the class as on an instance."""

    def __init__(self, build: Callable[Concatenate[Any, P], Call[T]]) -> None:
        signature = inspect.signature(build)
        returned = signature.return_annotation  # "Call[X]": the caller gets an X
        if isinstance(returned, str) and returned.startswith("Call[") and returned[-1] == "]":
            returned = returned[5:-1]

        def invoker(result: Any) -> Callable[..., Any]:
            def invoke(obj: Any, /, *args: Any, **kwargs: Any) -> Any:
                return obj._run(build(obj, *args, **kwargs))

            functools.update_wrapper(invoke, build)  # name, doc, module, qualname
            invoke.__signature__ = signature.replace(  # type: ignore[attr-defined]
                return_annotation=result)
            return invoke

        self._invoke = invoker(returned)
        self._invoke_awaited = invoker(f"Awaitable[{returned}]")  # on an AsyncCaller
        self.__doc__, self.__name__ = build.__doc__, build.__name__
        self.__qualname__, self.__module__ = build.__qualname__, build.__module__
        self.__signature__ = signature.replace(return_annotation=returned)
        self.__wrapped__ = build

    def __call__(self, obj: Any, /, *args: Any, **kwargs: Any) -> Any:
        """`Client.ping(client)`, as a plain method called on its class."""
        return self._invoke(obj, *args, **kwargs)

    @overload
    def __get__(self, obj: None, owner: type[Any] | None = None) -> rpc_method[P, T]: ...
    @overload
    def __get__(self, obj: SyncCaller, owner: type[Any] | None = None) -> Callable[P, T]: ...
    @overload
    def __get__(self, obj: AsyncCaller, owner: type[Any] | None = None
                ) -> Callable[P, Coroutine[Any, Any, T]]: ...

    def __get__(self, obj: Any, owner: type[Any] | None = None) -> Any:
        if obj is None:
            return self
        invoke = self._invoke_awaited if isinstance(obj, AsyncCaller) else self._invoke
        return types.MethodType(invoke, obj)  # about as cheap as binding a plain method


class Methods:
    """One method per RPC method; results are the schema Structs named in each docstring.

    Every parameter is the RPC method's param of the same name (docs/protocol.md); one
    left at None is not sent, so the daemon's default applies. Besides its data, every
    write takes `expected_version` (refused with -32002 unless the session is at that
    version) and `idempotency_key` (a retry with the same key answers with the first
    result and writes nothing)."""

    # --- daemon -------------------------------------------------------------------------

    @rpc_method
    def ping(self) -> Call[rpc.PingResult]:
        """Check the daemon answers. -> PingResult (version, uptime)."""
        return Call.of("daemon.ping", rpc.PingResult)

    @rpc_method
    def stats(self) -> Call[rpc.StatsResult]:
        """The daemon's counters. -> StatsResult."""
        return Call.of("daemon.stats", rpc.StatsResult)

    @rpc_method
    def verify(self, document: Any = None) -> Call[rpc.VerifyResult]:
        """Check the database, every hash chain and every view against the fold; or, with
        `document`, an export document's checksum and chain, and whose its events are.
        -> VerifyResult (ok, checked_sessions, problems, sealed_events, unkeyed_events,
        foreign_events)."""
        return Call.of("daemon.verify", rpc.VerifyResult, document=document)

    @rpc_method
    def backup(self, /, path: str) -> Call[rpc.BackupResult]:
        """Copy the database online to a new file (an absolute path). -> BackupResult."""
        return Call.of("daemon.backup", rpc.BackupResult, path=path)

    # --- sessions -----------------------------------------------------------------------

    @rpc_method
    def create_session(
        self, /, session_id: str | None = None, *, namespace: str | None = None,
        actor_name: str | None = None, goal_id: str | None = None,
        agent_id: str | None = None, stream_id: str | None = None,
        correlation_id: str | None = None, entry_point: str | None = None,
        task: str | None = None, working_dir: str | None = None, model: str | None = None,
        adapter: str | None = None, source: str | None = None,
        automation_level: str | None = None, isolation_level: str | None = None,
        checkpoint_enabled: bool | None = None, input_data: dict[str, Any] | None = None,
        metadata: dict[str, Any] | None = None,
        status: Literal["pending", "active"] | None = None,
        events: list[dict[str, Any]] | None = None, ttl_s: int | None = None,
        expected_version: int | None = None, idempotency_key: str | None = None,
    ) -> Call[SessionState]:
        """Create a session: its id (default: a new ULID) and the `session.created` fields
        (namespace "local", actor_name "owner/name", task, model, metadata, input_data,
        status "active" or "pending", ...); `events` [{type, data}] are appended with it,
        all or nothing; `ttl_s`, an idle TTL in seconds (the namespace's default_ttl_s
        otherwise). -> SessionState."""
        return Call.of(
            "session.create", SessionState, session_id=session_id, namespace=namespace,
            actor_name=actor_name, goal_id=goal_id, agent_id=agent_id, stream_id=stream_id,
            correlation_id=correlation_id, entry_point=entry_point, task=task,
            working_dir=working_dir, model=model, adapter=adapter, source=source,
            automation_level=automation_level, isolation_level=isolation_level,
            checkpoint_enabled=checkpoint_enabled, input_data=input_data, metadata=metadata,
            status=status, events=events, ttl_s=ttl_s, expected_version=expected_version,
            idempotency_key=idempotency_key)

    @rpc_method
    def get_session(self, /, session_id: str, at_version: int | None = None) -> Call[SessionState]:
        """A session's state, or its state at an earlier version. -> SessionState."""
        return Call.of("session.get", SessionState, session_id=session_id,
                       at_version=at_version)

    @rpc_method
    def resolve(self, /, prefix: str) -> Call[str]:
        """The one session id starting with `prefix` (>= 4 characters). -> str."""
        return Call.picked("session.resolve", rpc.ResolveResult, lambda r: r.session_id,
                           prefix=prefix)

    @rpc_method
    def list_sessions(
        self, /, *, namespace: str | None = None, status: list[Status] | None = None,
        actor_name: str | None = None, source: str | None = None,
        created_after: str | None = None, created_before: str | None = None,
        limit: int | None = None, cursor: str | None = None,
    ) -> Call[rpc.SessionListResult]:
        """Sessions newest first, filtered by namespace, statuses, actor_name, source and
        creation time (RFC 3339 bounds); `limit` per page (default 50), `cursor` the
        previous page's next_cursor. -> SessionListResult."""
        return Call.of("session.list", rpc.SessionListResult, namespace=namespace,
                       status=status, actor_name=actor_name, source=source,
                       created_after=created_after, created_before=created_before,
                       limit=limit, cursor=cursor)

    @rpc_method
    def transition(
        self, /, session_id: str, to: Status, *, reason: str | None = None,
        error: str | None = None, paused_at: str | None = None,
        resume_from: str | None = None, expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Call[SessionState]:
        """Move a session to another status, with a reason (and an error when failing;
        paused_at/resume_from, the node to resume from, when pausing). -> SessionState."""
        return Call.of("session.transition", SessionState, session_id=session_id, to=to,
                       reason=reason, error=error, paused_at=paused_at,
                       resume_from=resume_from, expected_version=expected_version,
                       idempotency_key=idempotency_key)

    @rpc_method
    def set_ttl(self, /, session_id: str, ttl_s: int | None, *,
                expected_version: int | None = None,
                idempotency_key: str | None = None) -> Call[SessionState]:
        """Set the session's idle TTL in seconds (None: no TTL); it ends as `expired` when
        no event comes for that long. -> SessionState."""
        return Call.of("session.set_ttl", SessionState, session_id=session_id, ttl_s=ttl_s,
                       expected_version=expected_version, idempotency_key=idempotency_key)

    @rpc_method
    def resume(self, /, session_id: str, checkpoint_id: str | None = None, *,
               expected_version: int | None = None,
               idempotency_key: str | None = None) -> Call[rpc.SessionResumeResult]:
        """Move a session back to active, from a checkpoint (default: the latest).
        -> SessionResumeResult (state, resume)."""
        return Call.of("session.resume", rpc.SessionResumeResult, session_id=session_id,
                       checkpoint_id=checkpoint_id, expected_version=expected_version,
                       idempotency_key=idempotency_key)

    @rpc_method
    def delete_session(self, /, session_id: str, *, expected_version: int | None = None,
                       idempotency_key: str | None = None) -> Call[bool]:
        """Delete a session with all its events, messages and checkpoints. -> bool."""
        return Call.picked("session.delete", rpc.DeleteResult, lambda r: r.deleted,
                           session_id=session_id, expected_version=expected_version,
                           idempotency_key=idempotency_key)

    @rpc_method
    def import_session(self, /, document: Any,
                       on_conflict: Literal["error", "skip", "replace"] | None = None,
                       strict: bool | None = None) -> Call[SessionState]:
        """Store an export document (a dict, or its JSON text); on_conflict: error (the
        default), skip, replace; strict: refuse a document not written by this host or
        fleet (-32007). -> SessionState."""
        return Call.of("session.import", SessionState, document=document,
                       on_conflict=on_conflict, strict=strict)

    @rpc_method
    def cleanup(self, /, *, older_than_days: float | None = None,
                statuses: list[Status] | None = None,
                dry_run: bool | None = None) -> Call[rpc.CleanupResult]:
        """Delete sessions in `statuses` (default: the ended ones) idle for older_than_days
        (default 7); dry_run lists them only. -> CleanupResult."""
        return Call.of("session.cleanup", rpc.CleanupResult, older_than_days=older_than_days,
                       statuses=statuses, dry_run=dry_run)

    # --- messages -----------------------------------------------------------------------

    @rpc_method
    def append_message(
        self, /, session_id: str, role: Role, content: str, *,
        tool_call_id: str | None = None, metadata: dict[str, Any] | None = None,
        expected_version: int | None = None, idempotency_key: str | None = None,
    ) -> Call[rpc.MessageAppendResult]:
        """Append one message (a `tool` message needs the tool_call_id it answers).
        -> MessageAppendResult."""
        return Call.of("message.append", rpc.MessageAppendResult, session_id=session_id,
                       role=role, content=content, tool_call_id=tool_call_id,
                       metadata=metadata, expected_version=expected_version,
                       idempotency_key=idempotency_key)

    @rpc_method
    def append_messages(
        self, /, session_id: str, messages: list[dict[str, Any]], *,
        replace_from: int | None = None,
        expected_version: int | None = None, idempotency_key: str | None = None,
    ) -> Call[rpc.MessageAppendManyResult]:
        """Append several messages [{role, content, tool_call_id, metadata}] atomically;
        with `replace_from`, they replace the messages from that sequence on, in the same
        write. -> MessageAppendManyResult."""
        return Call.of("message.append_many", rpc.MessageAppendManyResult,
                       session_id=session_id, messages=messages, replace_from=replace_from,
                       expected_version=expected_version, idempotency_key=idempotency_key)

    @rpc_method
    def list_messages(
        self, /, session_id: str, *, limit: int | None = None, offset: int | None = None,
        after_sequence: int | None = None, order: Literal["asc", "desc"] | None = None,
    ) -> Call[rpc.MessageListResult]:
        """A page of messages: `limit` (default 100) from `offset`, or after a sequence
        number; order "asc" (default) or "desc". -> MessageListResult."""
        return Call.of("message.list", rpc.MessageListResult, session_id=session_id,
                       limit=limit, offset=offset, after_sequence=after_sequence, order=order)

    @rpc_method
    def compact(
        self, /, session_id: str, summary: list[dict[str, Any]], *,
        through_sequence: int | None = None, by: str | None = None, reason: str | None = None,
        expected_version: int | None = None, idempotency_key: str | None = None,
    ) -> Call[SessionState]:
        """Record a compaction: `summary` messages [{role, content, ...}] that stand for the
        messages up to `through_sequence` (default: all so far; -1: none). Nothing is cut:
        the history stays; the context (`context`) now starts at the summary. `by` says who
        made it (default "api"). -> SessionState."""
        return Call.of("session.compact", SessionState, session_id=session_id,
                       summary=summary, through_sequence=through_sequence, by=by,
                       reason=reason, expected_version=expected_version,
                       idempotency_key=idempotency_key)

    @rpc_method
    def context(self, /, session_id: str, *, limit: int | None = None,
                after_sequence: int | None = None) -> Call[rpc.SessionContextResult]:
        """What the model sees now: the last compaction's summary (first page only) and a
        page of the messages after it (`limit`, default 100; the next page after
        `next`). -> SessionContextResult."""
        return Call.of("session.context", rpc.SessionContextResult, session_id=session_id,
                       limit=limit, after_sequence=after_sequence)

    @rpc_method
    def trim(self, /, session_id: str, *, older_than_days: float | None = None,
             dry_run: bool | None = None, expected_version: int | None = None,
             idempotency_key: str | None = None) -> Call[rpc.TrimResult]:
        """Retention: take the session's history behind its last compaction and older than
        `older_than_days` (default: its namespace's trim_after_days) out of the store; it
        still verifies from the anchor the trim records. -> TrimResult."""
        return Call.of("session.trim", rpc.TrimResult, session_id=session_id,
                       older_than_days=older_than_days, dry_run=dry_run,
                       expected_version=expected_version, idempotency_key=idempotency_key)

    @rpc_method
    def pop_message(self, /, session_id: str, *, expected_version: int | None = None,
                    idempotency_key: str | None = None) -> Call[rpc.MessagePopResult]:
        """Take the last message out of the conversation (its events stay). -> MessagePopResult
        (`message` is None when there was none)."""
        return Call.of("message.pop", rpc.MessagePopResult, session_id=session_id,
                       expected_version=expected_version, idempotency_key=idempotency_key)

    @rpc_method
    def clear_messages(self, /, session_id: str, *, expected_version: int | None = None,
                       idempotency_key: str | None = None) -> Call[rpc.MessageClearResult]:
        """Take every message out of the conversation (its events stay). -> MessageClearResult."""
        return Call.of("message.clear", rpc.MessageClearResult, session_id=session_id,
                       expected_version=expected_version, idempotency_key=idempotency_key)

    # --- tokens, progress, memory, checkpoints ------------------------------------------

    @rpc_method
    def record_tokens(
        self, /, session_id: str, *, input_tokens: int | None = None,
        output_tokens: int | None = None, estimated_cost: float | None = None,
        model: str | None = None, expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Call[rpc.TokensRecordResult]:
        """Add token usage (counts, a cost, the model that used them). -> TokensRecordResult."""
        return Call.of("tokens.record", rpc.TokensRecordResult, session_id=session_id,
                       input_tokens=input_tokens, output_tokens=output_tokens,
                       estimated_cost=estimated_cost, model=model,
                       expected_version=expected_version, idempotency_key=idempotency_key)

    @rpc_method
    def record_progress(
        self, /, session_id: str, node_id: str, *, edge: str | None = None,
        latency_ms: int | None = None, tokens: int | None = None, retries: int | None = None,
        failed: bool | None = None, expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Call[rpc.ProgressRecordResult]:
        """Record one graph step: the node, the edge taken to it, its latency, tokens and
        retries, whether it failed. -> ProgressRecordResult."""
        return Call.of("progress.record", rpc.ProgressRecordResult, session_id=session_id,
                       node_id=node_id, edge=edge, latency_ms=latency_ms, tokens=tokens,
                       retries=retries, failed=failed, expected_version=expected_version,
                       idempotency_key=idempotency_key)

    @rpc_method
    def list_progress(self, /, session_id: str, *, after_version: int | None = None,
                      limit: int | None = None,
                      at_version: int | None = None) -> Call[rpc.ProgressListResult]:
        """A page of the graph's steps, oldest first (after_version, limit, at_version);
        the path the view does not keep. -> ProgressListResult (`next`: the next page's
        after_version, None on the last page)."""
        return Call.of("progress.list", rpc.ProgressListResult, session_id=session_id,
                       after_version=after_version, limit=limit, at_version=at_version)

    @rpc_method
    def update_memory(self, /, session_id: str, patch: dict[str, Any], *,
                      expected_version: int | None = None,
                      idempotency_key: str | None = None) -> Call[rpc.MemoryUpdateResult]:
        """Apply a JSON merge patch to the session's memory. -> MemoryUpdateResult."""
        return Call.of("memory.update", rpc.MemoryUpdateResult, session_id=session_id,
                       patch=patch, expected_version=expected_version,
                       idempotency_key=idempotency_key)

    @rpc_method
    def save_checkpoint(
        self, /, session_id: str, payload: Any = None, *, checkpoint_id: str | None = None,
        node_id: str | None = None, resume_from: str | None = None,
        memory: dict[str, Any] | None = None, expected_version: int | None = None,
        idempotency_key: str | None = None,
    ) -> Call[rpc.CheckpointSaveResult]:
        """Save a checkpoint with its payload (any JSON value): its id (default: a new
        one), the node it was taken at, the node to resume from, the memory to restore.
        -> CheckpointSaveResult."""
        return Call.of("checkpoint.save", rpc.CheckpointSaveResult, session_id=session_id,
                       payload=payload, checkpoint_id=checkpoint_id, node_id=node_id,
                       resume_from=resume_from, memory=memory,
                       expected_version=expected_version, idempotency_key=idempotency_key)

    @rpc_method
    def get_checkpoint(self, /, session_id: str,
                       checkpoint_id: str | None = None) -> Call[rpc.CheckpointGetResult]:
        """A checkpoint with its payload (the latest when no id is given).
        -> CheckpointGetResult."""
        return Call.of("checkpoint.get", rpc.CheckpointGetResult, session_id=session_id,
                       checkpoint_id=checkpoint_id)

    @rpc_method
    def list_checkpoints(self, /, session_id: str) -> Call[list[rpc.CheckpointInfo]]:
        """A session's checkpoints, oldest first. -> list[CheckpointInfo]."""
        return Call.picked("checkpoint.list", rpc.CheckpointListResult, lambda r: r.checkpoints,
                           session_id=session_id)

    # --- raw events ---------------------------------------------------------------------

    @rpc_method
    def append_events(self, /, session_id: str, events: list[dict[str, Any]], *,
                      expected_version: int | None = None,
                      idempotency_key: str | None = None) -> Call[rpc.WriteResult]:
        """Append typed events [{type, data}] atomically. -> WriteResult."""
        return Call.of("events.append", rpc.WriteResult, session_id=session_id,
                       events=events, expected_version=expected_version,
                       idempotency_key=idempotency_key)

    @rpc_method
    def read_events(self, /, session_id: str | None = None, *,
                    from_version: int | None = None, from_position: int | None = None,
                    limit: int | None = None,
                    types: list[str] | None = None) -> Call[rpc.EventsReadResult]:
        """Stored events of one session (from_version) or of all (from_position), `limit`
        per page (default 1000), only of `types` when given. -> EventsReadResult."""
        return Call.of("events.read", rpc.EventsReadResult, session_id=session_id,
                       from_version=from_version, from_position=from_position, limit=limit,
                       types=types)

    @rpc_method
    def link_plan(self, /, session_id: str, plan_id: str, *,
                  expected_version: int | None = None,
                  idempotency_key: str | None = None) -> Call[rpc.WriteResult]:
        """Link a plan to the session (duplicates are ignored in the view). -> WriteResult."""
        return Call.of("events.append", rpc.WriteResult, session_id=session_id,
                       events=[{"type": "plan.linked", "data": {"plan_id": plan_id}}],
                       expected_version=expected_version, idempotency_key=idempotency_key)

    @rpc_method
    def record_result(self, /, session_id: str, *, success: bool | None = None,
                      output: dict[str, Any] | None = None, error: str | None = None,
                      expected_version: int | None = None,
                      idempotency_key: str | None = None) -> Call[rpc.WriteResult]:
        """Record the session's result (success, output, error). -> WriteResult."""
        data = {k: v for k, v in (("success", success), ("output", output), ("error", error))
                if v is not None}
        return Call.of("events.append", rpc.WriteResult, session_id=session_id,
                       events=[{"type": "result.recorded", "data": data}],
                       expected_version=expected_version, idempotency_key=idempotency_key)

    # --- executors ------------------------------------------------------------------------

    @rpc_method
    def spawn(
        self, /, argv: list[str], *, cwd: str | None = None,
        env: dict[str, str] | None = None, adapter: Adapter | None = None,
        task: str | None = None, model: str | None = None, source: str | None = None,
        session_id: str | None = None, namespace: str | None = None,
        metadata: dict[str, Any] | None = None,
    ) -> Call[SessionState]:
        """Start an executor process as a new session: argv[0] is looked up on the
        daemon's PATH (env's PATH when given), in cwd (absolute; default: the daemon's),
        with env added to the daemon's environment; adapter "jsonl" (default), "codex" or
        "claude"; task is the first user message. -> SessionState (active, or failed if
        it could not start)."""
        return Call.of("session.spawn", SessionState, argv=argv, cwd=cwd, env=env,
                       adapter=adapter, task=task, model=model, source=source,
                       session_id=session_id, namespace=namespace, metadata=metadata)

    @rpc_method
    def inject(self, /, session_id: str, message: str) -> Call[SessionState]:
        """Run a follow-up turn with `message` (the session must not be running).
        -> SessionState."""
        return Call.of("session.inject", SessionState, session_id=session_id, message=message)

    @rpc_method
    def kill(self, /, session_id: str) -> Call[SessionState]:
        """End the session's process group (SIGTERM, then SIGKILL). -> SessionState (killed)."""
        return Call.of("session.kill", SessionState, session_id=session_id)

    @rpc_method
    def output(self, /, session_id: str, turn: int | None = None,
               stream: Literal["stdout", "stderr"] | None = None, *,
               after_position: int | None = None) -> Call[rpc.OutputResult]:
        """Raw output lines of one turn (default: the latest), of one stream (default:
        both, as they came); after_position: the previous page's `next`.
        -> OutputResult (turn, lines)."""
        return Call.of("session.output", rpc.OutputResult, session_id=session_id, turn=turn,
                       stream=stream, after_position=after_position)

    @rpc_method
    def trajectory_page(self, /, session_id: str, full: bool = False,
                        max_output_len: int | None = None,
                        cursor: str | None = None) -> Call[rpc.TrajectoryResult]:
        """One page of the session's steps (`next_cursor` set when more follow).
        -> TrajectoryResult."""
        # A None cursor is left out, so a daemon before paged trajectories is asked as before.
        return Call.of("session.trajectory", rpc.TrajectoryResult, session_id=session_id,
                       full=full, max_output_len=max_output_len, cursor=cursor)

    # --- search and fork ----------------------------------------------------------------

    @rpc_method
    def search(
        self, /, query: str, *, status: list[Status] | None = None,
        namespace: str | None = None, actor_name: str | None = None,
        since: str | None = None, until: str | None = None, limit: int | None = None,
        hits: int | None = None, mark: tuple[str, str] | None = None,
        cursor: str | None = None,
    ) -> Call[rpc.SearchResult]:
        """Sessions whose text matches an FTS5 query, best first, with `hits` snippets each
        (default 3) between the two `mark` strings; filtered by statuses, namespace,
        actor_name and the match's time (since, until: RFC 3339); `limit` sessions per
        page (default 20), `cursor` the previous page's next_cursor. -> SearchResult."""
        return Call.of("session.search", rpc.SearchResult, query=query, status=status,
                       namespace=namespace, actor_name=actor_name, since=since, until=until,
                       limit=limit, hits=hits, mark=mark, cursor=cursor)

    @rpc_method
    def fork(self, /, session_id: str, at_version: int | None = None,
             new_session_id: str | None = None, *,
             idempotency_key: str | None = None) -> Call[SessionState]:
        """A new session whose history is this one's up to at_version (default: now).
        -> SessionState (the fork's)."""
        return Call.of("session.fork", SessionState, session_id=session_id,
                       at_version=at_version, new_session_id=new_session_id,
                       idempotency_key=idempotency_key)

    @rpc_method
    def forks(self, /, session_id: str, *, limit: int | None = None,
              cursor: str | None = None) -> Call[rpc.ForksResult]:
        """A session's forks by id (limit, cursor), its count and its own source.
        -> ForksResult."""
        return Call.of("session.forks", rpc.ForksResult, session_id=session_id, limit=limit,
                       cursor=cursor)

    @rpc_method
    def reindex(self) -> Call[rpc.ReindexResult]:
        """Rebuild the search index and the fork links from the events. -> ReindexResult."""
        return Call.of("daemon.reindex", rpc.ReindexResult)


def request_line(request_id: int, method: str, params: dict[str, Any]) -> dict[str, Any]:
    """The request object; `None` params are left out so the daemon's defaults apply."""
    return {"jsonrpc": "2.0", "id": request_id, "method": method,
            "params": {k: v for k, v in params.items() if v is not None}}


_encoder = msgspec.json.Encoder()


def encode_request(request_id: int, method: str, params: dict[str, Any]) -> bytes:
    """The request as one line. A NaN or infinity is refused here: JSON has no such
    number, and the encoder would send it as null, which a merge patch takes for
    "delete this key" and a typed field reports as the wrong type."""
    line = _encoder.encode(request_line(request_id, method, params))
    if b"null" in line:  # where the encoder may have put a non-finite float
        where = _non_finite(params, "$")
        if where is not None:
            raise InvalidParamsError(
                f"{where} is not a finite number: sessiond stores only finite numbers"
                " (JSON has no NaN or infinity); nothing was sent",
                {"detail": "not a finite number", "path": where})
    return line + b"\n"


def _non_finite(value: Any, path: str) -> str | None:
    """The path of the first NaN or infinity in `value`, if any."""
    if isinstance(value, float):
        return path if not math.isfinite(value) else None
    if isinstance(value, dict):
        items: Any = ((f"{path}.{k}", v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    elif isinstance(value, msgspec.Struct):
        items = ((f"{path}.{f}", getattr(value, f)) for f in value.__struct_fields__)
    else:
        return None
    for where, item in items:
        found = _non_finite(item, where)
        if found is not None:
            return found
    return None
