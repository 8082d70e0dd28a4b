"""The SQLite reads that look inside stored events (json_extract): an executor turn's
output (process.output events) and a session's events of some types. The read models'
own reads are stores/models/queries.py's."""

from __future__ import annotations

from typing import Any

import msgspec

from sessiond_daemon.stores.interface import Page, repage
from sessiond_daemon.stores.sqlite.base import SqliteReads, marks


class AgentReads(SqliteReads):
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
