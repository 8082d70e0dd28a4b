"""Forks in PostgreSQL (forks.py's SQL for this store): the link a session.forked event
records, the source's messages and checkpoints the fork shares, and the reads that walk
from a fork up to the session holding a version of its history."""

from __future__ import annotations

from typing import Any

import msgspec

from sessiond_schemas.events import Event

from ..forks import WALK_LIMIT

CHECKPOINT_COLUMNS = ", ".join(f"{c} = excluded.{c}" for c in (
    "position", "version", "node_id", "resume_from", "created_at", "size", "payload"))


async def index(con: Any, e: Event) -> None:
    """Record the link, and give the fork the source's messages and checkpoints as they
    were at the fork point (rows pointing at the source's events)."""
    source, version = e.data["from"]["session_id"], e.data["from"]["version"]
    await con.execute(
        "INSERT INTO forks (session_id, source_id, version, forked_at, position)"
        " VALUES ($1, $2, $3, $4, $5) ON CONFLICT (session_id) DO UPDATE SET"
        " source_id = excluded.source_id, version = excluded.version,"
        " forked_at = excluded.forked_at, position = excluded.position",
        e.session_id, source, version, e.recorded_at, e.position)
    at = await position_at(con, source, version)
    if at is None:
        return  # the source is gone: verify reports it
    count = int(e.data["state"].get("message_count", 0))
    # The source's conversation now, cut at the fork point. A message the source took out
    # and appended again after the fork point is missing here and found below. The claimed
    # count only filters rows the store has: it never sizes anything.
    await con.execute(
        "INSERT INTO messages (session_id, sequence, position) SELECT $1, sequence, position"
        " FROM messages WHERE session_id = $2 AND sequence < $3 AND position <= $4",
        e.session_id, source, count, at)
    have = {r[0] for r in await con.fetch(
        "SELECT sequence FROM messages WHERE session_id = $1 AND sequence < $2",
        e.session_id, count)}
    if len(have) < count:
        found = await _find_messages(con, source, version, count, have)
        await con.executemany(
            "INSERT INTO messages (session_id, sequence, position) VALUES ($1, $2, $3)",
            [(e.session_id, seq, pos) for seq, pos in found.items()])
    # The payloads are shared, not copied (forks.py): an empty payload and the source's
    # position, by which it is found (SHARED_PAYLOAD_SQL).
    await con.execute(
        "INSERT INTO checkpoints (session_id, checkpoint_id, position, version, node_id,"
        " resume_from, created_at, size, payload) SELECT $1, checkpoint_id, position,"
        " version, node_id, resume_from, created_at, size, ''::bytea FROM checkpoints"
        " WHERE session_id = $2 AND version <= $3 ON CONFLICT (session_id, checkpoint_id)"
        f" DO UPDATE SET {CHECKPOINT_COLUMNS}",
        e.session_id, source, version)


async def _link(con: Any, session_id: str) -> tuple[str, int] | None:
    row = await con.fetchrow("SELECT source_id, version FROM forks WHERE session_id = $1",
                             session_id)
    return (row[0], int(row[1])) if row else None


# forks.py's walks, in PostgreSQL's dialect: one bounded statement each.
HOLDER_SQL = (
    "WITH RECURSIVE up(session_id, depth) AS (SELECT $1::text COLLATE \"C\", 0 UNION ALL"
    " SELECT f.source_id, up.depth + 1 FROM forks f JOIN up ON f.session_id = up.session_id"
    " WHERE f.version >= $2 AND up.depth < $3) SELECT session_id, depth FROM up"
    " ORDER BY depth DESC LIMIT 1")
ANCESTRY_SQL = (
    "WITH RECURSIVE up(session_id, depth) AS (SELECT $1::text COLLATE \"C\", 0 UNION ALL"
    " SELECT f.source_id, up.depth + 1 FROM forks f JOIN up ON f.session_id = up.session_id"
    " WHERE up.depth + 1 < $2) SELECT session_id FROM up ORDER BY depth")


async def holder(con: Any, session_id: str, version: int) -> str | None:
    """The session whose own events hold `version` of this one's history: itself, or the
    ancestor it was forked from when that version is at or below the fork point. None for
    a chain that does not end within forks.WALK_LIMIT (a cycle)."""
    row = await con.fetchrow(HOLDER_SQL, session_id, version, WALK_LIMIT)
    return None if row[1] >= WALK_LIMIT else str(row[0])


async def position_at(con: Any, session_id: str, version: int) -> int | None:
    found = await holder(con, session_id, version)
    row = None if found is None else await con.fetchrow(
        "SELECT position FROM events WHERE session_id = $1 AND version = $2", found, version)
    return int(row[0]) if row else None


async def hash_at(con: Any, session_id: str, version: int) -> str | None:
    found = await holder(con, session_id, version)
    row = None if found is None else await con.fetchrow(
        "SELECT hash FROM events WHERE session_id = $1 AND version = $2", found, version)
    return str(row[0]) if row else None


async def ancestry(con: Any, session_id: str, limit: int) -> list[str]:
    """The session and its sources, nearest first, at most `limit` of them."""
    return [str(r[0]) for r in await con.fetch(ANCESTRY_SQL, session_id, limit)]


async def _find_messages(con: Any, session_id: str, version: int, count: int,
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
        for data, position in await con.fetch(
                "SELECT data, position FROM events WHERE session_id = $1 AND version <= $2"
                " AND type = 'message.appended' ORDER BY version", session_id, version):
            seq = msgspec.json.decode(data)["sequence"]
            if isinstance(seq, int) and 0 <= seq < count and seq not in have \
                    and seq not in found:
                here[seq] = position  # later ones win
        found.update(here)  # a nearer session's message wins over its source's
        link = await _link(con, session_id)
        if link is None:
            break
        session_id, version = link[0], min(version, link[1])
    return found


# The payload a row with an empty one shares: the row holding it at the same position.
SHARED_PAYLOAD_SQL = ("SELECT payload FROM checkpoints WHERE position = $1"
                      " AND length(payload) > 0 LIMIT 1")


async def keep_shared_payloads(con: Any, rows: list[tuple[str, str]]) -> None:
    """Before these (session_id, checkpoint_id) rows are replaced by a new save: each
    payload a fork row shares is handed to one such row (forks.keep_shared_payload)."""
    await con.executemany(
        "UPDATE checkpoints SET payload = (SELECT payload FROM checkpoints WHERE session_id = $1"
        " AND checkpoint_id = $2) WHERE (session_id, checkpoint_id) = (SELECT session_id,"
        " checkpoint_id FROM checkpoints WHERE length(payload) = 0 AND position = (SELECT"
        " position FROM checkpoints WHERE session_id = $1 AND checkpoint_id = $2"
        " AND length(payload) > 0) LIMIT 1)", rows)


async def keep_payloads_of_deleted(con: Any, session_ids: list[str]) -> None:
    """Before these sessions' rows are deleted: rows of other sessions sharing one of
    their payloads get it (forks.keep_shared_payloads)."""
    await con.execute(
        "UPDATE checkpoints c SET payload = o.payload FROM checkpoints o"
        " WHERE o.session_id = ANY($1::text[]) AND o.position = c.position"
        " AND length(o.payload) > 0 AND length(c.payload) = 0"
        " AND NOT c.session_id = ANY($1::text[])", session_ids)
