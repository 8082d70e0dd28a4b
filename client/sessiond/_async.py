"""The async client: one Unix-socket connection, pipelined requests matched by id."""

from __future__ import annotations

import itertools
from types import TracebackType
from typing import Any, TypeVar

import anyio
import msgspec
from anyio.abc import SocketStream, TaskGroup
from anyio.streams.buffered import BufferedByteReceiveStream
from sessiond_schemas import rpc
from sessiond_schemas.errors import SessiondError, error_from_wire
from sessiond_schemas.paths import default_socket
from sessiond_schemas.state import SessionState

T = TypeVar("T")
_encoder = msgspec.json.Encoder()
_response_decoder = msgspec.json.Decoder(rpc.Response)
_MAX_LINE = 1 << 30


class ConnectionLostError(SessiondError):
    """The connection to the daemon closed before the answer came."""


class _Pending:
    __slots__ = ("done", "result", "error")

    def __init__(self) -> None:
        self.done = anyio.Event()
        self.result: msgspec.Raw | None = None
        self.error: SessiondError | None = None


class AsyncClient:
    """Talk to a sessiond daemon: `async with AsyncClient() as c: await c.ping()`."""

    def __init__(self, socket_path: str | None = None) -> None:
        self.socket_path = socket_path or default_socket()
        self._stream: SocketStream | None = None
        self._tg: TaskGroup | None = None
        self._ids = itertools.count(1)
        self._pending: dict[int, _Pending] = {}
        self._send_lock = anyio.Lock()

    async def __aenter__(self) -> AsyncClient:
        await self.connect()
        return self

    async def __aexit__(self, et: type[BaseException] | None, e: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def connect(self) -> None:
        """Open the connection and start reading answers."""
        self._stream = await anyio.connect_unix(self.socket_path)
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        self._tg.start_soon(self._read_loop, self._stream)

    async def aclose(self) -> None:
        """Close the connection; calls still waiting get ConnectionLostError."""
        if self._tg is None:
            return
        assert self._stream is not None
        await self._stream.aclose()
        self._tg.cancel_scope.cancel()
        await self._tg.__aexit__(None, None, None)
        self._tg = None
        self._fail_pending("connection closed")

    async def _read_loop(self, stream: SocketStream) -> None:
        reader = BufferedByteReceiveStream(stream)
        try:
            while True:
                line = await reader.receive_until(b"\n", _MAX_LINE)
                self._on_line(line)
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.ClosedResourceError,
                anyio.BrokenResourceError, ConnectionError):
            pass
        finally:
            self._fail_pending("the daemon closed the connection")

    def _on_line(self, line: bytes) -> None:
        replies = msgspec.json.decode(line, type=list[rpc.Response]) if line[:1] == b"[" else [
            _response_decoder.decode(line)]
        for reply in replies:
            if isinstance(reply.error, rpc.ErrorObject) and reply.id is None:
                # An answer to no request: the daemon refused the connection itself.
                err = reply.error
                self._fail_pending(err.message, error_from_wire(err.code, err.message, err.data))
                continue
            pending = self._pending.pop(reply.id, None) if isinstance(reply.id, int) else None
            if pending is None:
                continue
            if isinstance(reply.error, rpc.ErrorObject):
                err = reply.error
                data = err.data if isinstance(err.data, dict) else {}
                pending.error = error_from_wire(err.code, err.message, data)
            else:
                pending.result = reply.result if isinstance(reply.result, msgspec.Raw) else None
            pending.done.set()

    def _fail_pending(self, why: str, error: SessiondError | None = None) -> None:
        for pending in self._pending.values():
            pending.error = error or ConnectionLostError(why)
            pending.done.set()
        self._pending.clear()

    async def call(self, method: str, result_type: type[T] | Any = Any, **params: Any) -> T:
        """Call any method; `None` params are left out, so the daemon's defaults apply."""
        if self._stream is None or self._tg is None:
            raise ConnectionLostError("not connected; use `async with AsyncClient()`")
        request_id = next(self._ids)
        pending = self._pending[request_id] = _Pending()
        body = {k: v for k, v in params.items() if v is not None}
        line = _encoder.encode({"jsonrpc": "2.0", "id": request_id, "method": method,
                                "params": body})
        try:
            async with self._send_lock:
                await self._stream.send(line + b"\n")
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError) as exc:
            self._pending.pop(request_id, None)
            raise ConnectionLostError(f"cannot send to the daemon: {exc}") from exc
        await pending.done.wait()
        if pending.error is not None:
            raise pending.error
        assert pending.result is not None
        return msgspec.json.decode(pending.result, type=result_type)  # type: ignore[no-any-return]

    # --- daemon -------------------------------------------------------------------------

    async def ping(self) -> rpc.PingResult:
        """Check the daemon answers; returns its version and uptime."""
        return await self.call("daemon.ping", rpc.PingResult)

    async def stats(self) -> rpc.StatsResult:
        """Return the daemon's counters."""
        return await self.call("daemon.stats", rpc.StatsResult)

    # --- sessions -----------------------------------------------------------------------

    async def create_session(self, session_id: str | None = None, **fields: Any) -> SessionState:
        """Create a session (fields as `session.created` data; write options too)."""
        return await self.call("session.create", SessionState, session_id=session_id, **fields)

    async def get_session(self, session_id: str, at_version: int | None = None) -> SessionState:
        """Return a session's state, or its state at an earlier version."""
        return await self.call("session.get", SessionState, session_id=session_id,
                               at_version=at_version)

    async def resolve(self, prefix: str) -> str:
        """Return the one session id starting with `prefix` (at least 4 characters)."""
        result = await self.call("session.resolve", rpc.ResolveResult, prefix=prefix)
        return result.session_id

    async def list_sessions(self, **filters: Any) -> rpc.SessionListResult:
        """List sessions newest first (namespace, status, actor_name, source, created_after,
        created_before, limit, cursor)."""
        return await self.call("session.list", rpc.SessionListResult, **filters)

    async def transition(self, session_id: str, to: str, **options: Any) -> SessionState:
        """Move a session to another status (reason, error, paused_at, resume_from)."""
        return await self.call("session.transition", SessionState, session_id=session_id,
                               to=to, **options)

    async def resume(self, session_id: str, checkpoint_id: str | None = None,
                     **options: Any) -> rpc.SessionResumeResult:
        """Move a session back to active; returns the state and what to resume with."""
        return await self.call("session.resume", rpc.SessionResumeResult,
                               session_id=session_id, checkpoint_id=checkpoint_id, **options)

    async def delete_session(self, session_id: str, **options: Any) -> bool:
        """Delete a session with all its events, messages and checkpoints."""
        result = await self.call("session.delete", rpc.DeleteResult, session_id=session_id,
                                 **options)
        return result.deleted

    # --- messages -----------------------------------------------------------------------

    async def append_message(self, session_id: str, role: str, content: str,
                             **options: Any) -> rpc.MessageAppendResult:
        """Append one message (tool_call_id, metadata, expected_version, idempotency_key)."""
        return await self.call("message.append", rpc.MessageAppendResult, session_id=session_id,
                               role=role, content=content, **options)

    async def append_messages(self, session_id: str, messages: list[dict[str, Any]],
                              **options: Any) -> rpc.MessageAppendManyResult:
        """Append several messages atomically."""
        return await self.call("message.append_many", rpc.MessageAppendManyResult,
                               session_id=session_id, messages=messages, **options)

    async def list_messages(self, session_id: str, **page: Any) -> rpc.MessageListResult:
        """Read a page of messages (limit, offset, after_sequence, order)."""
        return await self.call("message.list", rpc.MessageListResult, session_id=session_id,
                               **page)

    # --- tokens, progress, memory, checkpoints ------------------------------------------

    async def record_tokens(self, session_id: str, **usage: Any) -> rpc.TokensRecordResult:
        """Add token usage (input_tokens, output_tokens, estimated_cost, model)."""
        return await self.call("tokens.record", rpc.TokensRecordResult, session_id=session_id,
                               **usage)

    async def record_progress(self, session_id: str, node_id: str,
                              **step: Any) -> rpc.ProgressRecordResult:
        """Record one graph step (edge, latency_ms, tokens, retries, failed)."""
        return await self.call("progress.record", rpc.ProgressRecordResult,
                               session_id=session_id, node_id=node_id, **step)

    async def update_memory(self, session_id: str, patch: dict[str, Any],
                            **options: Any) -> rpc.MemoryUpdateResult:
        """Apply a JSON merge patch to the session's memory."""
        return await self.call("memory.update", rpc.MemoryUpdateResult, session_id=session_id,
                               patch=patch, **options)

    async def save_checkpoint(self, session_id: str, payload: Any = None,
                              **fields: Any) -> rpc.CheckpointSaveResult:
        """Save a checkpoint (checkpoint_id, node_id, resume_from, memory) with its payload."""
        return await self.call("checkpoint.save", rpc.CheckpointSaveResult,
                               session_id=session_id, payload=payload, **fields)

    async def get_checkpoint(self, session_id: str,
                             checkpoint_id: str | None = None) -> rpc.CheckpointGetResult:
        """Return a checkpoint with its payload (the latest when no id is given)."""
        return await self.call("checkpoint.get", rpc.CheckpointGetResult, session_id=session_id,
                               checkpoint_id=checkpoint_id)

    async def list_checkpoints(self, session_id: str) -> list[rpc.CheckpointInfo]:
        """List a session's checkpoints, oldest first."""
        result = await self.call("checkpoint.list", rpc.CheckpointListResult,
                                 session_id=session_id)
        return result.checkpoints

    # --- raw events ---------------------------------------------------------------------

    async def append_events(self, session_id: str, events: list[dict[str, Any]],
                            **options: Any) -> rpc.WriteResult:
        """Append typed events [{type, data}] atomically."""
        return await self.call("events.append", rpc.WriteResult, session_id=session_id,
                               events=events, **options)

    async def read_events(self, session_id: str | None = None,
                          **options: Any) -> rpc.EventsReadResult:
        """Read stored events (from_version, from_position, limit, types)."""
        return await self.call("events.read", rpc.EventsReadResult, session_id=session_id,
                               **options)

    async def link_plan(self, session_id: str, plan_id: str, **options: Any) -> rpc.WriteResult:
        """Link a plan to the session (duplicates are ignored in the view)."""
        return await self.append_events(
            session_id, [{"type": "plan.linked", "data": {"plan_id": plan_id}}], **options)

    async def record_result(self, session_id: str, *, success: bool | None = None,
                            output: dict[str, Any] | None = None, error: str | None = None,
                            **options: Any) -> rpc.WriteResult:
        """Record the session's result (success, output, error)."""
        data = {k: v for k, v in (("success", success), ("output", output), ("error", error))
                if v is not None}
        return await self.append_events(
            session_id, [{"type": "result.recorded", "data": data}], **options)
