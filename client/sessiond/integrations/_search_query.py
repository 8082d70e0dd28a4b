"""A query of any length as session.search queries (the LangGraph store's and ADK memory's
searches): "any of these words" split into groups the daemon accepts.

session.search takes a query of at most 1,000 characters and `search_max_terms` (64 by
default) words; the SDKs' in-memory stores answer a query of any length. Since "any of
these words" is the union of "any of" each group's, the integrations send one query a
group and merge what they find: the same answer, for up to MAX_QUERIES groups. Past
that, the longest words are kept (the most telling: a long word is rarer than a short
one) and the shortest left out; a word that alone passes the query's limit is left out
too. docs/integrations.md says so.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable, Sequence
from typing import Final, TypeVar

from sessiond_schemas.errors import InvalidParamsError

T = TypeVar("T")

MAX_QUERY_CHARS: Final = 1_000  # session.search's `query`, at most
MAX_TERMS: Final = 64  # search_max_terms' default: a daemon set lower says its own
MAX_QUERIES: Final = 4  # session.search calls one query of the SDK becomes, at most
_TERM: Final = re.compile(r"\w+")
_OPERATORS: Final = frozenset({"AND", "OR", "NOT", "NEAR"})


def _terms(text: str) -> int:
    """The terms the daemon counts in a query (features/search.py: its words)."""
    return sum(1 for t in _TERM.findall(text) if t not in _OPERATORS)


def any_of(words: Sequence[str], wrap: Callable[[str], str] = lambda q: q,
           max_terms: int = MAX_TERMS) -> list[str]:
    """session.search queries that together find the events holding any of `words`
    (`\\w+` words, lower case, each once): `wrap` of `"w1" OR "w2" ...`, each query within
    MAX_QUERY_CHARS and `max_terms`, at most MAX_QUERIES of them (the longest words
    first when they do not all fit); one query, in the words' order, when they fit in
    one. None for no words."""
    overhead = wrap("")
    room_chars, room_terms = MAX_QUERY_CHARS - len(overhead), max_terms - _terms(overhead)
    quoted = [f'"{w}"' for w in words]
    if len(" OR ".join(quoted)) <= room_chars and len(quoted) <= room_terms:
        return [wrap(" OR ".join(quoted))] if quoted else []
    groups: list[list[str]] = []
    for word in sorted(quoted, key=len, reverse=True):  # stable: ties keep their order
        if len(word) > room_chars or room_terms < 1:
            continue
        for group in groups:
            if (len(group) < room_terms
                    and sum(map(len, group)) + 4 * len(group) + len(word) <= room_chars):
                group.append(word)
                break
        else:
            if len(groups) < MAX_QUERIES:
                groups.append([word])
    return [wrap(" OR ".join(group)) for group in groups]


def narrower_terms(data: object) -> int | None:
    """The daemon's own search_max_terms, from its -32602 refusing a query for it."""
    if (isinstance(data, dict) and data.get("setting") == "search_max_terms"
            and isinstance(data.get("limit"), int) and data["limit"] >= 1):
        return int(data["limit"])
    return None


async def each(search: Callable[[str], Awaitable[T]], words: Sequence[str],
               wrap: Callable[[str], str] = lambda q: q) -> list[T]:
    """`search` of each of any_of(words)'s queries; once more with the daemon's own
    search_max_terms when it refuses a query for it (a daemon set below the default)."""
    try:
        return [await search(q) for q in any_of(words, wrap)]
    except InvalidParamsError as exc:
        limit = narrower_terms(exc.data)
        if limit is None or limit >= MAX_TERMS:
            raise
        return [await search(q) for q in any_of(words, wrap, limit)]
