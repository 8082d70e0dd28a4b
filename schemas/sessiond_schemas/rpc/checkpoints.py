"""Checkpoint methods: checkpoint.save, get, list."""

from __future__ import annotations

from typing import Any

import msgspec

from ..bounds import NonNegInt
from .base import ItemId, Params, WriteParams, WriteResult
from .sessions import SessionRef


class CheckpointSaveParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    checkpoint_id: ItemId | None = None
    node_id: str | None = None
    resume_from: str | None = None
    memory: dict[str, Any] = msgspec.field(default_factory=dict)
    payload: Any = None


class CheckpointGetParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    checkpoint_id: str | None = None


class CheckpointListParams(SessionRef, kw_only=True, forbid_unknown_fields=True):
    after_version: NonNegInt = 0  # the `next` of the previous page


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


class CheckpointListResult(msgspec.Struct, kw_only=True):
    checkpoints: list[CheckpointInfo]
    next: int | None = None  # set when the page ended at max_page_bytes: the after_version
    truncated_by_bytes: bool = False
