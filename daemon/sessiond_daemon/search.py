"""Full-text search, the feature: session.search's params and cost budget, checked before a
store runs the query.

The index is the search read model (stores/models/search.py: which events are documents,
their text, how a page is made); each store keeps it in its commit and runs the query in
its own SQL, behind the `full_text` capability (sqlite/search.py: FTS5;
postgres/search.py: tsvector and GIN). A store without one answers -32012.
"""

from __future__ import annotations

import re
from typing import Final

from sessiond_schemas.errors import InvalidParamsError, StorageError

from .eventstore import FullText, SearchBudget, Store

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
