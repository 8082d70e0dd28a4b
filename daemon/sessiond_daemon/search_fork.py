"""The methods of search and fork: session.search, session.fork, session.forks, daemon.reindex."""

from __future__ import annotations

import functools
import sqlite3

import msgspec
import structlog

from sessiond_schemas import rpc
from sessiond_schemas.events import EventMeta

from . import forks, search
from .commands import Commands
from .eventstore import EVENT_COLUMNS, SqlAccess, Store, client_gone, event_from_row
from .forks import StateAt
from .service import normalise_time
from .sqlite import executor
from .stores.models.conversation import relink as relink_forks

log = structlog.get_logger("sessiond.search")
REINDEX_RANGE = 50_000  # positions per transaction: about a second of work


class SearchAndFork:
    """Finding sessions by their text, and branching them, beside the Service."""

    def __init__(self, store: Store, commands: Commands, state_at: StateAt) -> None:
        self.store = store
        self.commands = commands
        self.state_at = state_at  # a session's view at a version, what a fork starts from

    @property
    def sql(self) -> SqlAccess:
        """Search and reindex are SQLite's FTS5: on another store they fail (-32012) when
        called, and the daemon serves the rest."""
        return search.sql_of(self.store)

    async def session_search(self, p: rpc.SessionSearchParams, meta: EventMeta) -> rpc.SearchResult:
        since = normalise_time(p.since, "$.since")
        until = normalise_time(p.until, "$.until")

        limits = self.commands.limits
        budget = search.Budget(max_terms=limits.search_max_terms,
                               max_prefixes=limits.search_max_prefixes,
                               max_steps=limits.search_max_steps,
                               timeout_s=limits.search_timeout_s, gone=client_gone.get())
        search.check_terms(p.query, budget)  # refused before a read connection is taken
        sql = self.sql

        def run(con: sqlite3.Connection) -> rpc.SearchResult:
            return search.query(con, text=p.query, statuses=tuple(p.status or ()),
                                namespace=p.namespace, actor_name=p.actor_name, since=since,
                                until=until, limit=p.limit, hits=p.hits, mark=p.mark,
                                cursor=p.cursor, budget=budget)
        try:
            return await sql.on_reader(run)
        finally:
            # Cancelled (the client went, the daemon stops): the query on the reader's
            # thread stops at its next progress call instead of running on.
            budget.stop.set()

    async def session_fork(self, p: rpc.SessionForkParams, meta: EventMeta) -> msgspec.Raw:
        return await forks.fork(self.commands, self.store, self.state_at, p, meta)

    async def session_forks(self, p: rpc.SessionForksParams, meta: EventMeta) -> rpc.ForksResult:
        state = await self.commands.state(p.session_id)
        return await forks.forks_of(self.store, p, state)

    async def daemon_reindex(self, p: rpc.NoParams, meta: EventMeta) -> rpc.ReindexResult:
        """Rebuild the read models of search and forks from the events.

        The index is emptied, then refilled a range of positions per transaction, so the
        writer's batches go on between ranges (a long single transaction would hold every
        write, and systemd's watchdog would restart the daemon). Meanwhile search finds
        only what is refilled; deletes skip rows not yet back (search.forget_session)."""
        top = await self.sql.on_writer(search.clear)
        done = 0
        while done < top:
            upto = min(top, done + REINDEX_RANGE)
            await self.sql.on_writer(functools.partial(search.rebuild_range, after=done,
                                                       upto=upto))
            done = upto

        def relink(con: sqlite3.Connection) -> int:
            cur = con.execute(f"SELECT {EVENT_COLUMNS} FROM events"
                              " WHERE type = 'session.forked' ORDER BY position")
            first = True
            while (rows := cur.fetchmany(500)) or first:
                executor.run(con, relink_forks([event_from_row(r) for r in rows],
                                               first=first))
                first = False
            return int(con.execute("SELECT COUNT(*) FROM forks").fetchone()[0])
        linked = await self.sql.on_writer(relink)
        result = rpc.ReindexResult(indexed=await self.sql.on_reader(search.count),
                                   forks=linked)
        log.info("search.reindexed", indexed=result.indexed, forks=result.forks)
        return result
