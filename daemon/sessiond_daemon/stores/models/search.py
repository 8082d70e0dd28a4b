"""The search read model's query side, defined once for every store: how a page of
session.search is made from a store's matches (grouped by session, ranked, cut at the
cursor, assembled with the hits' fields and the sessions' views), and verify's lines.
Its rule (which events are documents, their text) is search_text.py.

Each store keeps its own index and query SQL (sqlite/search.py: FTS5; postgres/search.py:
a tsvector column with a GIN index); both give `rank` the same (position, session_id,
score) rows, lower score first, so paging, cursors and the result shape are the same.
"""

from __future__ import annotations

import base64
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from sessiond_daemon.stores.models.unicode61 import tokens
from sessiond_schemas.errors import InvalidParamsError
from sessiond_schemas.rpc import SearchHit, SearchResult, SearchSession

WINDOW: Final = 5_000  # matching events ranked per query, newest first
SNIPPET_CHARS: Final = 1_000  # a snippet is ~12 tokens; a token may be long: cut there
# A query's pieces as FTS5 reads them: a quoted string ("" a quote inside), a bareword, a
# `*` (after a string or a bareword, with spaces between or not: a prefix), anything else.
_PIECES: Final = re.compile(r'"((?:[^"]|"")*)"?|([^\W_]+)|(\*)|\S')


def prefixes(text: str) -> list[str]:
    """The prefixes of a query's prefix terms (`deplo*`), as the index holds its words:
    each one's words are what the store merges to answer it."""
    found, last = [], None  # last: the last token of the piece before
    for quoted, bare, star in _PIECES.findall(text):
        if star:
            if last:
                found.append(last)
            last = None
            continue
        words = tokens(quoted.replace('""', '"') if quoted else bare)
        last = words[-1] if words else None
    return found


_OPERATORS: Final = frozenset({"AND", "OR", "NOT", "NEAR"})


def words(text: str) -> list[tuple[str, bool]]:
    """The words a query looks for, as the index holds them, each with whether it is a
    prefix (`deplo*`): the tokens of its strings and barewords, without its operators,
    column names (`body:`), NEAR's distances or the word or string right after a NOT.
    What a snippet the daemon cuts marks (snippet.py)."""
    found: dict[str, bool] = {}
    pieces = list(_PIECES.finditer(text))  # a query is at most 1,000 characters
    last: str | None = None  # the last token of the piece before, for a `*` after it
    skip = False  # the next word or string is NOT's operand
    for i, piece in enumerate(pieces):
        quoted, bare, star = piece.groups()
        after = pieces[i + 1].group(0) if i + 1 < len(pieces) else ""
        before = pieces[i - 1].group(0) if i else ""
        if star:
            if last is not None:
                found[last] = True
            last = None
            continue
        last = None
        if quoted is None and bare is None:
            continue
        if bare in _OPERATORS:
            skip = skip or bare == "NOT"
            continue
        if skip or after == ":" or (before == "," and bare is not None and bare.isdigit()):
            skip = False
            continue
        for token in tokens(quoted.replace('""', '"') if quoted is not None else bare):
            found.setdefault(token, False)
            last = token
    return list(found.items())


def too_broad(found: int, limit: int) -> InvalidParamsError:
    """-32602 for a query whose prefix terms' words are in more indexed events than
    search_max_prefix_matches allows (estimated from the index, before the query runs)."""
    return InvalidParamsError(
        f"query's prefix terms are too broad: their words are in about {found:,} indexed"
        f" events, more than search_max_prefix_matches ({limit:,}) allows: use a longer"
        " prefix, or the whole word", {"detail": "over the search budget", "path": "$.query",
                                       "setting": "search_max_prefix_matches",
                                       "limit": limit, "found": found})

_json = msgspec.json.Encoder()


def problems(missing: Sequence[Any], extra: Sequence[Any]) -> list[str]:
    """daemon.verify's lines for the index, from (count, first position) of the events of
    indexed types it misses and of its documents without their event."""
    found = []
    if missing[0]:
        found.append(f"search index: {missing[0]} events are not indexed (first at position"
                     f" {missing[1]}); run `sessionctl reindex`")
    if extra[0]:
        found.append(f"search index: {extra[0]} entries have no event (first at position"
                     f" {extra[1]}); run `sessionctl reindex`")
    return found


# --- the query's page, the same on every store -------------------------------------------


def encode_cursor(score: float, session_id: str) -> str:
    return base64.urlsafe_b64encode(_json.encode([score, session_id])).decode()


def decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        score, sid = msgspec.json.decode(base64.urlsafe_b64decode(cursor.encode()),
                                         type=tuple[float, str])
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidParamsError("`cursor` is not a cursor session.search returned",
                                 {"detail": str(exc), "path": "$.cursor"}) from exc
    return score, sid


@dataclass(frozen=True, slots=True)
class Ranked:
    """A query's matches grouped by session: the page's sessions (score, id), the best
    hits' positions of each, and how many matches each has."""

    page: list[tuple[float, str]]
    best: dict[str, list[int]]
    matches: dict[str, int]
    more: bool

    @property
    def chosen(self) -> list[int]:
        """The positions whose hits this page shows, ascending."""
        return sorted({p for ps in self.best.values() for p in ps})


def rank(rows: Sequence[tuple[int, str, float]], after: tuple[float, str] | None,
         limit: int, hits: int) -> Ranked:
    """Group (position, session_id, score) rows by session: a session's score is its best
    (lowest) hit's; sessions by (score, id), those after the cursor, `limit` of them."""
    by_session: dict[str, list[tuple[float, int]]] = {}
    for position, sid, score in rows:
        by_session.setdefault(sid, []).append((score, position))
    ranked = sorted((min(found)[0], sid) for sid, found in by_session.items())
    if after is not None:
        ranked = [r for r in ranked if r > after]
    page = ranked[:limit]
    best = {sid: [p for _, p in sorted(by_session[sid])[:hits]] for _, sid in page}
    return Ranked(page, best, {sid: len(by_session[sid]) for _, sid in page},
                  len(ranked) > limit)


def result(ranked: Ranked, hits: Mapping[int, SearchHit],
           views: Mapping[str, Sequence[Any]], complete: bool) -> SearchResult:
    """The page: each session's view (status, namespace, actor_name, task, updated_at) and
    its hits, best first (a session whose view is gone meanwhile is left out)."""
    found = [SearchSession(
        session_id=sid, status=views[sid][0], namespace=views[sid][1],
        actor_name=views[sid][2], task=views[sid][3], updated_at=views[sid][4],
        score=score, matches=ranked.matches[sid],
        hits=[hits[p] for p in ranked.best[sid] if p in hits])
        for score, sid in ranked.page if sid in views]
    last = ranked.page[-1] if ranked.page else None
    return SearchResult(sessions=found, complete=complete,
                        next_cursor=encode_cursor(*last) if ranked.more and last else None)


def hit(position: int, version: int, event_type: str, recorded_at: str,
        sequence: int | None, role: str | None, snippet: str, current: bool | None) -> SearchHit:
    """One hit: a message's sequence, role and whether it is still in the conversation;
    none of those for another event."""
    if event_type != "message.appended":
        sequence = role = current = None
    return SearchHit(position=position, version=version, type=event_type,
                     recorded_at=recorded_at, snippet=snippet, sequence=sequence, role=role,
                     current=current)
