"""The read models' SQL, written once with `?` placeholders and rendered per driver
(`render`: PostgreSQL's $1, $2, ...), and the statements each op runs as (`steps`).

An op that needs to read before it writes (a fork's shares) is a generator: it yields a
statement and is sent back its rows, so the same algorithm runs on a blocking driver
(sqlite3 on the writer thread) and an asynchronous one (asyncpg) alike.
"""

from __future__ import annotations

import re
from collections.abc import Generator
from dataclasses import dataclass
from functools import cache
from typing import Any, Final

import msgspec

from sessiond_daemon.stores.models.ops import (
    CopyRows,
    DeleteWhere,
    ForgetSessions,
    ForkShares,
    HandOnPayloads,
    Insert,
    Keep,
    Op,
    TrimHistory,
)
from sessiond_daemon.stores.models.tables import SESSION_MODEL_TABLES, TABLES

# How far a fork chain is walked: the bound of max_fork_depth. A chain longer than this,
# or one that goes round (only data written behind the daemon's back can), reads as
# damaged: every walk stops here rather than loop or recurse.
WALK_LIMIT: Final = 100_000


@dataclass(frozen=True, slots=True)
class Dialect:
    """What differs between the drivers' SQL in the shared statements."""

    name: str
    numbered: bool  # $1, $2, ... instead of ?
    text: str  # a text parameter whose type must be said (a recursive query's seed)
    empty_bytes: str  # an empty blob literal
    no_limit: int | None  # the LIMIT value that means none


SQLITE: Final = Dialect("sqlite", numbered=False, text="?", empty_bytes="X''", no_limit=-1)
POSTGRES: Final = Dialect("postgresql", numbered=True, text='?::text COLLATE "C"',
                          empty_bytes="''::bytea", no_limit=None)


@cache
def _dollar(sql: str) -> str:
    counter = iter(range(1, 1 << 16))
    return re.sub(r"\?", lambda _: f"${next(counter)}", sql)


def render(sql: str, d: Dialect) -> str:
    """A shared statement in the driver's placeholders (no `?` is inside a literal)."""
    return _dollar(sql.replace("{text}", d.text)) if d.numbered else \
        sql.replace("{text}", d.text)


def marks(n: int) -> str:
    """`?, ?, ...`: n placeholders."""
    return ", ".join("?" * n)


@dataclass(slots=True)
class Stmt:
    """One statement to run: with `many`, once per row; with `fetch`, its rows are sent
    back into the generator that yielded it."""

    sql: str
    args: tuple[Any, ...] = ()
    many: list[tuple[Any, ...]] | None = None
    fetch: bool = False


Steps = Generator[Stmt, list[Any], None]


def conflict_sql(table: str, keep: Keep) -> str:
    """The ON CONFLICT clause of an Insert of `table` with `keep` ('' for "error")."""
    return _conflict(table, keep)


def _conflict(table: str, keep: Keep) -> str:
    t = TABLES[table]
    if keep == "error":
        return ""
    key = ", ".join(t.key)
    if keep == "first":
        return f" ON CONFLICT ({key}) DO NOTHING"
    rest = ", ".join(f"{c} = excluded.{c}" for c in t.columns if c not in t.key)
    newer = f" WHERE {table}.position < excluded.position" if keep == "newer" else ""
    return f" ON CONFLICT ({key}) DO UPDATE SET {rest}{newer}"


@cache
def insert_sql(table: str, keep: Keep, d: Dialect) -> str:
    t = TABLES[table]
    return render(f"INSERT INTO {table} ({', '.join(t.columns)}) VALUES"
                  f" ({marks(len(t.columns))}){_conflict(table, keep)}", d)


@cache
def _copy_sql(table: str, keep: Keep, blank: tuple[str, ...], d: Dialect) -> str:
    t = TABLES[table]
    picked = ", ".join("?" if c == "session_id" else d.empty_bytes if c in blank else c
                       for c in t.columns)
    return render(f"INSERT INTO {table} ({', '.join(t.columns)}) SELECT {picked}"
                  f" FROM {table} WHERE session_id = ? AND version <= ?"
                  f"{_conflict(table, keep)}", d)


# The session holding `version` of a session's history: walk up while the version is at
# or below the fork point. One statement, bounded (a cycle yields WALK_LIMIT rows, then
# stops); the deepest row is the holder, or WALK_LIMIT deep when the walk did not end.
_UP = ("WITH RECURSIVE up(session_id, depth) AS (SELECT {text}, 0 UNION ALL"
       " SELECT f.source_id, up.depth + 1 FROM forks f JOIN up ON f.session_id = up.session_id"
       " WHERE f.version >= ? AND up.depth < ?), holder AS (SELECT session_id, depth FROM up"
       " ORDER BY depth DESC LIMIT 1)")
# A column of the event at a version of a session's history (an ancestor's, below its fork
# point); args (session_id, version, WALK_LIMIT, version, WALK_LIMIT).
AT_SQL: Final = (_UP + " SELECT e.{column} FROM holder h JOIN events e"
                 " ON e.session_id = h.session_id AND e.version = ? WHERE h.depth < ?")
# A session and its sources, nearest first, at most `limit` of them.
ANCESTRY_SQL: Final = (
    "WITH RECURSIVE up(session_id, depth) AS (SELECT {text}, 0 UNION ALL"
    " SELECT f.source_id, up.depth + 1 FROM forks f JOIN up ON f.session_id = up.session_id"
    " WHERE up.depth + 1 < ?) SELECT session_id FROM up ORDER BY depth")
# The payload a row with an empty one shares: the row holding it at the same position.
SHARED_PAYLOAD_SQL: Final = ("SELECT payload FROM checkpoints WHERE position = ?"
                             " AND length(payload) > 0 LIMIT 1")


@cache
def at_sql(column: str, d: Dialect) -> str:
    return render(AT_SQL.replace("{column}", column), d)


def at_args(session_id: str, version: int) -> tuple[Any, ...]:
    return (session_id, version, WALK_LIMIT, version, WALK_LIMIT)


# Before a (session_id, checkpoint_id) row is replaced: its payload to one fork row that
# shares it.
_HAND_ON: Final = (
    "UPDATE checkpoints SET payload = (SELECT payload FROM checkpoints WHERE session_id = ?"
    " AND checkpoint_id = ?) WHERE (session_id, checkpoint_id) = (SELECT session_id,"
    " checkpoint_id FROM checkpoints WHERE length(payload) = 0 AND position = (SELECT"
    " position FROM checkpoints WHERE session_id = ? AND checkpoint_id = ?"
    " AND length(payload) > 0) LIMIT 1)")
# Before a session's rows are deleted: the rows of other sessions that share one of its
# payloads get it (a source with forks is never deleted, but a fork holding a payload
# handed on may be).
_HAND_ON_DELETED: Final = (
    "UPDATE checkpoints SET payload = (SELECT o.payload FROM checkpoints o"
    " WHERE o.session_id = ? AND o.position = checkpoints.position"
    " AND length(o.payload) > 0) WHERE session_id <> ? AND length(payload) = 0"
    " AND position IN (SELECT position FROM checkpoints WHERE session_id = ?"
    " AND length(payload) > 0)")


def steps(op: Op, d: Dialect) -> Steps:
    """The statements of one op (an Insert's too, though executors run those directly)."""
    if isinstance(op, Insert):
        yield Stmt(insert_sql(op.table, op.keep, d), many=op.rows)
    elif isinstance(op, DeleteWhere):
        where = [f"{c} = ?" for c, _ in op.where]
        args = tuple(v for _, v in op.where)
        if op.at_least is not None:
            where.append(f"{op.at_least[0]} >= ?")
            args += (op.at_least[1],)
        yield Stmt(render(f"DELETE FROM {op.table}"
                          + (f" WHERE {' AND '.join(where)}" if where else ""), d), args)
    elif isinstance(op, CopyRows):
        yield Stmt(_copy_sql(op.table, op.keep, op.blank, d),
                   (op.target, op.source, op.upto_version))
    elif isinstance(op, ForkShares):
        yield from _fork_shares(op, d)
    elif isinstance(op, HandOnPayloads):
        yield Stmt(render(_HAND_ON, d), many=[(s, c, s, c) for s, c in op.rows])
    elif isinstance(op, TrimHistory):
        yield from _trim(op, d)
    elif isinstance(op, ForgetSessions):
        yield Stmt(render(_HAND_ON_DELETED, d), many=[(s, s, s) for s in op.session_ids])
        for table in SESSION_MODEL_TABLES:
            yield Stmt(render(f"DELETE FROM {table} WHERE session_id = ?", d),
                       many=[(s,) for s in op.session_ids])


def trim_range(op: TrimHistory, d: Dialect) -> Stmt:
    """The positions of the session's own events a trim takes out: from its first stored
    event's to the one at `op.version`'s (two columns; none when it has no such event)."""
    return Stmt(render("SELECT MIN(position), MAX(position) FROM events WHERE session_id = ?"
                       " AND version <= ?", d), (op.session_id, op.version), fetch=True)


def _trim(op: TrimHistory, d: Dialect) -> Steps:
    rows = yield trim_range(op, d)
    if not rows or rows[0][0] is None:
        return
    first, last = int(rows[0][0]), int(rows[0][1])
    for table in SESSION_MODEL_TABLES:
        if table != "forks":  # a fork's link to its source stays (time travel, verify)
            yield Stmt(render(f"DELETE FROM {table} WHERE session_id = ? AND position >= ?"
                              " AND position <= ?", d), (op.session_id, first, last))
    yield Stmt(render("DELETE FROM snapshots WHERE session_id = ? AND version < ?", d),
               (op.session_id, op.version))
    yield Stmt(render("DELETE FROM events WHERE session_id = ? AND version <= ?", d),
               (op.session_id, op.version))


def _fork_shares(op: ForkShares, d: Dialect) -> Steps:
    rows = yield Stmt(at_sql("position", d), at_args(op.source, op.version), fetch=True)
    if not rows:
        return  # the source is gone: verify reports it
    at, count = int(rows[0][0]), op.message_count
    # The source's conversation now, cut at the fork point. A message the source took out
    # and appended again after the fork point is missing here and found below. The claimed
    # count only filters rows the store has: it never sizes anything (an imported or
    # damaged view may claim 2^63 messages).
    yield Stmt(render("INSERT INTO messages (session_id, sequence, position) SELECT ?,"
                      " sequence, position FROM messages WHERE session_id = ? AND sequence < ?"
                      " AND position <= ?", d), (op.target, op.source, count, at))
    have = {r[0] for r in (yield Stmt(render(
        "SELECT sequence FROM messages WHERE session_id = ? AND sequence < ?", d),
        (op.target, count), fetch=True))}
    if len(have) < count:
        found = yield from _find_messages(op.source, op.version, count, have, d)
        if found:
            yield Stmt(insert_sql("messages", "error", d),
                       many=[(op.target, seq, pos) for seq, pos in found.items()])
    # The payloads are shared, not copied: the fork's rows hold an empty payload (no stored
    # payload is empty: JSON is at least one byte) and the position of the source's
    # checkpoint.saved, by which the payload is found (SHARED_PAYLOAD_SQL).
    yield Stmt(_copy_sql("checkpoints", "latest", ("payload",), d),
               (op.target, op.source, op.version))


def _find_messages(session_id: str, version: int, count: int, have: set[int],
                   d: Dialect) -> Generator[Stmt, list[Any], dict[int, int]]:
    """sequence -> position of the message each sequence below `count` not in `have` held
    at `version`: the last message.appended with that sequence at or before it, walking up
    through sources (at most WALK_LIMIT of them, never one twice)."""
    found: dict[int, int] = {}
    seen: set[str] = set()
    while len(have) + len(found) < count and session_id not in seen \
            and len(seen) < WALK_LIMIT:
        seen.add(session_id)
        here: dict[int, int] = {}
        for data, position in (yield Stmt(render(
                "SELECT data, position FROM events WHERE session_id = ? AND version <= ?"
                " AND type = 'message.appended' ORDER BY version", d),
                (session_id, version), fetch=True)):
            seq = msgspec.json.decode(data)["sequence"]
            if isinstance(seq, int) and 0 <= seq < count and seq not in have \
                    and seq not in found:
                here[seq] = position  # later ones win
        found.update(here)  # a nearer session's message wins over its source's
        link = yield Stmt(render("SELECT source_id, version FROM forks WHERE session_id = ?",
                                 d), (session_id,), fetch=True)
        if not link:
            break
        session_id, version = link[0][0], min(version, int(link[0][1]))
    return found
