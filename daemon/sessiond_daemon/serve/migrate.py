"""`sessiond migrate FROM TO`: copy one store into another (SQLite <-> PostgreSQL).

Each event is copied as it is stored: its id, session, version, type, data, meta, time
(`recorded_at`) and hash, so the hash chains and every view fold the same in the copy and
`verify` passes there. Only positions are the target's own (a store's positions are its
global order; the copy keeps the source's order, numbered after the target's head), and
they are outside the hash. Views and snapshots are folded again from the copied events,
which is what `verify` compares them with.

Resumable: for each session the target already holds, it checks that the target's last
version has the source's hash there (else the two have diverged and nothing of that
session is copied), and copies only the versions past it. Run again, it copies only
what is missing. The source is read in position order, page by page; each page is one
transaction in the target.

A SQLite file is locked as a daemon locks it, so neither end may be served by a daemon
on this host meanwhile. A PostgreSQL source may be served while it is copied (the copy is
of what was committed when each page was read); a PostgreSQL target should not be written
by daemons until the copy is done: a batch they commit first stops the copy, which can
then be run again.

The stored first results of keyed writes (idempotency keys) are copied too, after the
events, those the target lacks: a retry against the copy of a write made before the move
answers the first result and writes nothing. The `position` a result quotes is the
target's, the position there of the write's last event (at the result's `version`).
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import anyio
import msgspec
import structlog

from sessiond_daemon import host
from sessiond_daemon.core import projection, text
from sessiond_daemon.serve import logs
from sessiond_daemon.stores import registry
from sessiond_daemon.stores.interface import Batch, Entry, Store
from sessiond_daemon.stores.models.conversation import checkpoint_id
from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import Event

log = structlog.get_logger("sessiond.migrate")
PAGE = 500  # source events per target transaction
SNAPSHOT_EVERY = 1000  # the daemon's default snapshot_every


class MigrateError(Exception):
    """The copy cannot go on; the message says why and what to do."""


@dataclass
class Report:
    sessions: int = 0  # sessions met in the source
    copied: int = 0  # events written to the target
    skipped: int = 0  # events the target already held
    diverged: list[str] = field(default_factory=list)  # sessions not copied: they differ
    results: int = 0  # stored first results of keyed writes copied to the target
    # Sessions not copied (or copied only up to a version) and why: text the rule of
    # docs/protocol.md (Text) refuses, a history that does not fold, or one the target
    # refused. The others are copied all the same.
    refused: dict[str, str] = field(default_factory=dict)


def open_store(url: str, password_file: str | None) -> Store:
    """A store for a SQLite path or a postgresql:// URL (not opened yet), from the store
    registry; a shared store's `sessions.host` is left unknown."""
    options = registry.Options(password_file=password_file, host_name=None)
    try:
        registry.check(url, options)
        return registry.open_store(url, options)
    except registry.StoreUrlError as exc:
        raise MigrateError(str(exc)) from exc


@contextmanager
def _locked(*urls: str) -> Iterator[None]:
    """Hold the files' daemon locks (stores that need one: SQLite): no daemon here serves
    them during the copy."""
    files = [u for u in urls if registry.kind_of(u).needs_file_lock]
    for path in files:  # a new SQLite target's directory, private as the daemon makes it
        host.make_private_dirs(os.path.dirname(os.path.abspath(path)))
    locks = [host.DatabaseLock(path) for path in files]
    taken: list[host.DatabaseLock] = []
    try:
        for lock in locks:
            lock.acquire()
            taken.append(lock)
        yield
    except host.DatabaseInUse as exc:
        raise MigrateError(f"{exc} (stop it for the copy)") from None
    finally:
        for lock in taken:
            lock.release()


class Copier:
    """Copies `source` into `target`, session by session as the source's log orders them."""

    def __init__(self, source: Store, target: Store) -> None:
        self.source = source
        self.target = target
        self.report = Report()
        # Per session met: the target's entry (None: none yet), and its version.
        self.entries: dict[str, Entry | None] = {}
        self.payloads: dict[str, dict[str, bytes]] = {}

    async def run(self) -> Report:
        after = 0
        while True:
            page = await self.source.read_events(session_id=None, from_version=0,
                                                 after_position=after, limit=PAGE, types=None)
            if not page:
                break
            await self._copy(list(page))
            after = page[-1].position
        for sid, entry in self.entries.items():
            if entry is not None and sid not in self.report.diverged:
                await self._copy_results(sid, entry.state.version)
        return self.report

    async def _copy_results(self, sid: str, version: int) -> None:
        """The stored first results of a session's keyed writes, those the target lacks,
        a page per transaction; the position a result quotes is the target's (the event at
        the result's version there). A result of a write past what was copied of the
        session (one refused midway) is left out: its events are not in the target."""
        after = ""
        while page := await self.source.idempotency_page(sid, after, PAGE):
            after = page[-1][0]
            held = await self.target.idempotent_results([(sid, key) for key, _ in page])
            batch = Batch()
            for key, result in page:
                if (sid, key) in held:
                    continue
                moved = await self._moved_result(sid, result, version)
                if moved is not None:
                    batch.idempotency.append((sid, key, moved))
            if batch.idempotency:
                if await self.target.commit(batch) is not None:
                    raise MigrateError("another writer stored results of keyed writes in the"
                                       " target during the copy; stop the daemons that use"
                                       " it and run migrate again")
                self.report.results += len(batch.idempotency)

    async def _moved_result(self, sid: str, result: bytes, version: int) -> bytes | None:
        """`result` with its `position` (a write's last event) moved to the target's; None
        for a write past `version`, the last one copied."""
        try:
            doc = msgspec.json.decode(result)
        except msgspec.DecodeError:
            return result  # not ours to read: kept as it was stored
        if not isinstance(doc, dict) or not isinstance(doc.get("version"), int):
            return result
        if doc["version"] > version:
            return None
        if isinstance(doc.get("position"), int):
            doc["position"] = await self.target.first_position(sid, doc["version"])
        return msgspec.json.encode(doc)

    async def _copy(self, events: list[Event]) -> None:
        """One page of the source's log into the target: one transaction; if the target
        refuses it, one transaction per session of the page, so that one session the
        target cannot hold is named and the others are copied."""
        wanted = await self._wanted(events)
        if not wanted:
            return
        try:
            await self._commit(wanted)
        except (SessiondError, ValueError, KeyError, TypeError) as exc:  # incl. FoldError
            sessions = list(dict.fromkeys(e.session_id for e in wanted))
            if len(sessions) == 1:
                self._refuse(sessions[0], f"the target refused it: {_reason(exc)}")
                return
            for sid in sessions:
                try:
                    await self._commit([e for e in wanted if e.session_id == sid])
                except (SessiondError, ValueError, KeyError, TypeError) as one:
                    self._refuse(sid, f"the target refused it: {_reason(one)}")

    async def _wanted(self, events: list[Event]) -> list[Event]:
        """The page's events the target lacks, of sessions that are copied."""
        wanted: list[Event] = []
        last: dict[str, int] = {}
        for e in events:
            if e.session_id not in self.entries:
                await self._meet(e.session_id)
            if e.session_id in self.report.diverged or e.session_id in self.report.refused:
                continue
            entry = self.entries[e.session_id]
            if entry is not None and e.version <= last.get(e.session_id, entry.state.version):
                self.report.skipped += 1
                continue
            encoded = msgspec.json.encode(e)  # its data as stored, not re-encoded
            where = (text.nul_path(msgspec.json.decode(encoded), "$")
                     if text.nul_in_json(encoded) else None)
            if where is not None:
                self._refuse(e.session_id, f"event at version {e.version} holds a NUL"
                             f" character at {where} (docs/protocol.md, Text)")
                wanted = [w for w in wanted if w.session_id != e.session_id]
                continue
            wanted.append(e)
            last[e.session_id] = e.version
        return wanted

    def _refuse(self, sid: str, reason: str) -> None:
        self.report.refused[sid] = reason
        log.error("migrate.session_refused", session_id=sid, reason=reason)

    async def _commit(self, events: list[Event]) -> None:
        batch = Batch()
        head = await self.target.last_position()
        for e in events:
            entry = batch.views.get(e.session_id) or self.entries[e.session_id]
            head += 1
            moved = msgspec.structs.replace(e, position=head)
            state = projection.fold(entry.state if entry else None, [moved])
            batch.events.append(moved)
            batch.views[e.session_id] = Entry(state, moved.hash, head)
            batch.bases.setdefault(e.session_id, entry.state.version if entry else 0)
            if state.version % SNAPSHOT_EVERY == 0:
                batch.snapshots.append(state)
            if e.type == "checkpoint.saved":
                batch.payloads[e.event_id] = await self._payload(e)
        if await self.target.commit(batch) is not None:
            raise MigrateError("another writer committed to the target during the copy;"
                               " stop the daemons that use it and run migrate again (it"
                               " goes on from where it stopped)")
        self.entries.update(batch.views)
        self.report.copied += len(batch.events)

    async def _meet(self, sid: str) -> None:
        """A session seen for the first time: what the target holds of it, and whether
        that is the source's history up to there."""
        self.report.sessions += 1
        entry = await self.target.load_entry(sid)
        self.entries[sid] = entry
        if entry is None:
            return
        mine = await self.source.hash_at(sid, entry.state.version)
        if mine != entry.last_hash:
            self.report.diverged.append(sid)

    async def _payload(self, e: Event) -> bytes:
        if e.session_id not in self.payloads:
            self.payloads = {e.session_id: await self.source.checkpoint_payloads(e.session_id)}
        return self.payloads[e.session_id].get(str(checkpoint_id(e.data)), b"")


async def migrate(source_url: str, target_url: str,
                  password_file: str | None = None) -> Report:
    """Copy `source_url`'s store into `target_url`'s (see the module's docstring)."""
    if source_url == target_url:
        raise MigrateError("the source and the target are the same database")
    if not registry.kind_of(source_url).exists(source_url):
        raise MigrateError(f"no database at {source_url}")
    source, target = open_store(source_url, password_file), open_store(target_url,
                                                                       password_file)
    with _locked(source_url, target_url):
        await source.open()
        try:
            await target.open()
            try:
                return await Copier(source, target).run()
            finally:
                await target.close()
        finally:
            await source.close()


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(
        prog="sessiond migrate",
        description="Copy a sessiond database into another: SQLite into PostgreSQL or"
                    " PostgreSQL into a SQLite file, with ids, versions, hashes and times"
                    " kept. Run again, it copies only what is missing.")
    p.add_argument("source", help="SQLite path or postgresql://user@host:port/dbname")
    p.add_argument("target", help="SQLite path or postgresql://user@host:port/dbname")
    p.add_argument("--db-password-file", help="the PostgreSQL password's file (else the"
                   " systemd credential sessiond-db-password, else none)")
    args = p.parse_args(argv)
    logs.configure("warning", "auto")  # on stderr; stdout holds the report
    try:
        report = anyio.run(migrate, args.source, args.target, args.db_password_file)
    except (MigrateError, SessiondError, OSError) as exc:
        print(f"sessiond migrate: {getattr(exc, 'message', None) or exc}", file=sys.stderr)
        return 1
    print(msgspec.json.encode(report).decode())
    if report.refused:
        print(f"sessiond migrate: {len(report.refused)} session(s) could not be copied (the"
              " rest were):", file=sys.stderr)
        for sid, reason in list(report.refused.items())[:100]:
            print(f"  {sid}: {reason}", file=sys.stderr)
    if report.diverged:
        print(f"sessiond migrate: {len(report.diverged)} session(s) differ between the two"
              f" databases and were not copied: {', '.join(report.diverged[:10])}",
              file=sys.stderr)
    return 2 if report.diverged or report.refused else 0


def _reason(exc: Exception) -> str:
    return str(getattr(exc, "message", None) or exc)


__all__ = ["MigrateError", "Report", "main", "migrate"]
