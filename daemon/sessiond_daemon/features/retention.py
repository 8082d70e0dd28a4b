"""Retention past a compaction (issue 48): session.trim takes a session's history out of
the store behind its last compaction, when it is older than N days (the namespace's
`trim_after_days`, opt-in). The trim is an event, session.trimmed, that records where
the history now starts and the anchor (the hash of the last event trimmed) from which
the events kept still verify; its read model deletes the events and their rows in the
same commit. It trims to a snapshot, so the view folds on from there."""

from __future__ import annotations

import os
from datetime import UTC, datetime, timedelta

import msgspec
import structlog

from sessiond_daemon.core.commands import Commands, default_ttl, require
from sessiond_daemon.core.writer import Plan, forked_error
from sessiond_daemon.features.context import Context
from sessiond_daemon.stores.interface import Store
from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    HistoryGoneError,
    InvalidParamsError,
    SessiondError,
    VersionConflictError,
)
from sessiond_schemas.events import EventMeta, HistoryTrimmed, SessionCompacted
from sessiond_schemas.state import SessionState

log = structlog.get_logger("sessiond.retention")
TRIES = 8  # a trim is planned from reads: tried again this often when writes come between
# Events one trim takes out at most: its deletes run in one commit, which holds the writer;
# a longer history is trimmed by calling again (each call goes on from where it stopped).
MAX_TRIM_EVENTS = 10_000


def gone(state: SessionState, what: str) -> HistoryGoneError:
    """-32015: `what` is before where the session's stored history starts."""
    h = state.history
    assert h is not None
    return HistoryGoneError(
        f"{what} of session {state.session_id} was trimmed by retention: its history now"
        f" starts at version {h.version} (after a compaction)",
        {"session_id": state.session_id, "starts_at": h.version, "anchor": h.anchor})


def check_version(state: SessionState, version: int, what: str) -> None:
    """Refuse a read at or from `version` when retention trimmed it."""
    if state.history is not None and version < state.history.version:
        raise gone(state, what)


class Retention:
    """The method of retention: session.trim."""

    def __init__(self, store: Store, commands: Commands, context: Context,
                 days: dict[str, float]) -> None:
        self.store, self.commands, self.context = store, commands, context
        self.days = days  # the config's trim_after_days: namespace (or "prefix*") -> days
        # Whose compactions retention trims behind: the daemon's owner's and root's (a
        # peer may compact, a default peer method, but not delete: docs/protocol.md).
        self.trusted = frozenset({os.getuid(), 0})

    async def session_trim(self, p: rpc.SessionTrimParams, meta: EventMeta) -> rpc.TrimResult:
        for _ in range(TRIES):
            state = await self.commands.state(p.session_id)
            data = await self._plan(p, state)
            if data is None or p.dry_run:
                return rpc.TrimResult(
                    session_id=state.session_id, version=state.version,
                    starts_at=data.through_version + 1 if data else None,
                    anchor=data.anchor if data else None,
                    trimmed_events=await self._count(state, data))
            trimmed = await self._count(state, data)

            def plan(s: SessionState | None, data: HistoryTrimmed = data,
                     trimmed: int = trimmed) -> Plan:
                s = require(s, p.session_id)
                # A fork made since the plan's read shares what the trim takes out: the
                # store refuses the trim then, inside the commit (-32003).
                return Plan([("session.trimmed", data)], lambda st, ev: rpc.TrimResult(
                    session_id=st.session_id, version=st.version,
                    starts_at=data.through_version + 1, anchor=data.anchor,
                    trimmed_events=trimmed), unforked="trimmed")
            try:
                raw = await self.commands.submit(
                    p.session_id, meta, plan, idempotency_key=p.idempotency_key,
                    expected_version=state.version if p.expected_version is None
                    else p.expected_version)
            except VersionConflictError:
                if p.expected_version is not None:
                    raise
                continue
            return msgspec.json.decode(raw, type=rpc.TrimResult)
        raise VersionConflictError(
            f"session.trim: session {p.session_id} changed between the read and the write"
            f" {TRIES} times in a row; nothing was trimmed: retry later",
            {"session_id": p.session_id})

    async def sweep(self, meta: EventMeta) -> int:
        """One pass of the config's retention: every session of a namespace in
        trim_after_days trimmed once (a call each, MAX_TRIM_EVENTS at most; the next pass
        goes on); how many were trimmed. A session's failure is logged, never the pass's."""
        done, after = 0, ""
        while ids := await self.store.session_ids(after, 500):
            for sid in ids:
                try:
                    state = await self.commands.state(sid)
                    if state.context is None or default_ttl(self.days, state.namespace) is None:
                        continue
                    trimmed = await self.session_trim(rpc.SessionTrimParams(session_id=sid),
                                                      meta)
                    done += trimmed.starts_at is not None
                except SessiondError as exc:  # forked, changing, gone meanwhile: next pass
                    log.info("retention.trim_skipped", session_id=sid, error=exc.message)
            after = ids[-1]
        return done

    async def _plan(self, p: rpc.SessionTrimParams,
                    state: SessionState) -> HistoryTrimmed | None:
        """The trim of `state` p asks for, or None when there is nothing to trim."""
        days = p.older_than_days
        if days is None:
            days = default_ttl(self.days, state.namespace)  # the same lookup: name, prefix*
        if days is None:
            raise InvalidParamsError(
                f"retention is off for namespace {state.namespace!r}: give older_than_days,"
                " or set trim_after_days for it in the config",
                {"detail": "retention off", "path": "$.older_than_days"})
        if (forks := await self.store.fork_count(state.session_id)) > 0:
            raise forked_error(state.session_id, forks, "trimmed")
        start = state.context
        if start is None or start.session_id != state.session_id:
            return None  # never compacted, or the compaction is its source's history
        event = await self.context.compaction_event(start)
        if event.meta.peer_uid not in self.trusted:
            return None  # a peer's summary moves the context, never what retention deletes
        compaction = event.data
        assert isinstance(compaction, SessionCompacted)
        before = (datetime.now(UTC) - timedelta(days=days)).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
        first = state.history.version if state.history else (
            state.forked_from.version + 1 if state.forked_from else 1)
        point = await self.store.trim_point(
            state.session_id, min(compaction.through_version, first + MAX_TRIM_EVENTS - 1),
            before, compaction.through_sequence + 1)
        if point is None:
            return None
        version, anchor, view = point
        if state.history is not None and version < state.history.version:
            return None  # trimmed that far already
        return HistoryTrimmed(through_version=version, anchor=anchor,
                              through_sequence=min(view.message_count,
                                                   compaction.through_sequence + 1) - 1)

    async def _count(self, state: SessionState, data: HistoryTrimmed | None) -> int:
        if data is None:
            return 0
        first = state.history.version if state.history else (
            state.forked_from.version + 1 if state.forked_from else 1)
        return max(0, data.through_version - first + 1)
