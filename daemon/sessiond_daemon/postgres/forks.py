"""Forks in PostgreSQL (forks.py's SQL for this store): the link a session.forked event
records, the source's messages and checkpoints the fork shares, and the reads that walk
from a fork up to the session holding a version of its history."""

from __future__ import annotations

from typing import Any

import msgspec

from sessiond_schemas.events import Event

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
    # and appended again after the fork point is missing here and found below.
    await con.execute(
        "INSERT INTO messages (session_id, sequence, position) SELECT $1, sequence, position"
        " FROM messages WHERE session_id = $2 AND sequence < $3 AND position <= $4",
        e.session_id, source, count, at)
    have = {r[0] for r in await con.fetch(
        "SELECT sequence FROM messages WHERE session_id = $1 AND sequence < $2",
        e.session_id, count)}
    if len(have) < count:
        found = await _find_messages(con, source, version, set(range(count)) - have)
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


async def holder(con: Any, session_id: str, version: int) -> str:
    """The session whose own events hold `version` of this one's history: itself, or the
    ancestor it was forked from when that version is at or below the fork point."""
    while (link := await _link(con, session_id)) is not None and version <= link[1]:
        session_id = link[0]
    return session_id


async def position_at(con: Any, session_id: str, version: int) -> int | None:
    row = await con.fetchrow("SELECT position FROM events WHERE session_id = $1"
                             " AND version = $2", await holder(con, session_id, version), version)
    return int(row[0]) if row else None


async def hash_at(con: Any, session_id: str, version: int) -> str | None:
    row = await con.fetchrow("SELECT hash FROM events WHERE session_id = $1 AND version = $2",
                             await holder(con, session_id, version), version)
    return str(row[0]) if row else None


async def _find_messages(con: Any, session_id: str, version: int,
                         missing: set[int]) -> dict[int, int]:
    """sequence -> position of the message each sequence held at `version`: the last
    message.appended with that sequence at or before it, walking up through sources."""
    found: dict[int, int] = {}
    while missing:
        for data, position in await con.fetch(
                "SELECT data, position FROM events WHERE session_id = $1 AND version <= $2"
                " AND type = 'message.appended' ORDER BY version", session_id, version):
            seq = msgspec.json.decode(data)["sequence"]
            if seq in missing:
                found[seq] = position  # later ones win
        missing -= found.keys()
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
