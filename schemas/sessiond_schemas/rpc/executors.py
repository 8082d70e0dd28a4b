"""Executor methods: session.spawn, inject, output, trajectory (session.kill takes a
SessionRef)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from ..bounds import NonNegInt, PosInt
from ..events import SessionId
from .base import NoNul, Params

Adapter = Literal["jsonl", "codex", "claude"]


class SessionSpawnParams(Params, kw_only=True, forbid_unknown_fields=True):
    argv: Annotated[list[Annotated[str, msgspec.Meta(min_length=1, pattern=r"^[^\x00]+$")]],
                    msgspec.Meta(min_length=1)]
    cwd: NoNul | None = None  # absolute; default: the daemon's working directory
    # added to the daemon's environment
    env: dict[NoNul, NoNul] = msgspec.field(default_factory=dict)
    adapter: Adapter = "jsonl"
    task: str | None = None  # the first user message, written to the process's stdin
    model: str | None = None
    source: str = "user"
    session_id: SessionId | None = None
    namespace: str | None = None
    metadata: dict[str, Any] = msgspec.field(default_factory=dict)


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
    cursor: str | None = None  # the `next_cursor` of the previous page


class Step(msgspec.Struct, kw_only=True):
    type: str
    summary: str
    details: dict[str, Any] = {}
    turn: int = 0


class TrajectoryResult(msgspec.Struct, kw_only=True):
    steps: list[Step]
    # Set when more steps follow: pass it back as `cursor` (protocol: session.trajectory).
    next_cursor: str | None = None
    truncated_by_bytes: bool = False
