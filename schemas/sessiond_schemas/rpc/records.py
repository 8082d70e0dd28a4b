"""Recording methods: tokens.record, progress.record, memory.update."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..events import ProgressRecorded, TokensRecorded
from ..state import Progress, TokenUsage
from .base import WriteOptions, WriteParams, WriteResult, with_write_options

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
