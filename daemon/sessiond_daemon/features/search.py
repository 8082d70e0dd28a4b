"""Full-text search, the feature: session.search's params and cost budget, checked before a
store runs the query.

The index is the search read model (stores/models/search_text.py: which events are
documents, their text; stores/models/search.py: how a page is made); each store keeps it
(PostgreSQL in its commit; SQLite just after, catching up before any read of it) and runs
the query in its own SQL, behind the `full_text` capability (stores/sqlite/search.py:
FTS5; stores/postgres/search.py: tsvector and GIN). A store without one answers -32012.
"""

from __future__ import annotations

import re
from typing import Final

import structlog

from sessiond_daemon.core.commands import Commands
from sessiond_daemon.core.request import client_gone
from sessiond_daemon.features.service import normalise_time
from sessiond_daemon.stores.interface import FullText, SearchBudget, SearchQuery, Store
from sessiond_daemon.stores.models import search as search_model
from sessiond_daemon.stores.models.search import decode_cursor
from sessiond_schemas import rpc
from sessiond_schemas.errors import InvalidParamsError, StorageError
from sessiond_schemas.events import EventMeta

_OPERATORS: Final = frozenset({"AND", "OR", "NOT", "NEAR"})
_TERM = re.compile(r"\w+\*?")


def check_terms(text: str, budget: SearchBudget) -> None:
    """Refuse (-32602, naming the setting) a query with more terms or prefixes than the
    budget allows: a prefix merges the index lists of every word it starts, so `a* a* ...`
    costs as much as the store is large."""
    terms = [t for t in _TERM.findall(text) if t not in _OPERATORS]
    prefixes = sum(t.endswith("*") for t in terms)
    for count, limit, setting, what in ((len(terms), budget.max_terms, "search_max_terms",
                                         "terms"),
                                        (prefixes, budget.max_prefixes,
                                         "search_max_prefixes", "prefix terms (word*)")):
        if count > limit:
            raise InvalidParamsError(
                f"query has {count} {what}, more than {setting} ({limit}) allows: use"
                " fewer, or longer words", {"detail": "over the search budget",
                                            "path": "$.query", "setting": setting,
                                            "limit": limit, "found": count})


def full_text_of(store: Store) -> FullText:
    """The store's full-text index, or -32012 saying this store has none."""
    full_text = store.capabilities.full_text
    if full_text is None:
        raise StorageError(
            "full-text search (session.search, daemon.reindex) is not available on this"
            " store: it keeps no search index; every other method is served",
            {"detail": "no search index"})
    return full_text


log = structlog.get_logger("sessiond.search")
REINDEX_RANGE = 50_000  # positions per transaction: about a second of work


class Search:
    """The methods of full-text search: session.search and daemon.reindex."""

    def __init__(self, store: Store, commands: Commands) -> None:
        self.store = store
        self.commands = commands

    async def session_search(self, p: rpc.SessionSearchParams, meta: EventMeta) -> rpc.SearchResult:
        since = normalise_time(p.since, "$.since")
        until = normalise_time(p.until, "$.until")
        limits = self.commands.limits
        budget = SearchBudget(max_terms=limits.search_max_terms,
                              max_prefixes=limits.search_max_prefixes,
                              max_prefix_matches=limits.search_max_prefix_matches,
                              max_steps=limits.search_max_steps,
                              timeout_s=limits.search_timeout_s, gone=client_gone.get())
        check_terms(p.query, budget)  # refused before a read connection is taken
        after = decode_cursor(p.cursor) if p.cursor is not None else None
        query = SearchQuery(text=p.query, statuses=tuple(p.status or ()),
                            namespace=p.namespace, actor_name=p.actor_name, since=since,
                            until=until, limit=p.limit, hits=p.hits, mark=p.mark, after=after,
                            window=search_model.WINDOW)
        return await full_text_of(self.store).search(query, budget)

    async def daemon_reindex(self, p: rpc.NoParams, meta: EventMeta) -> rpc.ReindexResult:
        """Rebuild the read models of search and forks from the events.

        The index is emptied, then refilled a range of positions per transaction, so the
        writer's batches go on between ranges (a long single transaction would hold every
        write, and systemd's watchdog would restart the daemon). Meanwhile search finds
        only what is refilled; deletes skip rows not yet back (sqlite/search.py forget_session)."""
        full_text = full_text_of(self.store)
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
