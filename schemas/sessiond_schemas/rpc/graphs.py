"""LangGraph checkpoint methods: graph.put, put_writes, get, list, delete_runs, copy, prune."""

from __future__ import annotations

from typing import Any, Literal

import msgspec

from ..bounds import NonNegInt
from ..events import GraphCheckpoint, GraphWrites, SessionId, Typed
from ..state import TtlSeconds
from .base import Params


class GraphPutParams(GraphCheckpoint, kw_only=True, forbid_unknown_fields=True):
    session_id: SessionId
    ttl_s: TtlSeconds | None = None  # the thread's session's idle TTL, if this creates it


class GraphPutWritesParams(GraphWrites, kw_only=True, forbid_unknown_fields=True):
    session_id: SessionId
    ttl_s: TtlSeconds | None = None


class GraphGetParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    ns: str = ""
    checkpoint_id: str | None = None  # default: the latest in `ns`


class GraphListParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str | None = None  # default: every thread
    ns: str | None = None  # default: every namespace
    checkpoint_id: str | None = None
    before: str | None = None  # only checkpoint ids below this one
    filter: dict[str, Any] = msgspec.field(default_factory=dict)  # metadata keys that must be equal
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


class GraphDeltaHistoryParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    ns: str = ""
    checkpoint_id: str | None = None  # default: the latest in `ns`
    channels: list[str]


class ChannelHistory(msgspec.Struct, kw_only=True):
    """What one channel got across a checkpoint's ancestors (LangGraph's
    DeltaChannelHistory): the writes oldest first, and the nearest stored value."""

    writes: list[PendingWrite]
    seed: Typed | None = None  # None: no ancestor stored a value (start empty)


class GraphDeltaHistoryResult(msgspec.Struct, kw_only=True):
    channels: dict[str, ChannelHistory]


class GraphChangeResult(msgspec.Struct, kw_only=True):
    checkpoints: int  # checkpoints pruned, deleted or copied
    sessions: list[str]  # sessions written to
