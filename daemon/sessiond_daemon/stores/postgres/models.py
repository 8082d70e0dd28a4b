"""The PostgreSQL store's reads that are its own SQL: views naming a process and executors'
output (the read models' reads are stores/models/queries.py's, shared with SQLite).
Stored JSON is bytes (BYTEA, as written); the few reads that look inside it parse it with
jsonb on the rows their keys already narrowed."""

from __future__ import annotations

import msgspec

from sessiond_daemon.stores.interface import Page, repage
from sessiond_daemon.stores.models.queries import ModelQueries
from sessiond_daemon.stores.postgres.reads import Reads

_JSON = "convert_from({}, 'UTF8')::jsonb"


class ModelReads(Reads, ModelQueries):
    # --- views by namespace, executors ----------------------------------------------------

    async def sessions_with_process(self) -> list[str]:
        """Active sessions whose view names a process: candidates for restart recovery."""
        rows = await self._all("SELECT session_id FROM sessions WHERE status = 'active'"
                               f" AND {_JSON.format('state')} ->> 'pid' IS NOT NULL")
        return [r[0] for r in rows]

    async def process_output(self, session_id: str, turn: int, stream: str | None,
                             after_position: int = 0,
                             max_bytes: int = 0) -> Page[tuple[int, str]]:
        """The output lines of one executor turn (one stream, or both), in order, as
        (position, line), from after `after_position`."""
        data = _JSON.format("data")
        rows = await self._page(
            "SELECT data, position FROM events WHERE session_id = $1"
            " AND type = 'process.output' AND position > $2"
            f" AND ({data} ->> 'turn') = $3::bigint::text AND ($4::text IS NULL OR"
            f" coalesce({data} ->> 'stream', 'stdout') = $4) ORDER BY position",
            (session_id, after_position, turn, stream), max_bytes)
        return repage(rows, [(r[1], msgspec.json.decode(r[0])["line"]) for r in rows])
