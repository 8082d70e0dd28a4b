"""session.export in pages: a session's export document, never built whole in memory.

A session of any size is exported as a sequence of pages under `max_page_bytes`: its
events (version order), then the payloads of the checkpoints they saved, each page with
the cursor of the next. The last page carries the view (folded from exactly the exported
events) and the document's checksum, computed in one more pass that streams every event
and payload through SHA-256 in the canonical order (export.checksum's bytes), a page at a
time. The client puts the pages together into the contract's single export document,
which session.import takes as before. A session that fits in one page is answered, as
before, with the whole document.
"""

from __future__ import annotations

import base64
import hashlib
from collections.abc import AsyncIterator
from typing import Any

import msgspec

from sessiond_daemon.core import projection
from sessiond_daemon.core.histories import unreadable_error
from sessiond_daemon.core.request import page_budget
from sessiond_daemon.stores.interface import Store
from sessiond_schemas import export
from sessiond_schemas.errors import InvalidParamsError
from sessiond_schemas.events import Event, now
from sessiond_schemas.export import canonical, link_ok
from sessiond_schemas.state import SessionState

EVENTS_PER_READ = 1000


class Cursor(msgspec.Struct, array_like=True, forbid_unknown_fields=True):
    """Where the next page starts: the export's fixed end (`upto`, the session's version
    when it began) and time, the next event version (or, once past `upto`, the version
    after which the next checkpoint comes), and the chain hash before it."""

    upto: int
    exported_at: str
    first: int  # the first version of the session's own history (1, or its fork point + 1)
    version: int
    prev: str
    checkpoints_after: int  # -1: still in the events


def _encode(cursor: Cursor) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(cursor)).decode()


def _decode(text: str) -> Cursor:
    try:
        return msgspec.json.decode(base64.urlsafe_b64decode(text.encode()), type=Cursor)
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidParamsError("`cursor` is not a cursor session.export returned",
                                 {"detail": str(exc), "path": "$.cursor"}) from exc


def _moved(session_id: str) -> InvalidParamsError:
    return InvalidParamsError(
        f"session {session_id}'s history changed while it was exported (deleted or replaced"
        " by an import): export it again from the first page",
        {"detail": "history changed", "path": "$.cursor", "session_id": session_id})


async def _events(store: Store, sid: str, first: int, upto: int,
                  max_bytes: int = 0) -> AsyncIterator[list[Event]]:
    """The session's events first..upto, a read (of at most `max_bytes`) at a time."""
    version = first
    while version <= upto:
        page = await store.read_events(session_id=sid, from_version=version, after_position=0,
                                       limit=min(EVENTS_PER_READ, upto - version + 1),
                                       types=None, max_bytes=max_bytes)
        if not page:
            return
        yield list(page)
        version = page[-1].version + 1


async def _checkpoints(store: Store, sid: str, first: int, upto: int, after: int,
                       max_bytes: int = 0) -> AsyncIterator[list[tuple[int, dict[str, Any]]]]:
    """(version, {checkpoint_id, payload}) of the checkpoints the events first..upto saved,
    by version, after `after`; a page (`max_bytes` of payloads, one at least) at a time."""
    while True:
        listed = await store.checkpoints(sid, after_version=max(after, first - 1))
        rows = [r for r in listed if r.version <= upto]
        if not rows:
            return
        page: list[tuple[int, dict[str, Any]]] = []
        used = 0
        for row in rows:
            found = await store.checkpoint(sid, row.checkpoint_id)
            if found is None or found.version != row.version:
                continue  # saved again meanwhile: the import will say which is missing
            if page and max_bytes and used + len(found.payload) > max_bytes:
                break
            page.append((row.version, {"checkpoint_id": row.checkpoint_id,
                                       "payload": msgspec.json.decode(found.payload)}))
            used += len(found.payload)
        if not page:
            after = rows[-1].version
            continue
        yield page
        after = page[-1][0]


async def _sealed(store: Store, sid: str, cur: Cursor) -> tuple[SessionState, str]:
    """The view folded from the exported events and the document's checksum, streamed:
    SHA-256 over the canonical JSON (sorted keys) that export.checksum hashes whole."""
    digest = hashlib.sha256(b'{"checkpoints":[')
    sep, budget = b"", page_budget.get()
    async for page in _checkpoints(store, sid, cur.first, cur.upto, 0, budget):
        for _, cp in page:
            digest.update(sep + canonical(cp))
            sep = b","
    digest.update(b'],"events":[')
    sep, state, prev = b"", None, ""
    try:
        async for events in _events(store, sid, cur.first, cur.upto, budget):
            for e in events:
                digest.update(sep + export.canonical_event(e))
                sep = b","
            state = projection.fold(state, events)
            prev = events[-1].hash
    except (msgspec.DecodeError, msgspec.ValidationError, projection.FoldError) as exc:
        raise unreadable_error(sid, exc) from exc
    if state is None or state.version != cur.upto or prev != cur.prev:
        raise _moved(sid)
    digest.update(b'],"exported_at":' + canonical(cur.exported_at)
                  + b',"format":' + canonical(export.FORMAT)
                  + b',"format_version":' + canonical(export.FORMAT_VERSION)
                  + b',"session":' + canonical(state) + b"}")
    return state, "sha256:" + digest.hexdigest()


async def page(store: Store, state: SessionState, cursor: str | None) -> dict[str, Any]:
    """One page of session.export (the whole document when it fits in the first)."""
    sid, budget = state.session_id, page_budget.get()
    if cursor is None:
        first = state.forked_from.version + 1 if state.forked_from is not None else 1
        cur = Cursor(upto=state.version, exported_at=now(), first=first, version=first,
                     prev="", checkpoints_after=-1)
    else:
        cur = _decode(cursor)
    events: list[Event] = []
    checkpoints: list[dict[str, Any]] = []
    used = 0
    if cur.checkpoints_after < 0:  # the events' pages
        async for read in _events(store, sid, cur.version, cur.upto, budget):
            if cur.prev and not link_ok(cur.prev, read[0]):
                raise _moved(sid)
            events = read
            cur = msgspec.structs.replace(cur, version=read[-1].version + 1, prev=read[-1].hash)
            used = sum(len(e.data_json) for e in read)
            break
        if cur.version > cur.upto:
            cur = msgspec.structs.replace(cur, checkpoints_after=0)
        elif not events:
            raise _moved(sid)  # events that were there are gone
    if cur.checkpoints_after >= 0 and used < budget:  # then the checkpoints' payloads
        done = True
        async for cps in _checkpoints(store, sid, cur.first, cur.upto, cur.checkpoints_after,
                                      budget - used):
            checkpoints = [cp for _, cp in cps]
            cur = msgspec.structs.replace(cur, checkpoints_after=cps[-1][0])
            done = False
            break
        if done or not checkpoints:
            return await _last(store, sid, cur, cursor is None, events, checkpoints)
        more = [v async for v in _peek(store, sid, cur)]
        if not more:
            return await _last(store, sid, cur, cursor is None, events, checkpoints)
    return {"format": export.FORMAT, "format_version": export.FORMAT_VERSION,
            "exported_at": cur.exported_at, "session_id": sid,
            "events": events, "checkpoints": checkpoints,  # their data as stored, not re-encoded
            "next_cursor": _encode(cur)}


async def _peek(store: Store, sid: str, cur: Cursor) -> AsyncIterator[int]:
    """The version of a checkpoint still to come after the cursor, if there is one."""
    rows = await store.checkpoints(sid, after_version=max(cur.checkpoints_after, cur.first - 1))
    for r in rows:
        if r.version <= cur.upto:
            yield r.version
            return


async def _last(store: Store, sid: str, cur: Cursor, whole: bool, events: list[Event],
                checkpoints: list[dict[str, Any]]) -> dict[str, Any]:
    state, checksum = await _sealed(store, sid, cur)
    document: dict[str, Any] = {
        "format": export.FORMAT, "format_version": export.FORMAT_VERSION,
        "exported_at": cur.exported_at, "session": msgspec.to_builtins(state),
        "events": events, "checkpoints": checkpoints, "checksum": checksum}
    if not whole:  # a page: the client puts the document together
        document |= {"session_id": sid, "next_cursor": None}
    return document
