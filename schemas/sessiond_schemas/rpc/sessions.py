"""Session methods: create, get, resolve, list, transition, set_ttl, resume, delete, cleanup,
import, and the bulk views (state.get, session.states)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any, Literal

import msgspec

from ..bounds import PosInt
from ..events import SessionCreated, SessionId, Status
from ..state import SessionState, SessionSummary, TtlSeconds
from .base import Limit1000, Params, WriteOptions, WriteParams, with_write_options
from .events import EventInput

if TYPE_CHECKING:  # what mypy sees; at run time the same Struct is built below
    class SessionCreateParams(SessionCreated, WriteOptions):
        session_id: SessionId | None = None  # type: ignore[assignment]
        events: list[EventInput] = msgspec.field(default_factory=list)
else:
    # The id is optional (the daemon makes one); `events` are appended with the
    # session.created, all or nothing.
    SessionCreateParams = with_write_options(
        SessionCreated, "SessionCreateParams", __name__, session_id=(SessionId | None, None),
        events=(Annotated[list[EventInput], msgspec.Meta(max_length=10_000)], []))


class SessionRef(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str


class SessionGetParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    at_version: PosInt | None = None


class SessionResolveParams(Params, kw_only=True, forbid_unknown_fields=True):
    prefix: Annotated[str, msgspec.Meta(min_length=4)]


class SessionListParams(Params, kw_only=True, forbid_unknown_fields=True):
    namespace: str | None = None
    status: list[Status] | None = None
    actor_name: str | None = None
    source: str | None = None
    created_after: str | None = None
    created_before: str | None = None
    limit: Limit1000 = 50
    cursor: str | None = None


class SessionTransitionParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    to: Status
    reason: str | None = None
    error: str | None = None
    paused_at: str | None = None
    resume_from: str | None = None


class SessionSetTtlParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    # The session's new idle TTL in seconds; null (or left out): none.
    ttl_s: TtlSeconds | None = None


class SessionResumeParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    checkpoint_id: str | None = None


class SessionDeleteParams(WriteParams, kw_only=True, forbid_unknown_fields=True):
    pass


class SessionCleanupParams(Params, kw_only=True, forbid_unknown_fields=True):
    # At most 100,000 days (274 years): older cut-offs fall outside the calendar.
    older_than_days: Annotated[float, msgspec.Meta(ge=0, le=100_000)] = 7
    statuses: list[Status] = msgspec.field(
        default_factory=lambda: ["completed", "failed", "cancelled", "killed", "expired"])
    dry_run: bool = False


class SessionExportParams(Params, kw_only=True, forbid_unknown_fields=True):
    session_id: str
    cursor: str | None = None  # the `next_cursor` of the previous page


class SessionImportParams(Params, kw_only=True, forbid_unknown_fields=True):
    document: Any
    on_conflict: Literal["error", "skip", "replace"] = "error"
    # Refuse a document not written by this host or fleet: every event's hash must be
    # version 2, sealed with this daemon's key (-32007 otherwise).
    strict: bool = False


class ResolveResult(msgspec.Struct, kw_only=True):
    session_id: str


class SessionListResult(msgspec.Struct, kw_only=True):
    sessions: list[SessionSummary]
    next_cursor: str | None
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`


class ResumeInfo(msgspec.Struct, kw_only=True):
    paused_at: str | None
    resume_from: str | None
    memory: dict[str, Any]
    next_node: str | None
    checkpoint_id: str | None


class SessionResumeResult(msgspec.Struct, kw_only=True):
    state: SessionState
    resume: ResumeInfo


class DeleteResult(msgspec.Struct, kw_only=True):
    deleted: bool


class CleanupResult(msgspec.Struct, kw_only=True):
    deleted: int
    session_ids: list[str]


class StateGetParams(Params, kw_only=True, forbid_unknown_fields=True):
    app_name: Annotated[str, msgspec.Meta(min_length=1)]
    user_ids: list[str] = msgspec.field(default_factory=list)


class StateGetResult(msgspec.Struct, kw_only=True):
    app: dict[str, Any]
    users: dict[str, dict[str, Any]]


class SessionStatesParams(Params, kw_only=True, forbid_unknown_fields=True):
    namespace: Annotated[str, msgspec.Meta(min_length=1)]
    prefix: bool = False  # every namespace that starts with `namespace`
    limit: Limit1000 = 1000
    cursor: str | None = None  # the `next` of the previous page


class SessionStatesResult(msgspec.Struct, kw_only=True):
    states: list[SessionState]
    next: str | None
    truncated_by_bytes: bool = False  # the page ended at max_page_bytes, before `limit`
