"""LangGraph: `SessiondSaver`, a checkpointer whose threads are sessiond sessions.

    from sessiond.integrations.langgraph import SessiondSaver

    graph = builder.compile(checkpointer=SessiondSaver())

Each `put` stores one graph.checkpoint event holding the checkpoint and only the channel
values whose versions changed in that step (LangGraph's own serializer's bytes); the
others are found through the daemon's index of earlier events. Pending writes are
graph.writes events. The daemon answers get_tuple and list from its index, so a read
costs the same on a thread of 10 or 10,000 steps. Sync methods use a blocking connection,
async ones an asyncio connection; both are opened on first use.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import random
import re
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from typing import Any, cast

import msgspec
from langchain_core.messages import BaseMessage
from langchain_core.runnables import RunnableConfig
from langgraph.checkpoint.base import (
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol
from langgraph.store.base import TTLConfig

from sessiond_schemas import rpc
from sessiond_schemas.errors import SessionNotFoundError

from .._sync import Client
from ._loop import LoopClient, sized
from ._usage import Prices, tokens
from .langgraph_compaction import compactions

_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")


def session_id_for(thread_id: str) -> str:
    """The session of a thread: the thread id itself when it is a valid session id, else a
    stable hash of it (the thread id is kept in the session's metadata and events)."""
    return thread_id if _ID.match(thread_id) else \
        "lg-" + hashlib.sha256(thread_id.encode()).hexdigest()[:40]


def ttl_seconds(ttl: TTLConfig | None) -> int | None:
    """sessiond's idle TTL (whole seconds, at least 1) for LangGraph's TTLConfig: its
    `default_ttl` is in minutes. Reads never refresh it (sessiond counts idle time from a
    thread's last write), so `refresh_on_read=True` is refused rather than ignored."""
    if not ttl:
        return None
    unknown = set(ttl) - {"default_ttl", "refresh_on_read", "sweep_interval_minutes"}
    if unknown:
        raise TypeError(f"TTLConfig keys sessiond does not know: {sorted(unknown)}")
    if ttl.get("refresh_on_read"):
        raise ValueError("refresh_on_read=True: sessiond's TTL counts from a thread's last"
                         " write; reads do not refresh it (pass refresh_on_read=False)")
    minutes = ttl.get("default_ttl")
    if minutes is None:
        return None
    return max(1, math.ceil(minutes * 60))


class SessiondSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer stored in sessiond (`socket`: the daemon's, by default)."""

    def __init__(self, socket: str | None = None, *,
                 serde: SerializerProtocol | None = None,
                 ttl: TTLConfig | None = None, prices: Prices | None = None,
                 readable: bool = True) -> None:
        """`readable=False`: store the checkpoints only, not the messages and graph steps
        every face of sessiond reads (bench/README.md "LangGraph's readable records")."""
        super().__init__(serde=serde)
        self.prices = prices  # model -> (USD per 1M input, per 1M output tokens); else cost 0
        self.client = Client(socket)
        self.aclient = LoopClient(socket)
        # LangGraph's TTLConfig: default_ttl (minutes) becomes each new thread's idle TTL.
        self.ttl_s = ttl_seconds(ttl)
        # What each checkpoint adds that sessiond reads itself: messages, graph steps.
        self.readable = Readable(readable)

    # --- opening and closing, as LangGraph's savers ------------------------------------

    @classmethod
    def from_socket(cls, socket: str | None = None, *,
                    serde: SerializerProtocol | None = None,
                    ttl: TTLConfig | None = None, prices: Prices | None = None) -> _Opened:
        """A saver for `with` or `async with`, closed at the block's end, as
        `SqliteSaver.from_conn_string` and `AsyncSqliteSaver.from_conn_string` give:

            with SessiondSaver.from_socket() as saver: ...
            async with SessiondSaver.from_socket("/run/sessiond.sock") as saver: ...
        """
        return _Opened(cls(socket, serde=serde, ttl=ttl, prices=prices))

    # LangGraph users reach for this name; here the "connection string" is a socket path.
    from_conn_string = from_socket

    def __enter__(self) -> SessiondSaver:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    async def __aenter__(self) -> SessiondSaver:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.aclose()
        self.close()

    # --- what the calls send ----------------------------------------------------------

    def _typed(self, value: Any) -> dict[str, Any]:
        kind, data = self.serde.dumps_typed(value)
        return {"type": kind, "data": data}

    def _put_params(self, config: RunnableConfig, checkpoint: Checkpoint,
                    metadata: CheckpointMetadata, new_versions: ChannelVersions) -> dict[str, Any]:
        conf = config["configurable"]
        thread_id = conf["thread_id"]
        c: dict[str, Any] = dict(checkpoint)
        values: dict[str, Any] = c.pop("channel_values", {})
        metadata = get_checkpoint_metadata(config, metadata)
        return {
            "session_id": session_id_for(thread_id), "thread_id": thread_id, "ttl_s": self.ttl_s,
            "ns": conf.get("checkpoint_ns", ""), "checkpoint_id": checkpoint["id"],
            "parent_id": conf.get("checkpoint_id"), "checkpoint": self._typed(c),
            "metadata": msgspec.to_builtins(metadata, enc_hook=str, str_keys=True),
            "metadata_typed": self._typed(metadata),
            "channel_versions": {k: str(v) for k, v in checkpoint["channel_versions"].items()},
            "blobs": {k: self._typed(values[k]) if k in values else {"type": "empty", "data": b""}
                      for k in new_versions},
        }

    def _writes_params(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                       task_id: str, task_path: str) -> dict[str, Any]:
        conf = config["configurable"]
        return {
            "session_id": session_id_for(conf["thread_id"]), "thread_id": conf["thread_id"],
            "ttl_s": self.ttl_s,
            "ns": conf.get("checkpoint_ns", ""), "checkpoint_id": conf["checkpoint_id"],
            "task_id": task_id, "task_path": task_path,
            "writes": [{"idx": WRITES_IDX_MAP.get(channel, i), "channel": channel,
                        "value": self._typed(value)} for i, (channel, value) in enumerate(writes)],
        }

    def _usage(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
               task_id: str) -> list[dict[str, Any]]:
        """tokens.record calls for the `usage_metadata` of the messages a task wrote (its
        model calls), one per model. Each is keyed by the checkpoint, task and model, so a
        task's writes stored again never count twice."""
        by_model: dict[str, list[int]] = {}
        for _, value in writes:
            for m in value if isinstance(value, (list, tuple)) else [value]:
                usage = getattr(m, "usage_metadata", None) if isinstance(m, BaseMessage) else None
                if usage:
                    model = str((m.response_metadata or {}).get("model_name") or "")
                    totals = by_model.setdefault(model, [0, 0])
                    totals[0] += int(usage.get("input_tokens") or 0)
                    totals[1] += int(usage.get("output_tokens") or 0)
        conf = config["configurable"]
        calls = []
        for model, (inp, out) in sorted(by_model.items()):
            data = tokens(inp, out, model or None, self.prices)
            if data is None:
                continue
            key = "\0".join((conf.get("checkpoint_ns", ""), conf["checkpoint_id"], task_id,
                             model)).encode()
            calls.append({"session_id": session_id_for(conf["thread_id"]), **data,
                          "idempotency_key": "lg-usage:" + hashlib.sha256(key).hexdigest()})
        return calls

    @staticmethod
    def _delta_params(config: RunnableConfig, channels: Sequence[str]) -> dict[str, Any]:
        conf = config["configurable"]
        return {"session_id": session_id_for(conf["thread_id"]),
                "ns": conf.get("checkpoint_ns", ""), "checkpoint_id": get_checkpoint_id(config),
                "channels": list(dict.fromkeys(channels))}

    def _delta(self, found: rpc.GraphDeltaHistoryResult) -> dict[str, Any]:
        """DeltaChannelHistory entries: `writes` as PendingWrite tuples, `seed` when found."""
        out: dict[str, Any] = {}
        for ch, h in found.channels.items():
            entry: dict[str, Any] = {"writes": [
                (w.task_id, w.channel, self.serde.loads_typed((w.value.type, w.value.data)))
                for w in h.writes]}
            if h.seed is not None:
                entry["seed"] = self.serde.loads_typed((h.seed.type, h.seed.data))
            out[ch] = entry
        return out

    @staticmethod
    def _get_params(config: RunnableConfig) -> dict[str, Any]:
        conf = config["configurable"]
        return {"session_id": session_id_for(conf["thread_id"]),
                "ns": conf.get("checkpoint_ns", ""), "checkpoint_id": get_checkpoint_id(config)}

    @staticmethod
    def _list_params(config: RunnableConfig | None, filter: dict[str, Any] | None,
                     before: RunnableConfig | None, limit: int | None) -> dict[str, Any]:
        conf = config["configurable"] if config else {}
        return {"session_id": session_id_for(conf["thread_id"]) if "thread_id" in conf else None,
                "ns": conf.get("checkpoint_ns"),
                "checkpoint_id": get_checkpoint_id(config) if config else None,
                "before": get_checkpoint_id(before) if before else None,
                "filter": filter or None, "limit": limit}

    @staticmethod
    def _next_page(params: dict[str, Any], found: rpc.GraphListResult) -> dict[str, Any]:
        limit = params["limit"]
        return {**params, "cursor": found.next,
                "limit": None if limit is None else limit - len(found.tuples)}

    @staticmethod
    def _stored_config(config: RunnableConfig, checkpoint: Checkpoint) -> RunnableConfig:
        conf = config["configurable"]
        return {"configurable": {"thread_id": conf["thread_id"],
                                 "checkpoint_ns": conf.get("checkpoint_ns", ""),
                                 "checkpoint_id": checkpoint["id"]}}

    def _tuple(self, t: rpc.GraphTuple) -> CheckpointTuple:
        def loads(v: Any) -> Any:
            return self.serde.loads_typed((v.type, v.data))

        def config_of(checkpoint_id: str) -> RunnableConfig:
            return {"configurable": {"thread_id": t.thread_id, "checkpoint_ns": t.ns,
                                     "checkpoint_id": checkpoint_id}}

        checkpoint: Checkpoint = loads(t.checkpoint)
        checkpoint["channel_values"] = {
            k: loads(v) for k, v in t.channel_values.items() if v.type != "empty"}
        metadata: CheckpointMetadata = (loads(t.metadata_typed) if t.metadata_typed
                                        else cast("CheckpointMetadata", t.metadata))
        return CheckpointTuple(
            config=config_of(t.checkpoint_id),
            checkpoint=checkpoint,
            metadata=metadata,
            parent_config=config_of(t.parent_id) if t.parent_id else None,
            pending_writes=[(w.task_id, w.channel, loads(w.value)) for w in t.pending_writes],
        )

    # --- blocking ---------------------------------------------------------------------

    def put(self, config: RunnableConfig, checkpoint: Checkpoint, metadata: CheckpointMetadata,
            new_versions: ChannelVersions) -> RunnableConfig:
        with sized():
            self.client.call("graph.put", rpc.WriteResult,
                             **self._put_params(config, checkpoint, metadata, new_versions))
        readable = self.readable.of(config, checkpoint, new_versions)
        if readable.needs_last:
            readable.last(self.client.get_session(readable.session_id))
        with sized():
            for method, params, recorded in readable.calls():
                self.client.call(method, Any, **params)
                recorded()
        return self._stored_config(config, checkpoint)

    def put_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                   task_id: str, task_path: str = "") -> None:
        with sized():
            self.client.call("graph.put_writes", rpc.WriteResult,
                             **self._writes_params(config, writes, task_id, task_path))
        for usage in self._usage(config, writes, task_id):
            self.client.record_tokens(**usage)
        sid = session_id_for(config["configurable"]["thread_id"])
        for compaction in compactions(config["configurable"], writes, task_id):
            self.client.compact(sid, **compaction)

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = self.client.call("graph.get", rpc.GraphGetResult, **self._get_params(config))
        return self._tuple(found.tuple) if found.tuple else None

    def list(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
             before: RunnableConfig | None = None,
             limit: int | None = None) -> Iterator[CheckpointTuple]:
        params = self._list_params(config, filter, before, limit)
        while True:
            found = self.client.call("graph.list", rpc.GraphListResult, **params)
            for t in found.tuples:
                yield self._tuple(t)
            if found.next is None:  # else the page ended at the daemon's byte budget
                return
            params = self._next_page(params, found)

    def get_delta_channel_history(self, *, config: RunnableConfig,
                                  channels: Sequence[str]) -> Mapping[str, Any]:
        """LangGraph's DeltaChannel history (per channel: the writes across the
        checkpoint's ancestors, oldest first, and the nearest stored value as `seed`),
        answered by the daemon from its index in one call."""
        if not channels:
            return {}
        found = self.client.call("graph.delta_history", rpc.GraphDeltaHistoryResult,
                                 **self._delta_params(config, channels))
        return self._delta(found)

    def delete_thread(self, thread_id: str) -> None:
        with contextlib.suppress(SessionNotFoundError):
            self.client.delete_session(session_id_for(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        self.client.call("graph.delete_runs", rpc.GraphChangeResult, run_ids=list(run_ids))

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        self.client.call("graph.copy", rpc.GraphChangeResult,
                         source_session_id=session_id_for(source_thread_id),
                         target_session_id=session_id_for(target_thread_id),
                         target_thread_id=target_thread_id)

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        self.client.call("graph.prune", rpc.GraphChangeResult,
                         session_ids=[session_id_for(t) for t in thread_ids], strategy=strategy)

    # --- async ------------------------------------------------------------------------

    async def aput(self, config: RunnableConfig, checkpoint: Checkpoint,
                   metadata: CheckpointMetadata, new_versions: ChannelVersions) -> RunnableConfig:
        with sized():
            await self.aclient.call("graph.put", rpc.WriteResult,
                                    **self._put_params(config, checkpoint, metadata, new_versions))
        readable = self.readable.of(config, checkpoint, new_versions)
        if readable.needs_last:
            readable.last(await self.aclient.get_session(readable.session_id))
        with sized():
            for method, params, recorded in readable.calls():
                await self.aclient.call(method, Any, **params)
                recorded()
        return self._stored_config(config, checkpoint)

    async def aput_writes(self, config: RunnableConfig, writes: Sequence[tuple[str, Any]],
                          task_id: str, task_path: str = "") -> None:
        with sized():
            await self.aclient.call("graph.put_writes", rpc.WriteResult,
                                    **self._writes_params(config, writes, task_id, task_path))
        for usage in self._usage(config, writes, task_id):
            await self.aclient.record_tokens(**usage)
        sid = session_id_for(config["configurable"]["thread_id"])
        for compaction in compactions(config["configurable"], writes, task_id):
            await self.aclient.compact(sid, **compaction)

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        found = await self.aclient.call("graph.get", rpc.GraphGetResult,
                                        **self._get_params(config))
        return self._tuple(found.tuple) if found.tuple else None

    async def alist(self, config: RunnableConfig | None, *, filter: dict[str, Any] | None = None,
                    before: RunnableConfig | None = None,
                    limit: int | None = None) -> AsyncIterator[CheckpointTuple]:
        params = self._list_params(config, filter, before, limit)
        while True:
            found = await self.aclient.call("graph.list", rpc.GraphListResult, **params)
            for t in found.tuples:
                yield self._tuple(t)
            if found.next is None:  # else the page ended at the daemon's byte budget
                return
            params = self._next_page(params, found)

    async def aget_delta_channel_history(self, *, config: RunnableConfig,
                                         channels: Sequence[str]) -> Mapping[str, Any]:
        if not channels:
            return {}
        found = await self.aclient.call("graph.delta_history", rpc.GraphDeltaHistoryResult,
                                        **self._delta_params(config, channels))
        return self._delta(found)

    async def adelete_thread(self, thread_id: str) -> None:
        with contextlib.suppress(SessionNotFoundError):
            await self.aclient.delete_session(session_id_for(thread_id))

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        await self.aclient.call("graph.delete_runs", rpc.GraphChangeResult, run_ids=list(run_ids))

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        await self.aclient.call("graph.copy", rpc.GraphChangeResult,
                                source_session_id=session_id_for(source_thread_id),
                                target_session_id=session_id_for(target_thread_id),
                                target_thread_id=target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        await self.aclient.call("graph.prune", rpc.GraphChangeResult,
                                session_ids=[session_id_for(t) for t in thread_ids],
                                strategy=strategy)

    def get_next_version(self, current: str | int | None, channel: None) -> str:
        """Versions as LangGraph's own savers make them: a zero-padded counter and a random
        tail, so they sort as strings."""
        number = 0 if current is None else current if isinstance(current, int) else \
            int(current.split(".")[0])
        return f"{number + 1:032}.{random.random():016}"

    def close(self) -> None:
        """Close both connections (a later call opens them again)."""
        self.client.close()
        self.aclient.close()

    async def aclose(self) -> None:
        await self.aclient.aclose()


class _Opened:
    """What `SessiondSaver.from_socket` returns: the saver, for `with` and `async with`."""

    def __init__(self, saver: SessiondSaver) -> None:
        self.saver = saver

    def __enter__(self) -> SessiondSaver:
        return self.saver

    def __exit__(self, *exc_info: object) -> None:
        self.saver.close()

    async def __aenter__(self) -> SessiondSaver:
        return self.saver

    async def __aexit__(self, *exc_info: object) -> None:
        await self.saver.aclose()
        self.saver.close()


# --- what sessiond itself reads of a thread ---------------------------------------------
#
# A checkpoint's blobs are LangGraph's serializer's bytes, which no face of sessiond can
# read. So each put also records, as sessiond's own events, what it adds to the root
# graph's conversation and path: the new messages of its `messages` channel (with their
# tool calls and results: message.append_many) and the nodes that ran in the step that
# made it (progress.recorded, through events.append). Each is keyed by the checkpoint, so
# a put sent again records nothing twice. Token usage is recorded from the writes
# (`_usage`). A step's node names are read off the checkpoint's versions_seen, compared
# with the thread's previous checkpoint put through this saver (puts come in order; the
# writes do not): the first put of a thread in a process has nothing to compare with and
# records no step.

_ROLES = {"human": "user", "ai": "assistant", "system": "system", "tool": "tool"}


def readable_message(m: Any) -> dict[str, Any] | None:
    """A LangChain message as a sessiond message (role, text, tool calls or the call a
    result answers); None for what is not a conversation message (RemoveMessage, ...)."""
    role = _ROLES.get(getattr(m, "type", ""))
    if role is None:
        return None
    got = m.text  # a str (newer langchain-core: a str that may also be called) or a method
    text = str(got) if isinstance(got, str) else got() if callable(got) else str(m.content)
    meta: dict[str, Any] = {"langgraph": {k: v for k, v in (("id", m.id), ("name", m.name))
                                          if v}}
    out: dict[str, Any] = {"role": role, "content": text, "metadata": meta}
    calls = [{"id": c.get("id"), "name": c.get("name"), "args": c.get("args")}
             for c in getattr(m, "tool_calls", None) or []]
    if calls:
        meta["tool_calls"] = calls
        if not text.strip():  # what a search finds, and a face shows, for a bare call
            out["content"] = "\n".join(
                f"{c['name']}({msgspec.json.encode(c['args']).decode()})" for c in calls)
    if not out["content"].strip():  # sessiond keeps no blank message
        out["content"] = f"[{m.type} message]"
    if role == "tool":
        out["tool_call_id"] = m.tool_call_id
        if getattr(m, "status", None) == "error":
            meta["is_error"] = True
    return out


class Readable:
    """Per thread (and namespace) of this saver: the previous checkpoint's versions_seen
    and the id of the last message recorded."""

    def __init__(self, on: bool = True) -> None:
        self.on = on
        self.seen: dict[tuple[str, str], dict[str, Any]] = {}
        self.last_id: dict[tuple[str, str], str | None] = {}

    def of(self, config: RunnableConfig, checkpoint: Checkpoint,
           new_versions: ChannelVersions) -> _Step:
        conf = config["configurable"]
        return _Step(self, (conf["thread_id"], conf.get("checkpoint_ns", "")), checkpoint,
                     self.on and "messages" in new_versions)


class _Step:
    """What one put records; `needs_last`: the thread's last message must be looked up
    first (`last`) to know which messages are new."""

    def __init__(self, book: Readable, key: tuple[str, str], checkpoint: Checkpoint,
                 messages_changed: bool) -> None:
        self.book, self.key, self.checkpoint = book, key, checkpoint
        self.session_id = session_id_for(key[0])
        values = checkpoint.get("channel_values") or {}
        found = values.get("messages") if messages_changed else None
        self.messages = found if isinstance(found, list) and not key[1] else []
        self.needs_last = bool(self.messages) and key not in book.last_id

    def last(self, state: Any) -> None:
        """What the session's last message says of the thread's messages recorded: none
        (an empty session), up to this LangGraph message id, or, when the last message is
        not one of this saver's (`""`), unknown: only what later puts add is recorded."""
        m = state.last_message
        lg = (m.metadata or {}).get("langgraph") if m is not None else None
        self.book.last_id[self.key] = None if m is None else \
            str(lg.get("id") or "") if isinstance(lg, dict) else ""

    def calls(self) -> list[tuple[str, dict[str, Any], Callable[[], None]]]:
        """The calls to make, each with what to do once it is made: the thread's book
        moves on only past what was recorded (a call that fails leaves it, so the next
        put records what this one did not, and nothing twice)."""
        out: list[tuple[str, dict[str, Any], Callable[[], None]]] = []
        if not self.book.on:
            return out
        digest = hashlib.sha256("\0".join((*self.key, self.checkpoint["id"])).encode())
        key = digest.hexdigest()[:40]
        new, last = self._new_messages()
        if new:
            out.append(("message.append_many", {"session_id": self.session_id,
                                                "messages": new,
                                                "idempotency_key": "lg-messages:" + key},
                        lambda: self.book.last_id.__setitem__(self.key, last)))
        elif last is not _UNSET:  # nothing to record, but where the next put's start
            self.book.last_id[self.key] = last
        nodes, seen = self._nodes()
        if nodes:
            out.append(("events.append", {
                "session_id": self.session_id, "idempotency_key": "lg-steps:" + key,
                "events": [{"type": "progress.recorded", "data": {"node_id": n}}
                           for n in nodes]}, lambda: self.book.seen.__setitem__(self.key, seen)))
        else:
            self.book.seen[self.key] = seen
        return out

    def _new_messages(self) -> tuple[list[dict[str, Any]], Any]:
        """The messages not recorded yet, and the id to take the next put's from (the
        channel's last message's; _UNSET when the channel is not in this put)."""
        if not self.messages:
            return [], _UNSET
        last = self.book.last_id.get(self.key)
        ids = [getattr(m, "id", None) for m in self.messages]
        start = len(ids) - ids[::-1].index(last) if last in ids else 0
        if last is not None and last not in ids:
            # History rewritten (a message removed), or not known: what follows is new.
            start = len(ids)
        found = [r for r in map(readable_message, self.messages[start:]) if r is not None]
        return found, ids[-1]  # from here on, what follows it is new

    def _nodes(self) -> tuple[list[str], dict[str, Any]]:
        """The nodes that ran in this step, and the versions_seen to compare the next with."""
        seen = self.checkpoint.get("versions_seen") or {}
        before = self.book.seen.get(self.key)
        now = {k: dict(v) for k, v in seen.items()}
        if before is None:
            return [], now
        return [n for n, v in seen.items()
                if not n.startswith("__") and before.get(n) != v], now


_UNSET: Any = object()
