"""Search and fork: session.search, session.fork, session.forks."""

from __future__ import annotations

from typing import Annotated

import msgspec

from ..bounds import PosInt
from ..events import SessionId, Status
from ..state import ForkLink
from .base import IdempotencyKey, Limit1000, Params

SearchQuery = Annotated[str, msgspec.Meta(min_length=1, max_length=1000)]


class SessionSearchParams(Params, kw_only=True, forbid_unknown_fields=True):
    query: SearchQuery  # FTS5 query syntax: words, "phrases", prefix*, AND OR NOT, NEAR()
    status: list[Status] | None = None
    namespace: str | None = None
    actor_name: str | None = None
    since: str | None = None  # the matching event's time, RFC 3339
    until: str | None = None
    limit: Annotated[int, msgspec.Meta(ge=1, le=100)] = 20  # sessions per page
    hits: Annotated[int, msgspec.Meta(ge=1, le=20)] = 3  # snippets per session
    mark: tuple[Annotated[str, msgspec.Meta(max_length=16)],
                Annotated[str, msgspec.Meta(max_length=16)]] = ("\u00ab", "\u00bb")
    cursor: str | None = None


class SearchHit(msgspec.Struct, kw_only=True):
    """One matching event: a message (with its sequence) or a session field."""

    position: int
    version: int
    type: str
    recorded_at: str
    snippet: str  # the match between the two `mark` strings
    sequence: int | None = None  # message.appended only
    role: str | None = None
    current: bool | None = None  # the message is still in the conversation (not popped)


class SearchSession(msgspec.Struct, kw_only=True):
    session_id: str
    status: str
    namespace: str
    actor_name: str | None
    task: str | None
    updated_at: str
    # bm25 of its best hit; for a broad query minus its newest match's position. Lower first.
    score: float
    matches: int  # events of the session that match
    hits: list[SearchHit]


class SearchResult(msgspec.Struct, kw_only=True):
    sessions: list[SearchSession]
    # False when more events matched than one query ranks (the newest 5,000 were):
    # narrow the query or add filters to reach older ones.
    complete: bool = True
    next_cursor: str | None = None


class SessionForkParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    at_version: PosInt | None = None  # default: the latest
    new_session_id: SessionId | None = None
    idempotency_key: IdempotencyKey | None = None


class SessionForksParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    limit: Limit1000 = 100
    cursor: str | None = None


class ForkInfo(msgspec.Struct, kw_only=True):
    session_id: str
    version: int  # the source's version the fork was taken at
    forked_at: str


class ForksResult(msgspec.Struct, kw_only=True):
    session_id: str
    forked_from: ForkLink | None  # this session's own source
    count: int
    forks: list[ForkInfo]
    next_cursor: str | None = None
