"""Keeping the data whole over time: verify, backup, retention, export and import."""

from __future__ import annotations

import os
import re
from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta
from typing import Any

import anyio
import msgspec
import structlog

from sessiond_daemon.core import projection, text
from sessiond_daemon.core.commands import Commands
from sessiond_daemon.core.histories import unreadable_error
from sessiond_daemon.core.writer import Delete, Import, Writer
from sessiond_daemon.features import exports, forks
from sessiond_daemon.features.retention import gone
from sessiond_daemon.features.verify import SessionCheck
from sessiond_daemon.stores.interface import Store
from sessiond_daemon.stores.models.conversation import checkpoint_id
from sessiond_schemas import export, rpc
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    SessiondError,
    SessionExistsError,
    SessionImportError,
    StorageError,
)
from sessiond_schemas.events import (
    Event,
    EventMeta,
    ProcessDetached,
    ProcessStarted,
    SessionForked,
    SessionId,
    moved,
    new_id,
    parse_time,
    typed_event,
)
from sessiond_schemas.export import chain_link, link_ok, sealed_by, split_v2
from sessiond_schemas.state import SessionState

log = structlog.get_logger("sessiond.maintenance")
_json = msgspec.json.Encoder()


class _NoLongerStale(SessiondError):
    """Cleanup found this session active again by the time the writer decided."""


class Maintenance:
    """The contract's data-lifecycle methods, beside the Service they write through."""

    def __init__(self, store: Store, writer: Writer, commands: Commands,
                 state_at: forks.StateAt) -> None:
        self.store = store
        self.writer = writer
        self.commands = commands
        self.state_at = state_at  # a session's view at a version: an imported fork's claim

    async def daemon_verify(self, p: rpc.VerifyParams, meta: EventMeta) -> rpc.VerifyResult:
        if p.document is not None:
            return _verify_document(p.document, self.writer.key)
        caps = self.store.capabilities
        problems = [rpc.VerifyProblem(session_id=None, problem=f"integrity_check: {line}")
                    for line in (await caps.integrity.integrity_check() if caps.integrity
                                 else ["ok"]) if line != "ok"]
        checked, after = 0, ""
        whose = [0, 0, 0]  # sealed, unkeyed, foreign
        while ids := await self.store.session_ids(after, 500):
            for sid in ids:
                found, check = await self._check_session(sid)
                problems += [rpc.VerifyProblem(session_id=sid, problem=text) for text in found]
                if check is not None:
                    whose = [whose[0] + check.sealed, whose[1] + check.unkeyed,
                             whose[2] + check.foreign]
                checked += 1
            after = ids[-1]
        # Sessions the writer found damaged (some have no view row, so the walk above
        # does not meet them).
        reported = {p.session_id for p in problems}
        problems += [rpc.VerifyProblem(session_id=sid, problem=f"stored history {problem}")
                     for sid, problem in sorted(self.writer.damaged.items())
                     if sid not in reported]
        if caps.full_text is not None:
            problems += [rpc.VerifyProblem(session_id=None, problem=text)
                         for text in await caps.full_text.problems()]
        return rpc.VerifyResult(ok=not problems, checked_sessions=checked, problems=problems,
                                sealed_events=whose[0], unkeyed_events=whose[1],
                                foreign_events=whose[2])

    async def _check_session(self, sid: str) -> tuple[list[str], SessionCheck | None]:
        """What is wrong with one session, and its check (whose its events are); stored
        data that does not even read back is one of the problems, never an error of
        verify itself."""
        try:
            # The stored view first, then its events up to its version: a write that
            # lands between the reads is past both (comparing the view with every event
            # read later found a difference that was only that write). A view that stays
            # behind events past it is checked against all of them, as it lags for real.
            raw = await self.store.state_json(sid)
            stored = msgspec.json.decode(raw, type=SessionState) if raw else None
            upto = stored.version if stored is not None else None
            check, found = await self._fold_check(sid, stored, upto)
            if upto is not None and not found and await self._lags(sid, upto):
                check, found = await self._fold_check(sid, stored, None)
            if check.state is not None and check.state.forked_from is not None \
                    and check.first_version <= check.state.forked_from.version + 1:
                found += await forks.link_problems(self.store, check.state, check.first)
            return found, check
        except StorageError:
            raise  # the file itself, not this session: verify cannot go on
        except Exception as exc:
            log.warning("verify.unreadable", session_id=sid, error=str(exc))
            return [f"stored data does not read back: {exc}"], None

    async def _fold_check(self, sid: str, stored: SessionState | None,
                          upto: int | None) -> tuple[SessionCheck, list[str]]:
        """The session's events (up to version `upto`) folded and held to `stored`."""
        check = SessionCheck(sid, await self.store.snapshots(sid), self.writer.key)
        if stored is not None and stored.history is not None and (
                stored.forked_from is None
                or stored.history.version > stored.forked_from.version + 1):
            # Its own history trimmed (not only its source's, before it was forked): the
            # events kept verify from the anchor, the fold goes on from the snapshot.
            check.start_at(stored.history.version - 1, stored.history.anchor)
        async for page in self._pages(sid, upto=upto):  # a page at a time: flat memory
            check.feed(page)
        return check, check.finish(stored)

    async def _lags(self, session_id: str, version: int) -> bool:
        """Whether the stored view stays at `version` while the session has events past it
        (a commit that left its view behind): read again, a write that landed meanwhile
        has moved the view on with its events, in the same commit."""
        later = await self.store.read_events(session_id=session_id, from_version=version + 1,
                                             after_position=0, limit=1, types=None)
        if not later:
            return False
        raw = await self.store.state_json(session_id)
        again = msgspec.json.decode(raw, type=SessionState) if raw else None
        return again is not None and again.version == version

    async def daemon_backup(self, p: rpc.BackupParams, meta: EventMeta) -> rpc.BackupResult:
        if not os.path.isabs(p.path):
            raise InvalidParamsError("the backup path must be absolute (the daemon's working"
                                     " directory is not yours)", {"detail": "relative path",
                                                                   "path": "$.path"})
        backup = self.store.capabilities.backup
        if backup is None:
            raise InvalidParamsError("this store cannot be copied to a file; back it up with"
                                     " its own tools", {"detail": "no file backup"})
        try:
            size, position = await backup.backup(p.path)
        except FileExistsError as exc:
            raise InvalidParamsError(f"{p.path} exists; a backup never overwrites a file",
                                     {"detail": "exists", "path": "$.path"}) from exc
        except OSError as exc:
            raise StorageError(f"cannot write the backup {p.path}: {exc.strerror}",
                               {"detail": str(exc)}) from exc
        return rpc.BackupResult(path=p.path, bytes=size, position=position)

    async def session_cleanup(self, p: rpc.SessionCleanupParams,
                              meta: EventMeta) -> rpc.CleanupResult:
        cutoff = (datetime.now(UTC) - timedelta(days=p.older_than_days)).strftime(
            "%Y-%m-%dT%H:%M:%S.%fZ")
        statuses: list[str] = list(p.statuses)
        if not statuses:
            return rpc.CleanupResult(deleted=0, session_ids=[])
        stale = await self.store.stale_sessions(statuses, cutoff, 10_000)
        # Sources of forks stay (their history is shared): not even tried here, and one
        # forked after this count is kept by its delete's precondition, in the commit.
        stale = [sid for sid in stale if not await forks.count(self.store, sid)]
        if p.dry_run:
            return rpc.CleanupResult(deleted=len(stale), session_ids=stale)
        deleted: list[str] = []

        async def delete(sid: str) -> None:
            # Decided again in the writer: a session resumed meanwhile is kept.
            def plan(state: SessionState | None) -> Delete:
                if (state is None or state.status not in statuses
                        or state.timestamps.updated_at >= cutoff):
                    raise _NoLongerStale(sid)
                return Delete(rpc.DeleteResult(deleted=True))

            try:
                await self.commands.submit(sid, meta, plan)
                deleted.append(sid)
            except (_NoLongerStale, InvalidTransitionError):  # resumed, or forked meanwhile
                pass

        async with anyio.create_task_group() as tg:  # submitted together: group-committed
            for sid in stale:
                tg.start_soon(delete, sid)
        if deleted:
            log.info("session.cleanup", deleted=len(deleted), older_than_days=p.older_than_days)
        return rpc.CleanupResult(deleted=len(deleted), session_ids=sorted(deleted))

    async def _pages(self, session_id: str, size: int = 1000,
                     upto: int | None = None) -> AsyncIterator[list[Event]]:
        """A session's events in version order (up to version `upto`), a page at a time."""
        version = 1
        while upto is None or version <= upto:
            read = await self.store.read_events(session_id=session_id, from_version=version,
                                                after_position=0, limit=size, types=None)
            full = len(read) == size
            page = [e for e in read if upto is None or e.version <= upto]
            if page:
                yield page
            if not full or not page:
                return
            version = page[-1].version + 1

    async def session_export(self, p: rpc.SessionExportParams,
                             meta: EventMeta) -> dict[str, Any]:
        """A page of the session's export document (exports.py), or the whole document
        when it fits in one page."""
        state = await self.commands.state(p.session_id)
        if state.history is not None:  # a document starts at the session's creation
            raise gone(state, "the history before its start")
        damage = self.writer.damaged.get(p.session_id)
        if damage is not None:  # its view is the last good one; the history goes past it
            raise StorageError(
                f"session {p.session_id} cannot be exported: its stored history {damage}."
                " Delete it, or import a good copy with on_conflict=replace.",
                {"detail": damage, "session_id": p.session_id})
        try:
            return await exports.page(self.store, state, p.cursor)
        except (msgspec.DecodeError, msgspec.ValidationError, projection.FoldError) as exc:
            raise unreadable_error(p.session_id, exc) from exc

    async def session_import(self, p: rpc.SessionImportParams, meta: EventMeta) -> msgspec.Raw:
        doc = _read_document(p.document)
        events = doc.events
        sid = events[0].session_id
        if p.strict:
            _check_written_here(events, self.writer.key)
        mark = _history_mark(events, meta, self.writer.key)
        await forks.check_import(self.store, self.state_at, events[0],
                                 self.commands.limits.max_fork_depth)
        clash = await self.store.foreign_event_ids(sid, [e.event_id for e in events])
        if clash:
            raise _import_failed(f"event {clash[0]} is already stored in another session")
        payloads = {cp.checkpoint_id: _json.encode(cp.payload) for cp in doc.checkpoints}
        by_event = {}
        for e in events:
            if e.type == "checkpoint.saved":
                cid = checkpoint_id(e.data)  # an Unread one's too: its fold says why
                if cid not in payloads:
                    raise _import_failed(f"the payload of checkpoint {cid} is missing")
                by_event[e.event_id] = payloads[cid]

        def plan(state: SessionState | None) -> Import:
            if state is not None and p.on_conflict != "replace":
                raise SessionExistsError(f"session {sid} already exists", {"session_id": sid})
            return Import(events + mark, by_event, replace=p.on_conflict == "replace")

        try:  # a replace requires the session has no forks; a fork, its source (-32003)
            return await self.commands.submit(sid, meta, plan)
        except SessionExistsError:
            if p.on_conflict != "skip":
                raise
            return msgspec.Raw(_json.encode(await self.commands.state(sid)))


IMPORTED_REASON = ("imported: its processes belong to another daemon's history;"
                   " this daemon never signals or continues them")


def _history_mark(events: list[Event], meta: EventMeta, key: bytes | None) -> list[Event]:
    """The event that ends an imported executor history, if it has one: a
    `process.detached` marked `imported`. The runner acts only on process events after the
    last such mark, so an imported pid is never signalled nor an imported argv run."""
    starts = [i for i, e in enumerate(events) if e.type == "process.started"]
    if not starts or any(isinstance(e.data, ProcessDetached) and e.data.imported
                         for e in events[starts[-1]:]):
        return []
    last = events[starts[-1]].data
    pid, turn = (last.pid, last.turn) if isinstance(last, ProcessStarted) else (0, 0)
    mark = typed_event(
        position=0, session_id=events[-1].session_id, version=events[-1].version + 1,
        event_id=new_id(), type="process.detached",
        # the history's own last time: the mark closes it, and the view's updated_at
        # stays as imported
        recorded_at=events[-1].recorded_at, meta=meta,
        data=ProcessDetached(pid=pid, turn=turn, alive=False, imported=True,
                             reason=IMPORTED_REASON))
    return [moved(mark, hash=chain_link(events[-1].hash, mark, key))]


_SESSION_ID = msgspec.json.Decoder(SessionId)
_TIME = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


def _check_ids_and_times(events: list[Event]) -> None:
    """An imported history's session id and times are those the daemon makes: an id
    session.create would take, and times in the contract's form (cleanup and the time
    filters compare them as text). -32602 naming the path."""
    sid = events[0].session_id
    try:
        _SESSION_ID.decode(_json.encode(sid))
    except msgspec.ValidationError as exc:
        shown = sid if len(sid) <= 40 else f"{sid[:40]}… ({len(sid)} characters)"
        raise InvalidParamsError(
            f"document.events[0].session_id {shown!r} is not a session id (1 to 128 of"
            " A-Z a-z 0-9 _ . : -, starting with a letter or digit)",
            {"detail": str(exc), "path": "$.document.events[0].session_id"}) from exc
    for i, e in enumerate(events):
        problem = None if _TIME.match(e.recorded_at) else "not in the form"
        if problem is None:
            try:
                parse_time(e.recorded_at)
            except ValueError as exc:
                problem = str(exc)
        if problem is not None:
            raise InvalidParamsError(
                f"document.events[{i}].recorded_at {e.recorded_at[:40]!r} is not a time in"
                " the contract's form (YYYY-MM-DDTHH:MM:SS.ffffffZ, UTC)",
                {"detail": problem, "path": f"$.document.events[{i}].recorded_at"})


def _verify_document(raw: Any, key: bytes | None) -> rpc.VerifyResult:
    """An export document checked: its checksum and chain (-32007 when they do not hold,
    as for an import), and whose its events are."""
    doc = _read_document(raw)
    events = doc.events
    unkeyed = sum(1 for e in events if split_v2(e.hash) is None)
    sealed = sum(1 for e in events if key is not None and sealed_by(e, key))
    return rpc.VerifyResult(
        ok=True, checked_sessions=1, problems=[], sealed_events=sealed,
        unkeyed_events=unkeyed, foreign_events=len(events) - sealed - unkeyed)


def _check_written_here(events: list[Event], key: bytes | None) -> None:
    """-32007 unless every event's hash is sealed with this daemon's key (import
    --strict): a document edited and chained again by the public algorithm is not."""
    for e in events:
        if key is None or not sealed_by(e, key):
            whose = ("its hash is of an unkeyed version (an earlier release's, or an"
                     " importer's)" if split_v2(e.hash) is None else
                     "its seal was not made with this host's or fleet's key")
            raise _import_failed(f"not written by this host or fleet: event at version"
                                 f" {e.version} ({e.type}): {whose}")


def _import_failed(reason: str) -> SessionImportError:
    return SessionImportError(f"import failed: {reason}", {"reason": reason})


def _read_document(raw: Any) -> export.ExportDocument:
    """Check an export document whole before anything of it is stored."""
    if isinstance(raw, str):  # the file's text, so that invalid JSON is ours to report
        try:
            raw = msgspec.json.decode(raw)
        except msgspec.DecodeError as exc:
            raise _import_failed(f"invalid JSON: {exc}") from exc
        text.refuse_nul(raw, "$.document")  # given as an object, the request's check did
    if not isinstance(raw, dict):
        raise _import_failed("not an export document (expected a JSON object)")
    if raw.get("format") != export.FORMAT:
        raise _import_failed(f"unknown format {raw.get('format')!r}")
    if raw.get("format_version") != export.FORMAT_VERSION:
        raise _import_failed(f"unknown format_version {raw.get('format_version')!r}")
    if raw.get("checksum") != export.checksum(raw):
        raise _import_failed("checksum mismatch: the document was changed after export")
    try:
        # Each event's data_json is its data as the document gives it (keys in order).
        doc = msgspec.json.decode(_json.encode(raw), type=export.ExportDocument)
    except msgspec.ValidationError as exc:
        raise _import_failed(f"corrupt document: {exc}") from exc
    if not doc.events:
        raise _import_failed("the document holds no events")
    _check_ids_and_times(doc.events)
    sid, prev, start = doc.events[0].session_id, "", 1
    if doc.events[0].type == "session.forked":  # a fork's chain goes on from its source's
        forked = doc.events[0].data
        if not isinstance(forked, SessionForked):
            raise _import_failed("session.forked without its source's version and hash")
        prev, start = forked.from_.hash, forked.from_.version + 1
    for expected, e in enumerate(doc.events, start=start):
        if e.session_id != sid:
            raise _import_failed(f"event {e.event_id} belongs to session {e.session_id}")
        if e.version != expected:
            raise _import_failed(f"event at version {expected} is missing or out of order"
                                 f" (found version {e.version})")
        if not link_ok(prev, e):
            raise _import_failed(f"hash chain broken at version {e.version}")
        prev = e.hash
    try:
        folded = projection.fold(None, doc.events)
    except projection.FoldError as exc:
        raise _import_failed(f"events do not make a history: {exc}") from exc
    if doc.session is not None and msgspec.to_builtins(folded) != msgspec.to_builtins(doc.session):
        raise _import_failed("the session view does not match its events")
    return doc
