"""The read models' queries, written once for every store (`?` placeholders, rendered
per driver by the store's `_q_all` / `_q_page`): messages, checkpoints, progress steps,
the runner index, app/user state, the LangGraph indexes and forks.

A store mixes `ModelQueries` in and gives it two methods over its read connections
(`QueryDriver`); the few reads whose SQL truly differs (JSON inside stored events) stay
in the store."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Final, Protocol

import msgspec

from sessiond_daemon.stores.interface import CheckpointRow, ForkRow, Page, StoredCheckpoint, repage
from sessiond_daemon.stores.models.sql import (
    ANCESTRY_SQL,
    SHARED_PAYLOAD_SQL,
    Dialect,
    at_args,
    at_sql,
    marks,
)
from sessiond_daemon.stores.rows import add_pending_writes, messages_page
from sessiond_schemas.events import ProgressRecorded
from sessiond_schemas.state import Message, ProgressStep

_dict_decoder = msgspec.json.Decoder(dict[str, Any])
_step_decoder = msgspec.json.Decoder(ProgressRecorded)
_CHUNK: Final = 400  # list parameters per statement (SQLite's limit is far above)


def messages_page_sql(descending: bool) -> str:
    """The page query of message.list: a range on the (session_id, sequence) key, then LIMIT."""
    op, order = ("<=", "DESC") if descending else (">=", "ASC")
    return (
        "SELECT e.data, e.recorded_at FROM messages m JOIN events e ON e.position = m.position"
        f" WHERE m.session_id = ? AND m.sequence {op} ? ORDER BY m.sequence {order} LIMIT ?"
    )


# Page query of progress.list: a range on the (session_id, version) key, then LIMIT.
PROGRESS_PAGE_SQL: Final = (
    "SELECT p.version, e.recorded_at, e.data FROM progress_steps p"
    " JOIN events e ON e.position = p.position"
    " WHERE p.session_id = ? AND p.version > ? AND p.version <= ?"
    " ORDER BY p.version LIMIT ?")


def steps_of(rows: list[Any]) -> list[ProgressStep]:
    """ProgressSteps of (version, recorded_at, progress.recorded data) rows."""
    out = []
    for version, recorded_at, data in rows:
        d = _step_decoder.decode(data)
        out.append(ProgressStep(version=version, node_id=d.node_id, edge=d.edge,
                                latency_ms=d.latency_ms, tokens=d.tokens, retries=d.retries,
                                failed=d.failed, recorded_at=recorded_at))
    return out


class QueryDriver(Protocol):
    """What ModelQueries needs of a store: its dialect and two reads of shared SQL."""

    dialect: Dialect

    async def _q_all(self, sql: str, args: tuple[Any, ...]) -> list[Any]: ...
    async def _q_page(self, sql: str, args: tuple[Any, ...], max_bytes: int) -> Page[Any]: ...


class ModelQueries:
    """The read-model reads of stores/interface.py's Protocols, over a QueryDriver."""

    dialect: Dialect

    if TYPE_CHECKING:  # the store's (QueryDriver); nothing here to shadow them at run time
        async def _q_all(self, sql: str, args: tuple[Any, ...]) -> list[Any]: ...
        async def _q_page(self, sql: str, args: tuple[Any, ...],
                          max_bytes: int) -> Page[Any]: ...

    async def _q_one(self, sql: str, args: tuple[Any, ...]) -> Any:
        rows = await self._q_all(sql, args)
        return rows[0] if rows else None

    # --- messages, checkpoints ------------------------------------------------------------

    async def list_messages(
        self, session_id: str, *, first: int, limit: int, descending: bool, max_bytes: int = 0
    ) -> Page[Message]:
        """Read `limit` messages (or `max_bytes` of them) starting at sequence `first`,
        walking the primary key."""
        rows = await self._q_page(messages_page_sql(descending), (session_id, first, limit),
                                  max_bytes)
        return messages_page(rows)

    async def checkpoint(self, session_id: str,
                         checkpoint_id: str | None) -> StoredCheckpoint | None:
        columns = ("c.checkpoint_id, c.node_id, c.resume_from, c.created_at, c.version,"
                   " c.payload, e.data, c.position")
        source = "checkpoints c LEFT JOIN events e ON e.position = c.position"
        if checkpoint_id is None:
            row = await self._q_one(f"SELECT {columns} FROM {source} WHERE c.session_id = ?"
                                    " ORDER BY c.version DESC LIMIT 1", (session_id,))
        else:
            row = await self._q_one(f"SELECT {columns} FROM {source} WHERE c.session_id = ?"
                                    " AND c.checkpoint_id = ?", (session_id, checkpoint_id))
        if row is None:
            return None
        memory = _dict_decoder.decode(row[6]).get("memory", {}) if row[6] is not None else {}
        return StoredCheckpoint(
            checkpoint_id=row[0], node_id=row[1], resume_from=row[2], created_at=row[3],
            version=row[4], payload=await self._payload(bytes(row[5]), row[7]), memory=memory,
        )

    async def _payload(self, payload: bytes, position: int) -> bytes:
        """A row's payload, or the one it shares with its source (a fork's rows)."""
        if payload:
            return payload
        shared = await self._q_one(SHARED_PAYLOAD_SQL, (position,))
        return bytes(shared[0]) if shared else b"null"

    async def checkpoints(self, session_id: str, after_version: int = 0,
                          max_bytes: int = 0) -> Page[CheckpointRow]:
        rows = await self._q_page(
            "SELECT checkpoint_id, node_id, created_at, size, version FROM checkpoints"
            " WHERE session_id = ? AND version > ? ORDER BY version",
            (session_id, after_version), max_bytes)
        return repage(rows, [
            CheckpointRow(checkpoint_id=r[0], node_id=r[1], created_at=r[2], size=r[3],
                          version=r[4])
            for r in rows
        ])

    async def checkpoint_payloads(self, session_id: str) -> dict[str, bytes]:
        rows = await self._q_all("SELECT checkpoint_id, payload, position FROM checkpoints"
                                 " WHERE session_id = ?", (session_id,))
        return {r[0]: await self._payload(bytes(r[1]), r[2]) for r in rows}

    # --- progress, the runner index, app/user state ---------------------------------------

    async def progress_steps(self, session_id: str, after_version: int, upto: int,
                             limit: int, max_bytes: int = 0) -> Page[ProgressStep]:
        """Up to `limit` steps (or `max_bytes` of them) with after_version < version <= upto,
        oldest first."""
        rows = await self._q_page(PROGRESS_PAGE_SQL, (session_id, after_version, upto, limit),
                                  max_bytes)
        return repage(rows, steps_of([(r[0], r[1], bytes(r[2])) for r in rows]))

    async def runner_events(self, session_id: str, types: tuple[str, ...], *,
                            newest_first: bool = False, before_version: int | None = None,
                            limit: int = -1) -> list[tuple[str, int, dict[str, Any]]]:
        """(type, version, data) of a session's indexed events of `types`, in version order
        (or newest first), below `before_version` when given; at most `limit` (-1: all)."""
        rows = await self._q_all(
            "SELECT r.type, r.version, e.data FROM runner_events r"
            " JOIN events e ON e.position = r.position WHERE r.session_id = ?"
            f" AND r.type IN ({marks(len(types))}) AND r.version < ?"
            f" ORDER BY r.version {'DESC' if newest_first else 'ASC'} LIMIT ?",
            (session_id, *types, before_version if before_version is not None else 1 << 62,
             self.dialect.no_limit if limit < 0 else limit))
        return [(r[0], r[1], _dict_decoder.decode(r[2])) for r in rows]

    async def scoped_state(self, app_name: str, user_ids: list[str]) -> dict[str, dict[str, Any]]:
        """App state (under '') and each listed user's state, as stored by state.updated."""
        users = ["", *user_ids]
        found: dict[str, dict[str, Any]] = {u: {} for u in users}
        for start in range(0, len(users), _CHUNK):
            chunk = users[start:start + _CHUNK]
            rows = await self._q_all(
                "SELECT user_id, key, value FROM scoped_state WHERE app_name = ?"
                f" AND user_id IN ({marks(len(chunk))})", (app_name, *chunk))
            for user, key, value in rows:
                found[user][key] = msgspec.json.decode(value)
        return found

    # --- LangGraph ------------------------------------------------------------------------

    async def graph_checkpoints(self, session_id: str | None, ns: str | None,
                                checkpoint_id: str | None, before: str | None, limit: int,
                                offset: int, after: tuple[str, str, str] | None = None
                                ) -> list[tuple[str, str, str, bytes]]:
        """(session_id, ns, checkpoint_id, event data) of indexed checkpoints, newest id first
        (then by session_id, ns); only those past `after`, such a triple, when given."""
        where: list[str] = []
        args: list[Any] = []
        for column, op, value in (("session_id", "=", session_id), ("ns", "=", ns),
                                  ("checkpoint_id", "=", checkpoint_id),
                                  ("checkpoint_id", "<", before)):
            if value is not None:
                where.append(f"gc.{column} {op} ?")
                args.append(value)
        if after is not None:
            where.append("(gc.checkpoint_id < ? OR (gc.checkpoint_id = ? AND (gc.session_id > ?"
                         " OR (gc.session_id = ? AND gc.ns > ?))))")
            args += [after[2], after[2], after[0], after[0], after[1]]
        rows = await self._q_all(
            "SELECT gc.session_id, gc.ns, gc.checkpoint_id, e.data"
            " FROM graph_checkpoints gc JOIN events e ON e.position = gc.position"
            + (" WHERE " + " AND ".join(where) if where else "")
            + " ORDER BY gc.checkpoint_id DESC, gc.session_id, gc.ns LIMIT ? OFFSET ?",
            (*args, limit, offset))
        return [(r[0], r[1], r[2], bytes(r[3])) for r in rows]

    async def graph_checkpoint_ids(self, session_id: str) -> list[tuple[str, str]]:
        """(ns, checkpoint_id) of a thread's indexed checkpoints, newest id first."""
        rows = await self._q_all("SELECT ns, checkpoint_id FROM graph_checkpoints"
                                 " WHERE session_id = ? ORDER BY checkpoint_id DESC",
                                 (session_id,))
        return [(r[0], r[1]) for r in rows]

    async def graph_values(self, session_id: str, ns: str,
                           wanted: list[tuple[str, str]]) -> dict[tuple[str, str], Any]:
        """The stored values of these (channel, version) pairs, from the events holding them."""
        found: dict[tuple[str, str], Any] = {}
        for start in range(0, len(wanted), _CHUNK):
            chunk = wanted[start:start + _CHUNK]
            pairs = ", ".join("(?, ?)" for _ in chunk)
            rows = await self._q_all(
                "SELECT gb.channel, gb.version, e.position, e.data FROM graph_blobs gb"
                " JOIN events e ON e.position = gb.position WHERE gb.session_id = ? AND gb.ns = ?"
                f" AND (gb.channel, gb.version) IN (VALUES {pairs})",
                (session_id, ns, *(x for pair in chunk for x in pair)))
            decoded: dict[int, Any] = {}
            for channel, version, position, data in rows:
                if position not in decoded:
                    decoded[position] = msgspec.json.decode(data)
                found[(channel, version)] = decoded[position]["blobs"][channel]
        return found

    async def graph_pending(self, session_id: str, ns: str,
                            checkpoint_ids: list[str]) -> dict[str, list[dict[str, Any]]]:
        """Each checkpoint's pending writes, by task then idx."""
        found: dict[str, list[dict[str, Any]]] = {}
        for start in range(0, len(checkpoint_ids), _CHUNK):
            chunk = checkpoint_ids[start:start + _CHUNK]
            rows = await self._q_all(
                "SELECT gw.checkpoint_id, gw.item, e.position, e.data"
                " FROM graph_writes gw JOIN events e ON e.position = gw.position"
                " WHERE gw.session_id = ? AND gw.ns = ?"
                f" AND gw.checkpoint_id IN ({marks(len(chunk))})"
                " ORDER BY gw.checkpoint_id, gw.task_id, gw.idx", (session_id, ns, *chunk))
            add_pending_writes(found, rows)
        return found

    async def graph_runs(self, run_ids: list[str]) -> list[tuple[str, str, str]]:
        """(session_id, ns, checkpoint_id) of checkpoints made by any of these runs."""
        found: list[tuple[str, str, str]] = []
        for start in range(0, len(run_ids), _CHUNK):
            chunk = run_ids[start:start + _CHUNK]
            rows = await self._q_all(
                "SELECT session_id, ns, checkpoint_id FROM graph_checkpoints WHERE run_id"
                f" IN ({marks(len(chunk))}) ORDER BY session_id", tuple(chunk))
            found += [(r[0], r[1], r[2]) for r in rows]
        return sorted(found, key=lambda r: r[0]) if len(run_ids) > _CHUNK else found

    # --- forks ----------------------------------------------------------------------------

    async def hash_at(self, session_id: str, version: int) -> str | None:
        """The chain hash of a session's history at `version` (an ancestor's below its
        fork point)."""
        row = await self._q_one(at_sql("hash", self.dialect), at_args(session_id, version))
        return str(row[0]) if row else None

    async def fork_ancestry(self, session_id: str, limit: int) -> list[str]:
        """The session and its sources, nearest first, at most `limit` of them."""
        return [str(r[0]) for r in await self._q_all(ANCESTRY_SQL, (session_id, limit))]

    async def fork_count(self, session_id: str) -> int:
        row = await self._q_one("SELECT COUNT(*) FROM forks WHERE source_id = ?", (session_id,))
        return int(row[0])

    async def forks_page(self, source_id: str, after: str,
                         limit: int) -> tuple[int, list[ForkRow]]:
        """(how many forks `source_id` has, those after id `after`, by id)."""
        rows = await self._q_all("SELECT session_id, version, forked_at FROM forks WHERE"
                                 " source_id = ? AND session_id > ? ORDER BY session_id"
                                 " LIMIT ?", (source_id, after, limit))
        return await self.fork_count(source_id), [
            ForkRow(session_id=r[0], version=int(r[1]), forked_at=r[2]) for r in rows]


if TYPE_CHECKING:
    from sessiond_daemon.stores.interface import (
        CheckpointReads,
        ForkReads,
        GraphReads,
        MessageReads,
        ProgressReads,
        RunnerReads,
        ScopedStateReads,
    )

    def _serves_the_read_models(q: ModelQueries) -> tuple[
            MessageReads, CheckpointReads, ProgressReads, RunnerReads, ScopedStateReads,
            GraphReads, ForkReads]:
        """mypy checks here that ModelQueries implements the read-model Protocols."""
        return q, q, q, q, q, q, q
