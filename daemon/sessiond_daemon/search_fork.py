"""The methods of search and fork: session.search, session.fork, session.forks, daemon.reindex."""

from __future__ import annotations

import msgspec
import structlog

from sessiond_schemas import rpc
from sessiond_schemas.events import EventMeta

from . import forks, search
from .commands import Commands
from .eventstore import SearchBudget, SearchQuery, Store, client_gone
from .forks import StateAt
from .service import normalise_time
from .stores.models import search as search_model
from .stores.models.search import decode_cursor

log = structlog.get_logger("sessiond.search")
REINDEX_RANGE = 50_000  # positions per transaction: about a second of work


class SearchAndFork:
    """Finding sessions by their text, and branching them, beside the Service."""

    def __init__(self, store: Store, commands: Commands, state_at: StateAt) -> None:
        self.store = store
        self.commands = commands
        self.state_at = state_at  # a session's view at a version, what a fork starts from

    async def session_search(self, p: rpc.SessionSearchParams, meta: EventMeta) -> rpc.SearchResult:
        since = normalise_time(p.since, "$.since")
        until = normalise_time(p.until, "$.until")
        limits = self.commands.limits
        budget = SearchBudget(max_terms=limits.search_max_terms,
                              max_prefixes=limits.search_max_prefixes,
                              max_prefix_matches=limits.search_max_prefix_matches,
                              max_steps=limits.search_max_steps,
                              timeout_s=limits.search_timeout_s, gone=client_gone.get())
        search.check_terms(p.query, budget)  # refused before a read connection is taken
        after = decode_cursor(p.cursor) if p.cursor is not None else None
        query = SearchQuery(text=p.query, statuses=tuple(p.status or ()),
                            namespace=p.namespace, actor_name=p.actor_name, since=since,
                            until=until, limit=p.limit, hits=p.hits, mark=p.mark, after=after,
                            window=search_model.WINDOW)
        return await search.full_text_of(self.store).search(query, budget)

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
        only what is refilled; deletes skip rows not yet back (sqlite/search.py forget_session)."""
        full_text = search.full_text_of(self.store)
        top = await full_text.clear()
        done = 0
        while done < top:
            upto = min(top, done + REINDEX_RANGE)
            await full_text.rebuild_range(done, upto)
            done = upto
        linked = await full_text.relink_forks()
        result = rpc.ReindexResult(indexed=await full_text.count(), forks=linked)
        log.info("search.reindexed", indexed=result.indexed, forks=result.forks)
        return result
