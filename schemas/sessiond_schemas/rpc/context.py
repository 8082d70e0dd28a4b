"""Compaction methods: session.compact (a compaction event) and session.context (what the
model sees now: the last compaction's summary and the messages after it, paged)."""

from __future__ import annotations

from typing import Annotated

import msgspec

from ..bounds import INT64_MAX, NonNegInt
from ..events import MAX_SUMMARY_MESSAGES, CompactedBy, SummaryMessage
from ..state import Message
from .base import Limit1000, Params, WriteParams

Sequence = Annotated[int, msgspec.Meta(ge=-1, le=INT64_MAX)]


class SessionCompactParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    # The summary: one or more messages that stand for the messages up to through_sequence.
    summary: Annotated[list[SummaryMessage], msgspec.Meta(min_length=1,
                                                          max_length=MAX_SUMMARY_MESSAGES)]
    # The last message the summary stands for (-1: none); left out: every message so far.
    through_sequence: Sequence | None = None
    by: CompactedBy = "api"
    reason: str | None = None


class CompactionInput(msgspec.Struct, kw_only=True):
    """`session.compacted` as events.append takes it (an importer's, a drop-in's in the same
    write as its event): the daemon fills `through_version`, and `through_sequence` when
    it is left out (every message before it in the session and the batch)."""

    summary: Annotated[list[SummaryMessage], msgspec.Meta(min_length=1,
                                                          max_length=MAX_SUMMARY_MESSAGES)]
    through_sequence: Sequence | None = None
    by: CompactedBy = "api"
    reason: str | None = None


class SessionTrimParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    # History older than this many days (and behind the last compaction) is trimmed; left
    # out: the namespace's `trim_after_days` (config), and none there: -32602.
    older_than_days: Annotated[float, msgspec.Meta(ge=0, le=100_000)] | None = None
    dry_run: bool = False


class TrimResult(msgspec.Struct, kw_only=True):
    session_id: str
    version: int  # the session's version after the trim (or as read, if nothing was)
    # The first version kept and the anchor its chain goes on from; None: nothing to trim
    # (no compaction, nothing old enough behind it, or already trimmed that far).
    starts_at: int | None
    anchor: str | None
    trimmed_events: int  # events taken out (would be, with dry_run)


class SessionContextParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    limit: Limit1000 = 100
    # The page after this sequence (the last page's `next`); left out: the first page,
    # which carries the summary.
    after_sequence: Sequence | None = None


class Compaction(msgspec.Struct, kw_only=True):
    """The compaction a context starts at: where its event is, what it stands for, who
    made it."""

    session_id: str  # the session whose history holds it (a fork's source, if inherited)
    version: int
    through_sequence: int
    through_version: int
    recorded_at: str
    by: str
    reason: str | None = None


class SessionContextResult(msgspec.Struct, kw_only=True):
    session_id: str
    version: int  # the session's version the read saw
    compaction: Compaction | None  # None: never compacted, the context is every message
    summary: list[SummaryMessage]  # on the first page only (empty on the next ones)
    messages: list[Message]
    total: NonNegInt  # messages in the context (after the summary)
    next: int | None  # after_sequence of the next page; None: this was the last
    truncated_by_bytes: bool = False
