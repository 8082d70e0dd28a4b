"""Read models of the agent integrations in SQLite: ADK's app and user state
(`scoped_state`, from state.updated) and an executor turn's output (process.output
events, read through json_extract)."""

from __future__ import annotations

import sqlite3
from typing import Any

import msgspec

from ..eventstore import Batch, Page, repage
from .base import SqliteReads, encode, marks


def project(db: sqlite3.Connection, batch: Batch) -> None:
    """App and user keys of state.updated events (session keys live in the view)."""
    for e in batch.events:
        if e.type != "state.updated":
            continue
        d = e.data
        if d["scope"] == "session":
            continue
        user = d["user_id"] if d["scope"] == "user" else ""  # '' is the app's own state
        db.executemany("INSERT OR REPLACE INTO scoped_state (app_name, user_id, key, value,"
                       " position) VALUES (?, ?, ?, ?, ?)",
                       [(d["app_name"], user, k, encode(v), e.position)
                        for k, v in d["delta"].items()])


class AgentReads(SqliteReads):
    async def scoped_state(self, app_name: str, user_ids: list[str]) -> dict[str, dict[str, Any]]:
        """App state (under '') and each listed user's state, as stored by state.updated."""
        users = ["", *user_ids]
        found: dict[str, dict[str, Any]] = {u: {} for u in users}
        for start in range(0, len(users), 500):
            chunk = users[start:start + 500]
            rows = await self._all(
                "SELECT user_id, key, value FROM scoped_state WHERE app_name = ?"
                f" AND user_id IN ({marks(len(chunk))})", (app_name, *chunk))
            for user, key, value in rows:
                found[user][key] = msgspec.json.decode(value)
        return found

    async def process_output(self, session_id: str, turn: int, stream: str | None,
                             after_position: int = 0,
                             max_bytes: int = 0) -> Page[tuple[int, str]]:
        """The output lines of one executor turn (one stream, or both), in order, as
        (position, line), from after `after_position`."""
        rows = await self._page(
            "SELECT data, position FROM events WHERE session_id = ?"
            " AND type = 'process.output' AND position > ?"
            " AND json_extract(data, '$.turn') = ? AND (? IS NULL OR"
            " coalesce(json_extract(data, '$.stream'), 'stdout') = ?) ORDER BY position",
            (session_id, after_position, turn, stream, stream), max_bytes)
        return repage(rows, [(r[1], msgspec.json.decode(r[0])["line"]) for r in rows])

    async def events_of_types(self, session_id: str,
                              types: tuple[str, ...]) -> list[tuple[str, Any]]:
        """A session's events of the given types, in order, as (type, decoded data)."""
        rows = await self._all(
            f"SELECT type, data FROM events WHERE session_id = ?"
            f" AND type IN ({marks(len(types))}) ORDER BY position",
            (session_id, *types))
        return [(r[0], msgspec.json.decode(r[1])) for r in rows]
