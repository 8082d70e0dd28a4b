"""The conversation's read models in SQLite: the `messages` index (message.list), the
`checkpoints` table (checkpoint.get/list, session.resume) and the fork links that share a
source's rows with its forks (forks.index). Kept in the commit, from the batch's events."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from sessiond_schemas.state import Message

from .. import forks
from ..eventstore import Batch, CheckpointRow, Page, StoredCheckpoint, messages_page, repage
from .base import SqliteReads

_dict_decoder = msgspec.json.Decoder(dict[str, Any])

def project(db: sqlite3.Connection, batch: Batch) -> None:
    """The message index, fork links and checkpoints of the batch's events, in event order:
    a truncation removes what came before it, a fork copies its source's rows as they are."""
    messages: list[tuple[str, int, int]] = []
    for e in batch.events:
        if e.type == "message.appended":
            messages.append((e.session_id, e.data["sequence"], e.position))
        elif e.type == "messages.truncated":
            _insert_messages(db, messages)
            messages = []
            db.execute("DELETE FROM messages WHERE session_id = ? AND sequence >= ?",
                       (e.session_id, e.data["from_sequence"]))
        elif e.type == "session.forked":
            _insert_messages(db, messages)
            messages = []
            forks.index(db, e)
    _insert_messages(db, messages)
    checkpoints = [
        (e.session_id, e.data["checkpoint_id"], e.position, e.version,
         e.data.get("node_id"), e.data.get("resume_from"), e.recorded_at,
         e.data["size"], batch.payloads[e.event_id])
        for e in batch.events
        if e.type == "checkpoint.saved"
    ]
    if checkpoints:
        for row in checkpoints:
            forks.keep_shared_payload(db, row[0], row[1])
        db.executemany(
            "INSERT OR REPLACE INTO checkpoints (session_id, checkpoint_id, position,"
            " version, node_id, resume_from, created_at, size, payload)"
            " VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)",
            checkpoints,
        )


def _insert_messages(db: sqlite3.Connection, rows: list[tuple[str, int, int]]) -> None:
    if rows:
        db.executemany("INSERT INTO messages (session_id, sequence, position) VALUES (?, ?, ?)",
                       rows)


def messages_page_sql(descending: bool) -> str:
    """The page query of message.list: a range on the (session_id, sequence) key, then LIMIT."""
    op, order = ("<=", "DESC") if descending else (">=", "ASC")
    return (
        "SELECT e.data, e.recorded_at FROM messages m JOIN events e ON e.position = m.position"
        f" WHERE m.session_id = ? AND m.sequence {op} ? ORDER BY m.sequence {order} LIMIT ?"
    )


class ConversationReads(SqliteReads):
    """Messages and checkpoints, read through their indexes."""

    async def list_messages(
        self, session_id: str, *, first: int, limit: int, descending: bool, max_bytes: int = 0
    ) -> Page[Message]:
        """Read `limit` messages (or `max_bytes` of them) starting at sequence `first`,
        walking the primary key."""
        rows = await self._page(messages_page_sql(descending), (session_id, first, limit),
                                max_bytes)
        return messages_page(rows)

    async def checkpoint(self, session_id: str,
                         checkpoint_id: str | None) -> StoredCheckpoint | None:
        columns = "checkpoint_id, node_id, resume_from, created_at, version, payload, position"
        if checkpoint_id is None:
            row = await self._one(
                f"SELECT {columns} FROM checkpoints WHERE session_id = ?"
                " ORDER BY version DESC LIMIT 1",
                (session_id,),
            )
        else:
            row = await self._one(
                f"SELECT {columns} FROM checkpoints WHERE session_id = ? AND checkpoint_id = ?",
                (session_id, checkpoint_id),
            )
        if row is None:
            return None
        saved = await self._one("SELECT data FROM events WHERE position = ?", (row[6],))
        memory = _dict_decoder.decode(saved[0]).get("memory", {}) if saved else {}
        return StoredCheckpoint(
            checkpoint_id=row[0], node_id=row[1], resume_from=row[2], created_at=row[3],
            version=row[4], payload=await self._payload(bytes(row[5]), row[6]), memory=memory,
        )

    async def _payload(self, payload: bytes, position: int) -> bytes:
        """A row's payload, or the one it shares with its source (a fork's rows)."""
        if payload:
            return payload
        shared = await self._one(forks.SHARED_PAYLOAD_SQL, (position,))
        return bytes(shared[0]) if shared else b"null"

    async def checkpoints(self, session_id: str, after_version: int = 0,
                          max_bytes: int = 0) -> Page[CheckpointRow]:
        rows = await self._page(
            "SELECT checkpoint_id, node_id, created_at, size, version FROM checkpoints"
            " WHERE session_id = ? AND version > ? ORDER BY version",
            (session_id, after_version),
            max_bytes,
        )
        return repage(rows, [
            CheckpointRow(checkpoint_id=r[0], node_id=r[1], created_at=r[2], size=r[3],
                          version=r[4])
            for r in rows
        ])

    async def checkpoint_payloads(self, session_id: str) -> dict[str, bytes]:
        rows = await self._all("SELECT checkpoint_id, payload, position FROM checkpoints"
                               " WHERE session_id = ?", (session_id,))
        return {r[0]: await self._payload(bytes(r[1]), r[2]) for r in rows}
