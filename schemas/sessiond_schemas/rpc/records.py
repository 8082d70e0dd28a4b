"""Recording methods: tokens.record, progress.record, memory.update; progress.list."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from ..bounds import NonNegInt, PosInt
from ..events import ProgressRecorded, TokensRecorded
from ..state import Progress, ProgressStep, TokenUsage
from .base import Limit1000, Params, WriteOptions, WriteParams, WriteResult, with_write_options

if TYPE_CHECKING:  # what mypy sees; at run time the same Structs are built below
    class TokensRecordParams(TokensRecorded, WriteOptions): ...
    class ProgressRecordParams(ProgressRecorded, WriteOptions): ...
else:
    TokensRecordParams = with_write_options(TokensRecorded, "TokensRecordParams", __name__)
    ProgressRecordParams = with_write_options(ProgressRecorded, "ProgressRecordParams", __name__)


class MemoryUpdateParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    patch: dict[str, Any]


class TokensRecordResult(WriteResult, kw_only=True):
    token_usage: TokenUsage


class ProgressRecordResult(WriteResult, kw_only=True):
    progress: Progress


class MemoryUpdateResult(WriteResult, kw_only=True):
    memory: dict[str, Any]


class ProgressListParams(Params, kw_only=True, forbid_unknown_fields=True):
    """A page of a session's graph steps, oldest first: those recorded after version
    `after_version` (the `next` of the previous page), and at or before `at_version`
    when given (the path as it was then)."""

    session_id: str
    after_version: NonNegInt = 0
    limit: Limit1000 = 1000
    at_version: PosInt | None = None


class ProgressListResult(msgspec.Struct, kw_only=True):
    steps: list[ProgressStep]
    total: int  # the session's steps_executed now (every step, every page)
    next: int | None = None  # set when more steps follow: the next page's after_version
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`
