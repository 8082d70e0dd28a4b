"""Stored histories that may not fold: folding a view again from its events, catching
views up at start, marking what is damaged, and checking an imported history.

Stored data never stops the daemon: what cannot be folded marks its session
(reported in the log and by daemon.verify), and everything else is served.
"""

from __future__ import annotations

from typing import Any

import msgspec
import structlog

from sessiond_daemon.core import projection
from sessiond_daemon.stores.interface import Batch, Entry, EventStore
from sessiond_schemas.bounds import bound_message, has_long_digits, json_out_of_bounds
from sessiond_schemas.errors import SessionImportError, StorageError
from sessiond_schemas.events import Event, Unread
from sessiond_schemas.state import SessionState

log = structlog.get_logger("sessiond.writer")


def check_import(events: list[Event]) -> None:
    """What the fold does not look at in an imported history: the data of graph events
    (their indexes read it) and every number of free-form data. -32007 if wrong."""
    for e in events:
        reason = None
        if e.type.startswith("graph.") and isinstance(e.data, Unread):
            reason = f"event at version {e.version} ({e.type}): {e.data.error}"
        bad = out_of_bounds(e.data_json, "$.data") if reason is None else None
        if bad is not None:
            reason = f"event at version {e.version} ({e.type}): {bound_message(*bad)}"
        if reason is not None:
            raise SessionImportError(f"import failed: {reason}", {"reason": reason})


def out_of_bounds(data_json: bytes | msgspec.Raw, path: str) -> tuple[str, Any] | None:
    """json_out_of_bounds of data by its JSON: decoded only when the text holds a long
    run of digits (a number that may be past int64)."""
    if isinstance(data_json, msgspec.Raw):  # an import's: bytes to scan
        data_json = memoryview(data_json).tobytes()
    if not has_long_digits(data_json):
        return None
    return json_out_of_bounds(msgspec.json.decode(data_json), path, encoded=data_json)


def damaged_error(session_id: str, problem: str) -> StorageError:
    return StorageError(
        f"session {session_id} cannot be written: its stored history {problem}; nothing was"
        " written. Delete it, or import a good copy with on_conflict=replace.",
        {"detail": problem, "session_id": session_id})


def unreadable_error(session_id: str | None, exc: Exception) -> StorageError:
    """-32012 for stored data that does not read back or fold (not the caller's fault)."""
    whose = f"session {session_id}" if session_id else "a session"
    return StorageError(f"stored data of {whose} does not read back ({exc}); daemon.verify"
                        " reports it", {"detail": str(exc), "session_id": session_id})


class Histories:
    """The writer's view of stored histories: which sessions are damaged, and how to fold
    a view again from what is stored."""

    def __init__(self, store: EventStore) -> None:
        self.store = store
        self.damaged: dict[str, str] = {}  # session id -> what is wrong with its history

    async def rebuild(self, session_id: str, base: Entry | None) -> Entry | None:
        """Fold a session's stored events after `base` (all of them when None); on a
        history that does not fold, mark the session damaged and return `base`."""
        state: SessionState | None = base.state if base is not None else None
        last: Event | None = None
        version = state.version + 1 if state is not None else 1
        page: list[Event] = []
        try:
            while True:
                page = await self.store.read_events(session_id=session_id, from_version=version,
                                                    after_position=0, limit=1000, types=None)
                if not page:
                    break
                state, last = projection.fold(state, page), page[-1]
                version = page[-1].version + 1
        except Exception as exc:  # any stored data that cannot be read or folded
            good = _last_good(state, page)
            problem = f"does not fold after version {good.version if good else 0}: {exc}"
            self.damaged[session_id] = problem
            log.error("writer.session_damaged", session_id=session_id, problem=problem)
            return base
        if state is None or last is None:
            return base
        return Entry(state, last.hash, last.position)

    async def catch_up(self) -> None:
        """At start: fold the events a stored view is behind (rows written behind the
        daemon's back) and commit the views; a history that does not fold marks its
        session damaged. Stored data never stops the start."""
        try:
            behind = await self.store.sessions_behind()
        except Exception:
            log.exception("writer.catch_up_failed")
            return
        for session_id in behind:
            try:
                base = await self.store.load_entry(session_id)
            except Exception:
                base = None
            entry = await self.rebuild(session_id, base)
            if entry is None or entry is base:
                continue
            batch = Batch(views={session_id: entry},
                          bases={session_id: base.state.version if base else 0})
            try:
                if await self.store.commit(batch) is not None:
                    continue  # another writer moved it on: its view is its own
            except Exception:
                log.exception("writer.catch_up_failed", session_id=session_id)
                continue
            log.warning("writer.view_caught_up", session_id=session_id,
                        version=entry.state.version)


def _last_good(state: SessionState | None, page: list[Event]) -> SessionState | None:
    """The view after the last event of `page` that still folds (one at a time: only
    when the page as a whole did not)."""
    for event in page:
        try:
            state = projection.apply(state, event)
        except Exception:
            break
    return state
