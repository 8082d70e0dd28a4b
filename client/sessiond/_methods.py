"""The API, written once: each method names its RPC method and result type.

`Client._call` answers at once; `AsyncClient._call` returns an awaitable. So
every method here is blocking on `Client` and awaitable on `AsyncClient`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.errors import InvalidParamsError
from sessiond_schemas.state import SessionState


class Methods:
    """One method per RPC method; results are the schema Structs named in each docstring."""

    def _call(self, method: str, result_type: Any, pick: Callable[[Any], Any] | None = None,
              **params: Any) -> Any:
        raise NotImplementedError

    # --- daemon -------------------------------------------------------------------------

    def ping(self) -> Any:
        """Check the daemon answers. -> PingResult (version, uptime)."""
        return self._call("daemon.ping", rpc.PingResult)

    def stats(self) -> Any:
        """The daemon's counters. -> StatsResult."""
        return self._call("daemon.stats", rpc.StatsResult)

    def verify(self) -> Any:
        """Check the database, every hash chain and every view against the fold.
        -> VerifyResult (ok, checked_sessions, problems)."""
        return self._call("daemon.verify", rpc.VerifyResult)

    def backup(self, path: str) -> Any:
        """Copy the database online to a new file (an absolute path). -> BackupResult."""
        return self._call("daemon.backup", rpc.BackupResult, path=path)

    # --- sessions -----------------------------------------------------------------------

    def create_session(self, session_id: str | None = None, **fields: Any) -> Any:
        """Create a session (fields as `session.created` data; write options). -> SessionState."""
        return self._call("session.create", SessionState, session_id=session_id, **fields)

    def get_session(self, session_id: str, at_version: int | None = None) -> Any:
        """A session's state, or its state at an earlier version. -> SessionState."""
        return self._call("session.get", SessionState, session_id=session_id,
                          at_version=at_version)

    def resolve(self, prefix: str) -> Any:
        """The one session id starting with `prefix` (>= 4 characters). -> str."""
        return self._call("session.resolve", rpc.ResolveResult, lambda r: r.session_id,
                          prefix=prefix)

    def list_sessions(self, **filters: Any) -> Any:
        """Sessions newest first (namespace, status, actor_name, source, created_after,
        created_before, limit, cursor). -> SessionListResult."""
        return self._call("session.list", rpc.SessionListResult, **filters)

    def transition(self, session_id: str, to: str, **options: Any) -> Any:
        """Move a session to another status (reason, error, paused_at, resume_from).
        -> SessionState."""
        return self._call("session.transition", SessionState, session_id=session_id, to=to,
                          **options)

    def resume(self, session_id: str, checkpoint_id: str | None = None, **options: Any) -> Any:
        """Move a session back to active. -> SessionResumeResult (state, resume)."""
        return self._call("session.resume", rpc.SessionResumeResult, session_id=session_id,
                          checkpoint_id=checkpoint_id, **options)

    def delete_session(self, session_id: str, **options: Any) -> Any:
        """Delete a session with all its events, messages and checkpoints. -> bool."""
        return self._call("session.delete", rpc.DeleteResult, lambda r: r.deleted,
                          session_id=session_id, **options)

    def export_session(self, session_id: str) -> Any:
        """The export document of a session (events, view, checkpoints, checksum). -> dict."""
        return self._call("session.export", Any, session_id=session_id)

    def import_session(self, document: Any, on_conflict: str | None = None) -> Any:
        """Store an export document (a dict, or its JSON text); on_conflict: error, skip,
        replace. -> SessionState."""
        return self._call("session.import", SessionState, document=document,
                          on_conflict=on_conflict)

    def cleanup(self, **options: Any) -> Any:
        """Delete ended sessions idle for older_than_days (statuses, dry_run). -> CleanupResult."""
        return self._call("session.cleanup", rpc.CleanupResult, **options)

    # --- messages -----------------------------------------------------------------------

    def append_message(self, session_id: str, role: str, content: str, **options: Any) -> Any:
        """Append one message (tool_call_id, metadata, expected_version, idempotency_key).
        -> MessageAppendResult."""
        return self._call("message.append", rpc.MessageAppendResult, session_id=session_id,
                          role=role, content=content, **options)

    def append_messages(self, session_id: str, messages: list[dict[str, Any]],
                        **options: Any) -> Any:
        """Append several messages atomically. -> MessageAppendManyResult."""
        return self._call("message.append_many", rpc.MessageAppendManyResult,
                          session_id=session_id, messages=messages, **options)

    def list_messages(self, session_id: str, **page: Any) -> Any:
        """A page of messages (limit, offset, after_sequence, order). -> MessageListResult."""
        return self._call("message.list", rpc.MessageListResult, session_id=session_id, **page)

    # --- tokens, progress, memory, checkpoints ------------------------------------------

    def pop_message(self, session_id: str, **options: Any) -> Any:
        """Take the last message out of the conversation (its events stay). -> MessagePopResult
        (`message` is None when there was none)."""
        return self._call("message.pop", rpc.MessagePopResult, session_id=session_id, **options)

    def clear_messages(self, session_id: str, **options: Any) -> Any:
        """Take every message out of the conversation (its events stay). -> MessageClearResult."""
        return self._call("message.clear", rpc.MessageClearResult, session_id=session_id,
                          **options)

    def record_tokens(self, session_id: str, **usage: Any) -> Any:
        """Add token usage (input_tokens, output_tokens, estimated_cost, model).
        -> TokensRecordResult."""
        return self._call("tokens.record", rpc.TokensRecordResult, session_id=session_id,
                          **usage)

    def record_progress(self, session_id: str, node_id: str, **step: Any) -> Any:
        """Record one graph step (edge, latency_ms, tokens, retries, failed).
        -> ProgressRecordResult."""
        return self._call("progress.record", rpc.ProgressRecordResult, session_id=session_id,
                          node_id=node_id, **step)

    def update_memory(self, session_id: str, patch: dict[str, Any], **options: Any) -> Any:
        """Apply a JSON merge patch to the session's memory. -> MemoryUpdateResult."""
        return self._call("memory.update", rpc.MemoryUpdateResult, session_id=session_id,
                          patch=patch, **options)

    def save_checkpoint(self, session_id: str, payload: Any = None, **fields: Any) -> Any:
        """Save a checkpoint (checkpoint_id, node_id, resume_from, memory) with its payload.
        -> CheckpointSaveResult."""
        return self._call("checkpoint.save", rpc.CheckpointSaveResult, session_id=session_id,
                          payload=payload, **fields)

    def get_checkpoint(self, session_id: str, checkpoint_id: str | None = None) -> Any:
        """A checkpoint with its payload (the latest when no id is given).
        -> CheckpointGetResult."""
        return self._call("checkpoint.get", rpc.CheckpointGetResult, session_id=session_id,
                          checkpoint_id=checkpoint_id)

    def list_checkpoints(self, session_id: str) -> Any:
        """A session's checkpoints, oldest first. -> list[CheckpointInfo]."""
        return self._call("checkpoint.list", rpc.CheckpointListResult, lambda r: r.checkpoints,
                          session_id=session_id)

    # --- raw events ---------------------------------------------------------------------

    def append_events(self, session_id: str, events: list[dict[str, Any]], **options: Any) -> Any:
        """Append typed events [{type, data}] atomically. -> WriteResult."""
        return self._call("events.append", rpc.WriteResult, session_id=session_id,
                          events=events, **options)

    def read_events(self, session_id: str | None = None, **options: Any) -> Any:
        """Stored events (from_version, from_position, limit, types). -> EventsReadResult."""
        return self._call("events.read", rpc.EventsReadResult, session_id=session_id, **options)

    def link_plan(self, session_id: str, plan_id: str, **options: Any) -> Any:
        """Link a plan to the session (duplicates are ignored in the view). -> WriteResult."""
        return self.append_events(
            session_id, [{"type": "plan.linked", "data": {"plan_id": plan_id}}], **options)

    def record_result(self, session_id: str, *, success: bool | None = None,
                      output: dict[str, Any] | None = None, error: str | None = None,
                      **options: Any) -> Any:
        """Record the session's result (success, output, error). -> WriteResult."""
        data = {k: v for k, v in (("success", success), ("output", output), ("error", error))
                if v is not None}
        return self.append_events(
            session_id, [{"type": "result.recorded", "data": data}], **options)

    # --- executors ------------------------------------------------------------------------

    def spawn(self, argv: list[str], **options: Any) -> Any:
        """Start an executor process as a new session (cwd, env, adapter, task, model,
        source, session_id, namespace, metadata). -> SessionState (active, or failed if it
        could not start)."""
        return self._call("session.spawn", SessionState, argv=argv, **options)

    def inject(self, session_id: str, message: str) -> Any:
        """Run a follow-up turn with `message` (the session must not be running). -> SessionState."""
        return self._call("session.inject", SessionState, session_id=session_id, message=message)

    def kill(self, session_id: str) -> Any:
        """End the session's process group (SIGTERM, then SIGKILL). -> SessionState (killed)."""
        return self._call("session.kill", SessionState, session_id=session_id)

    def output(self, session_id: str, turn: int | None = None, stream: str | None = None) -> Any:
        """Raw output lines of one turn (default: the latest). -> OutputResult (turn, lines)."""
        return self._call("session.output", rpc.OutputResult, session_id=session_id, turn=turn,
                          stream=stream)

    def trajectory(self, session_id: str, full: bool = False,
                   max_output_len: int | None = None) -> Any:
        """The session's steps (user, message, reasoning, command, tool_call, ...). -> list[Step]."""
        return self._call("session.trajectory", rpc.TrajectoryResult, lambda r: r.steps,
                          session_id=session_id, full=full, max_output_len=max_output_len)

    # --- search and fork ----------------------------------------------------------------

    def search(self, query: str, **options: Any) -> Any:
        """Sessions whose text matches an FTS5 query, best first, with snippets (status,
        namespace, actor_name, since, until, limit, hits, mark, cursor). -> SearchResult."""
        return self._call("session.search", rpc.SearchResult, query=query, **options)

    def fork(self, session_id: str, at_version: int | None = None,
             new_session_id: str | None = None, **options: Any) -> Any:
        """A new session whose history is this one's up to at_version (default: now).
        -> SessionState (the fork's)."""
        return self._call("session.fork", SessionState, session_id=session_id,
                          at_version=at_version, new_session_id=new_session_id, **options)

    def forks(self, session_id: str, **page: Any) -> Any:
        """A session's forks by id (limit, cursor), its count and its own source.
        -> ForksResult."""
        return self._call("session.forks", rpc.ForksResult, session_id=session_id, **page)

    def reindex(self) -> Any:
        """Rebuild the search index and the fork links from the events. -> ReindexResult."""
        return self._call("daemon.reindex", rpc.ReindexResult)


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
