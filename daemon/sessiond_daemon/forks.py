"""Forks: a new session whose history is another's up to a version (session.fork).

A fork references its source's history instead of copying it. Its first event,
`session.forked` at version `at_version + 1`, names the source, the version and the
source's hash there, and carries the source's view at that version, which the fold
starts from; its hash chain goes on from the source's hash. What it shares is read from
the source: time travel at or below the fork point, and the message and checkpoint
indexes (rows pointing at the source's events, written with the session.forked event).
So a source with forks cannot be deleted (or replaced by an import) while they exist.
"""

from __future__ import annotations

import base64
import hashlib
import os
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any

import anyio
import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    SessionExistsError,
    SessionImportError,
    StorageError,
)
from sessiond_schemas.events import (
    Event,
    EventMeta,
    ForkSource,
    SessionForked,
    canonical_json,
    moved,
    new_id,
    now,
    typed_event,
)
from sessiond_schemas.export import chain_hash
from sessiond_schemas.state import SessionState

if TYPE_CHECKING:
    from .commands import Commands
    from .eventstore import ForkReads

# A session's view at a version (Service.state_at): what a fork starts from.
StateAt = Callable[[str, int], Awaitable[SessionState]]

_json = msgspec.json.Encoder()


# --- the writer's side (inside the batch transaction) --------------------------------------


def index(db: sqlite3.Connection, e: Event) -> None:
    """Record the link, and give the fork the source's messages and checkpoints as they
    were at the fork point (rows pointing at the source's events)."""
    source, version = e.data["from"]["session_id"], e.data["from"]["version"]
    db.execute("INSERT OR REPLACE INTO forks (session_id, source_id, version, forked_at,"
               " position) VALUES (?, ?, ?, ?, ?)",
               (e.session_id, source, version, e.recorded_at, e.position))
    at = _position_at(db, source, version)
    if at is None:
        return  # the source is gone: verify reports it
    count = int(e.data["state"].get("message_count", 0))
    # The source's conversation now, cut at the fork point. A message the source took out
    # and appended again after the fork point is missing here and found below. The claimed
    # count only filters rows the store has: it never sizes anything (an imported or
    # damaged view may claim 2^63 messages).
    db.execute("INSERT INTO messages (session_id, sequence, position) SELECT ?, sequence,"
               " position FROM messages WHERE session_id = ? AND sequence < ? AND position <= ?",
               (e.session_id, source, count, at))
    have = {r[0] for r in db.execute("SELECT sequence FROM messages WHERE session_id = ?"
                                     " AND sequence < ?", (e.session_id, count))}
    if len(have) < count:
        db.executemany("INSERT INTO messages (session_id, sequence, position) VALUES (?, ?, ?)",
                       [(e.session_id, seq, pos) for seq, pos
                        in _find_messages(db, source, version, count, have).items()])
    # The payloads are shared, not copied: the fork's rows hold an empty payload (no stored
    # payload is empty: JSON is at least one byte) and the position of the source's
    # checkpoint.saved, by which the payload is found (SHARED_PAYLOAD_SQL).
    db.execute("INSERT OR REPLACE INTO checkpoints (session_id, checkpoint_id, position, version,"
               " node_id, resume_from, created_at, size, payload) SELECT ?, checkpoint_id,"
               " position, version, node_id, resume_from, created_at, size, X''"
               " FROM checkpoints WHERE session_id = ? AND version <= ?",
               (e.session_id, source, version))


# How far a fork chain is walked: the bound of max_fork_depth. A chain longer than this,
# or one that goes round (only data written behind the daemon's back can), reads as
# damaged: every walk stops here rather than loop or recurse.
WALK_LIMIT = 100_000

# The session holding `version` of a session's history: walk up while the version is at
# or below the fork point. One statement, bounded (a cycle yields WALK_LIMIT rows, then
# stops); the deepest row is the holder, or WALK_LIMIT when the walk did not end.
HOLDER_SQL = (
    "WITH RECURSIVE up(session_id, depth) AS (SELECT ?, 0 UNION ALL"
    " SELECT f.source_id, up.depth + 1 FROM forks f JOIN up ON f.session_id = up.session_id"
    " WHERE f.version >= ? AND up.depth < ?) SELECT session_id, depth FROM up"
    " ORDER BY depth DESC LIMIT 1")
# A session and its sources, nearest first, at most `limit` of them.
ANCESTRY_SQL = (
    "WITH RECURSIVE up(session_id, depth) AS (SELECT ?, 0 UNION ALL"
    " SELECT f.source_id, up.depth + 1 FROM forks f JOIN up ON f.session_id = up.session_id"
    " WHERE up.depth + 1 < ?) SELECT session_id FROM up ORDER BY depth")

# The payload a row with an empty one shares: the row holding it at the same position.
SHARED_PAYLOAD_SQL = ("SELECT payload FROM checkpoints WHERE position = ? AND length(payload) > 0"
                      " LIMIT 1")


def keep_shared_payload(db: sqlite3.Connection, session_id: str, checkpoint_id: str) -> None:
    """Before a session's checkpoint row is replaced (the same checkpoint_id saved again),
    give its payload to one fork row that shares it, so the forks still find it there."""
    db.execute(
        "UPDATE checkpoints SET payload = (SELECT payload FROM checkpoints WHERE session_id = ?1"
        " AND checkpoint_id = ?2) WHERE (session_id, checkpoint_id) = (SELECT session_id,"
        " checkpoint_id FROM checkpoints WHERE length(payload) = 0 AND position = (SELECT"
        " position FROM checkpoints WHERE session_id = ?1 AND checkpoint_id = ?2"
        " AND length(payload) > 0) LIMIT 1)", (session_id, checkpoint_id))


def keep_shared_payloads(db: sqlite3.Connection, session_id: str) -> None:
    """Before a session's rows are deleted: the rows of other sessions that share one of
    its payloads get it (a source with forks is never deleted, but a fork holding a
    payload handed on by keep_shared_payload may be)."""
    db.execute(
        "UPDATE checkpoints SET payload = (SELECT o.payload FROM checkpoints o"
        " WHERE o.session_id = ?1 AND o.position = checkpoints.position"
        " AND length(o.payload) > 0) WHERE session_id != ?1 AND length(payload) = 0"
        " AND position IN (SELECT position FROM checkpoints WHERE session_id = ?1"
        " AND length(payload) > 0)", (session_id,))


def _link(db: sqlite3.Connection, session_id: str) -> tuple[str, int] | None:
    row = db.execute("SELECT source_id, version FROM forks WHERE session_id = ?",
                     (session_id,)).fetchone()
    return (row[0], int(row[1])) if row else None


def _holder(db: sqlite3.Connection, session_id: str, version: int) -> str | None:
    """The session whose own events hold `version` of this one's history: itself, or the
    ancestor it was forked from when that version is at or below the fork point. None for
    a chain that does not end within WALK_LIMIT (a cycle)."""
    holder, depth = db.execute(HOLDER_SQL, (session_id, version, WALK_LIMIT)).fetchone()
    return None if depth >= WALK_LIMIT else str(holder)


def _position_at(db: sqlite3.Connection, session_id: str, version: int) -> int | None:
    """Position of the event at `version` of a session's history."""
    holder = _holder(db, session_id, version)
    row = None if holder is None else db.execute(
        "SELECT position FROM events WHERE session_id = ? AND version = ?",
        (holder, version)).fetchone()
    return int(row[0]) if row else None


def _find_messages(db: sqlite3.Connection, session_id: str, version: int, count: int,
                   have: set[int]) -> dict[int, int]:
    """sequence -> position of the message each sequence below `count` not in `have` held
    at `version`: the last message.appended with that sequence at or before it, walking up
    through sources (at most WALK_LIMIT of them, never one twice)."""
    found: dict[int, int] = {}
    seen: set[str] = set()
    while len(have) + len(found) < count and session_id not in seen \
            and len(seen) < WALK_LIMIT:
        seen.add(session_id)
        here: dict[int, int] = {}
        for data, position in db.execute(
                "SELECT data, position FROM events WHERE session_id = ? AND version <= ?"
                " AND type = 'message.appended' ORDER BY version", (session_id, version)):
            seq = msgspec.json.decode(data)["sequence"]
            if isinstance(seq, int) and 0 <= seq < count and seq not in have \
                    and seq not in found:
                here[seq] = position  # later ones win
        found.update(here)  # a nearer session's message wins over its source's
        link = _link(db, session_id)
        if link is None:
            break
        session_id, version = link[0], min(version, link[1])
    return found


def hash_at_sql(con: sqlite3.Connection, session_id: str, version: int) -> str | None:
    """The chain hash of a session's history at `version` (an ancestor's, below its fork)."""
    holder = _holder(con, session_id, version)
    row = None if holder is None else con.execute(
        "SELECT hash FROM events WHERE session_id = ? AND version = ?",
        (holder, version)).fetchone()
    return str(row[0]) if row else None


def ancestry_sql(con: sqlite3.Connection, session_id: str, limit: int) -> list[str]:
    """The session and its sources, nearest first, at most `limit` of them."""
    return [str(r[0]) for r in con.execute(ANCESTRY_SQL, (session_id, limit))]


def count_sql(con: sqlite3.Connection, session_id: str) -> int:
    return int(con.execute("SELECT COUNT(*) FROM forks WHERE source_id = ?",
                           (session_id,)).fetchone()[0])


def page_sql(con: sqlite3.Connection, source_id: str, after: str,
             limit: int) -> tuple[int, list[Any]]:
    """(how many forks `source_id` has, (session_id, version, forked_at) of those after
    `after` by id)."""
    rows = con.execute("SELECT session_id, version, forked_at FROM forks WHERE source_id = ?"
                       " AND session_id > ? ORDER BY session_id LIMIT ?",
                       (source_id, after, limit)).fetchall()
    return count_sql(con, source_id), rows


# --- reads ---------------------------------------------------------------------------------


async def hash_at(store: ForkReads, session_id: str, version: int) -> str | None:
    """The chain hash of a session's history at `version` (an ancestor's, below its fork)."""
    return await store.hash_at(session_id, version)


async def count(store: ForkReads, session_id: str) -> int:
    return await store.fork_count(session_id)


async def refuse_if_forked(store: ForkReads, session_id: str, what: str) -> None:
    """A source's history is shared by its forks: it stays while they do (-32003)."""
    n = await count(store, session_id)
    if n:
        raise InvalidTransitionError(
            f"session {session_id} cannot be {what}: {n} fork(s) share its history"
            " (session.forks lists them); delete them first",
            {"session_id": session_id, "forks": n})


async def link_problems(store: ForkReads, state: SessionState,
                        first: Event | None) -> list[str]:
    """What daemon.verify finds wrong with a fork's link to its source."""
    link = state.forked_from
    if link is None:
        return []
    if first is None or first.type != "session.forked":
        return ["forked_from is set but the history does not start with session.forked"]
    chain = await store.fork_ancestry(state.session_id, 2)
    if chain[1:] != [link.session_id]:
        return [f"the fork index links it to {chain[1] if len(chain) > 1 else 'nothing'},"
                f" its history to {link.session_id} (daemon.reindex rebuilds the index)"]
    source_hash = await hash_at(store, link.session_id, link.version)
    if source_hash is None:
        return [f"fork source {link.session_id} has no version {link.version}"]
    if source_hash != first.data["from"]["hash"]:
        return [f"fork source {link.session_id} at version {link.version} does not have the"
                " hash this fork's chain starts from (the shared history was changed)"]
    return []


# --- the methods ---------------------------------------------------------------------------

_guards: dict[str, tuple[anyio.Lock, int]] = {}


@asynccontextmanager
async def guard(session_id: str) -> AsyncIterator[None]:
    """Hold a session as a source: a fork of it (from reading it to committing the fork)
    and its deletion (from counting its forks to committing) never interleave. One daemon
    holds the database (its lock file), so a lock in the process is enough."""
    lock, users = _guards.get(session_id, (anyio.Lock(), 0))
    _guards[session_id] = (lock, users + 1)
    try:
        async with lock:
            yield
    finally:
        lock, users = _guards[session_id]
        if users == 1:
            del _guards[session_id]
        else:
            _guards[session_id] = (lock, users - 1)



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
    """session.fork: a new session whose history is the source's up to at_version."""
    async with guard(p.session_id):
        return await _fork(commands, store, state_at, p, meta)


async def _fork(commands: Commands, store: ForkReads, state_at: StateAt,
                p: rpc.SessionForkParams, meta: EventMeta) -> msgspec.Raw:
    from .writer import Import  # here: the writer imports the store, which imports us

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
    state = await state_at(p.session_id, at)
    prev = await hash_at(store, p.session_id, at)
    if prev is None:
        raise InvalidParamsError(f"session {p.session_id} has no event at version {at}",
                                 {"detail": "no such version", "path": "$.at_version"})
    key = p.idempotency_key
    sid = p.new_session_id or (_fork_id(p.session_id, key, meta.peer_uid) if key else new_id())
    event_meta = msgspec.structs.replace(meta, idempotency_key=key)
    data = SessionForked(from_=ForkSource(session_id=p.session_id, version=at, hash=prev),
                         state=msgspec.to_builtins(state))
    event = typed_event(position=0, session_id=sid, version=at + 1, event_id=new_id(),
                        type="session.forked", recorded_at=now(), meta=event_meta, data=data)
    event = moved(event, hash=chain_hash(prev, event, canonical_json(data)))

    def plan(existing: SessionState | None) -> Import:
        if existing is not None:
            raise SessionExistsError(f"session {sid} already exists", {"session_id": sid})
        return Import([event], {})

    return await commands.submit(sid, meta, plan, idempotency_key=key)


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
    source = first.data.get("from", {})
    source_id = source.get("session_id")
    if not isinstance(source_id, str):
        raise SessionImportError("import failed: session.forked names no source session",
                                 {"reason": "fork source missing"})
    problem = await link_problem(store, first.session_id, source_id, max_depth)
    if problem is not None:
        raise SessionImportError(f"import failed: {problem}",
                                 {"reason": problem, "limit": max_depth})
    have = await hash_at(store, source_id, int(source.get("version", 0)))
    if have is None or have != source.get("hash"):
        raise SessionImportError(
            f"import failed: this is a fork of {source_id} at version"
            f" {source.get('version')}, which this daemon does not hold with the same history;"
            " import the source first", {"reason": "fork source missing"})
    version = int(source.get("version", 0))
    claimed = first.data.get("state", {}).get("message_count") \
        if isinstance(first.data.get("state"), dict) else None
    held = (await state_at(source_id, version)).message_count
    if claimed != held:
        reason = (f"its session.forked claims {claimed!r} messages, but {source_id} held"
                  f" {held} at version {version}")
        raise SessionImportError(f"import failed: {reason}", {"reason": reason})
