"""Forks: a new session whose history is another's up to a version (session.fork).

A fork references its source's history instead of copying it. Its first event,
`session.forked` at version `at_version + 1`, names the source, the version and the
source's hash there, and carries the source's view at that version, which the fold
starts from; its hash chain goes on from the source's hash. What it shares is read from
the source: time travel at or below the fork point, and the message and checkpoint
indexes (rows pointing at the source's events, written with the session.forked event by
the conversation's read model, stores/models/conversation.py).
So a source with forks cannot be deleted (or replaced by an import) while they exist:
the writer's plans say so as preconditions (stores.interface.HasVersion for a fork's source,
HasNoForks for a delete or a replace), which every store checks inside its commit.
"""

from __future__ import annotations

import base64
import hashlib
import os
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import msgspec

from sessiond_daemon.stores.interface import Store
from sessiond_daemon.stores.models import sql
from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    SessiondError,
    SessionExistsError,
    SessionImportError,
    SessionNotFoundError,
    StorageError,
)
from sessiond_schemas.events import (
    Event,
    EventMeta,
    ForkSource,
    SessionForked,
    Unread,
    canonical_json,
    moved,
    new_id,
    now,
    typed_event,
)
from sessiond_schemas.export import chain_link
from sessiond_schemas.state import SessionState

if TYPE_CHECKING:
    from sessiond_daemon.core.commands import Commands
    from sessiond_daemon.stores.interface import ForkReads, HasVersion

# A session's view at a version (Service.state_at): what a fork starts from.
StateAt = Callable[[str, int], Awaitable[SessionState]]

_json = msgspec.json.Encoder()


# How far a fork chain is walked (stores/models/sql.py): the bound of max_fork_depth.
WALK_LIMIT = sql.WALK_LIMIT


# --- reads ---------------------------------------------------------------------------------


async def hash_at(store: ForkReads, session_id: str, version: int) -> str | None:
    """The chain hash of a session's history at `version` (an ancestor's, below its fork)."""
    return await store.hash_at(session_id, version)


async def count(store: ForkReads, session_id: str) -> int:
    return await store.fork_count(session_id)


async def link_problems(store: ForkReads, state: SessionState,
                        first: Event | None) -> list[str]:
    """What daemon.verify finds wrong with a fork's link to its source."""
    link = state.forked_from
    if link is None:
        return []
    if first is None or not isinstance(first.data, SessionForked):
        return ["forked_from is set but the history does not start with session.forked"]
    chain = await store.fork_ancestry(state.session_id, 2)
    if chain[1:] != [link.session_id]:
        return [f"the fork index links it to {chain[1] if len(chain) > 1 else 'nothing'},"
                f" its history to {link.session_id} (daemon.reindex rebuilds the index)"]
    source_hash = await hash_at(store, link.session_id, link.version)
    if source_hash is None:
        return [f"fork source {link.session_id} has no version {link.version}"]
    if source_hash != first.data.from_.hash:
        return [f"fork source {link.session_id} at version {link.version} does not have the"
                " hash this fork's chain starts from (the shared history was changed)"]
    return []


# --- the methods ---------------------------------------------------------------------------

def _fork_id(source: str, key: str, uid: int | None) -> str:
    """The id a keyed fork gets when none is given: the caller's retry finds the same
    session. It is the caller's: another uid with the same key gets another id (the
    daemon owner's is derived as before keys were scoped, so that its retries across
    the upgrade find their fork). An id someone else took first is -32004 to the caller,
    never that session: its key is scoped to its own uid (writer.scoped_key)."""
    seed = f"{source}\0{key}" if uid in (None, os.getuid()) else f"{source}\0{key}\0{uid}"
    digest = base64.b32encode(hashlib.sha256(seed.encode()).digest()).decode()
    return f"fork-{digest[:26].lower()}"


async def fork(commands: Commands, store: ForkReads, state_at: StateAt,
               p: rpc.SessionForkParams, meta: EventMeta) -> msgspec.Raw:
    """session.fork: a new session whose history is the source's up to at_version.

    The plan is made from reads of the source; its commit requires the source to hold
    that version with that hash still (a HasVersion precondition, checked by the store
    under its locks), so a fork and a delete of its source, on this daemon or another,
    never both happen. A source gone by then is -32001 and nothing is written."""
    from sessiond_daemon.core.writer import (  # here: the writer imports the store, which
        Import,
        source_gone,
    )
    # imports us

    def source_refused(source: HasVersion, found: int) -> SessiondError:
        return SessionNotFoundError(
            f"fork source {source_gone(source, found)} before the fork was written;"
            " nothing was written", {"session_id": source.session_id})

    current = await commands.state(p.session_id)
    at = p.at_version if p.at_version is not None else current.version
    if at > current.version:
        raise InvalidParamsError(
            f"at_version {at} is past session {p.session_id}'s version {current.version}",
            {"detail": "at_version too large", "path": "$.at_version"})
    if current.status == "active" and current.pid is not None:
        raise InvalidTransitionError(
            f"session {p.session_id} has a running executor (pid {current.pid}): a fork is"
            " data, not a process; fork it when its turn has ended, or after session.kill",
            {"session_id": p.session_id, "pid": current.pid})
    limit = commands.limits.max_fork_depth
    chain = await store.fork_ancestry(p.session_id, limit + 1)
    if len(set(chain)) < len(chain):  # only rows written behind the daemon's back
        raise StorageError(
            f"stored data of session {p.session_id} does not read back (its fork chain goes"
            " round); daemon.verify reports it",
            {"detail": "fork chain goes round", "session_id": p.session_id})
    if len(chain) > limit:
        raise InvalidParamsError(
            f"session {p.session_id} is {limit} forks from its first session: a fork of it"
            f" would pass max_fork_depth ({limit})",
            {"detail": "fork chain too deep", "limit": limit, "path": "$.session_id"})
    try:
        state = await state_at(p.session_id, at)
        prev = await hash_at(store, p.session_id, at)
    except StorageError:
        await _still_there(commands, p.session_id)
        raise
    if prev is None:
        await _still_there(commands, p.session_id)
        raise InvalidParamsError(f"session {p.session_id} has no event at version {at}",
                                 {"detail": "no such version", "path": "$.at_version"})
    key = p.idempotency_key
    sid = p.new_session_id or (_fork_id(p.session_id, key, meta.peer_uid) if key else new_id())
    event_meta = msgspec.structs.replace(meta, idempotency_key=key)
    data = SessionForked(from_=ForkSource(session_id=p.session_id, version=at, hash=prev),
                         state=msgspec.to_builtins(state))
    event = typed_event(position=0, session_id=sid, version=at + 1, event_id=new_id(),
                        type="session.forked", recorded_at=now(), meta=event_meta, data=data)
    event = moved(event, hash=chain_link(prev, event, commands.writer.key, canonical_json(data)))

    def plan(existing: SessionState | None) -> Import:
        if existing is not None:
            raise SessionExistsError(f"session {sid} already exists", {"session_id": sid})
        return Import([event], {}, source_refused=source_refused)

    return await commands.submit(sid, meta, plan, idempotency_key=key)


async def _still_there(commands: Commands, session_id: str) -> None:
    """-32001 when the session was deleted while a fork read it (the store says: the
    writer's cache may not have heard yet)."""
    if await commands.store.state_json(session_id) is None:
        raise SessionNotFoundError(f"session {session_id} not found",
                                   {"session_id": session_id})


async def forks_of(store: ForkReads, p: rpc.SessionForksParams,
                   state: SessionState) -> rpc.ForksResult:
    """session.forks: a session's forks by id, a page at a time, and how many it has."""
    n, rows = await store.forks_page(p.session_id, p.cursor or "", p.limit + 1)
    page = [rpc.ForkInfo(session_id=r.session_id, version=r.version, forked_at=r.forked_at)
            for r in rows[:p.limit]]
    return rpc.ForksResult(session_id=p.session_id, forked_from=state.forked_from, count=n,
                           forks=page,
                           next_cursor=page[-1].session_id if len(rows) > p.limit else None)


async def link_problem(store: ForkReads, session_id: str, source_id: str,
                       max_depth: int) -> str | None:
    """What is wrong with making `session_id` a fork of `source_id`: the session itself, a
    cycle, or a chain past `max_depth` links (max_fork_depth). None when it may be made.
    One bounded walk of the source's chain."""
    if source_id == session_id:
        return f"session {session_id} cannot be a fork of itself"
    chain = await store.fork_ancestry(source_id, max_depth + 1)
    if session_id in chain:
        return (f"session {session_id} cannot be a fork of {source_id}: {source_id} is"
                f" itself forked from {session_id} (the chain would go round)")
    if len(chain) > max_depth:
        return (f"session {source_id} is {max_depth} forks from its first session: a fork"
                f" of it would pass max_fork_depth ({max_depth})")
    return None


async def check_import(store: ForkReads, state_at: StateAt, first: Event,
                       max_depth: int) -> None:
    """An imported fork needs its source here, with the hash its chain starts from, and a
    link that is neither to itself, nor round, nor past max_fork_depth; the counts its
    first event claims are the source's there (-32007)."""
    if first.type != "session.forked":
        return
    if isinstance(first.data, Unread):
        reason = f"its session.forked does not read ({first.data.error})"
        raise SessionImportError(f"import failed: {reason}", {"reason": reason})
    if not isinstance(first.data, SessionForked):  # not a type's Struct: not at run time
        raise SessionImportError("import failed: session.forked names no source session",
                                 {"reason": "fork source missing"})
    source = first.data.from_
    source_id = source.session_id
    problem = await link_problem(store, first.session_id, source_id, max_depth)
    if problem is not None:
        raise SessionImportError(f"import failed: {problem}",
                                 {"reason": problem, "limit": max_depth})
    version = source.version
    have = await hash_at(store, source_id, version)
    if have is None or have != source.hash:
        raise SessionImportError(
            f"import failed: this is a fork of {source_id} at version"
            f" {version}, which this daemon does not hold with the same history;"
            " import the source first", {"reason": "fork source missing"})
    claimed = first.data.state.get("message_count")
    held = (await state_at(source_id, version)).message_count
    if claimed != held:
        reason = (f"its session.forked claims {claimed!r} messages, but {source_id} held"
                  f" {held} at version {version}")
        raise SessionImportError(f"import failed: {reason}", {"reason": reason})


class Forks:
    """The methods of forks: session.fork and session.forks."""

    def __init__(self, store: Store, commands: Commands, state_at: StateAt) -> None:
        self.store = store
        self.commands = commands
        self.state_at = state_at  # a session's view at a version, what a fork starts from

    async def session_fork(self, p: rpc.SessionForkParams, meta: EventMeta) -> msgspec.Raw:
        return await fork(self.commands, self.store, self.state_at, p, meta)

    async def session_forks(self, p: rpc.SessionForksParams, meta: EventMeta) -> rpc.ForksResult:
        state = await self.commands.state(p.session_id)
        return await forks_of(self.store, p, state)
