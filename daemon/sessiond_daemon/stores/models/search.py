"""The search read model, defined once for every store: which events are documents and
what text each holds (`text_of`, the one rule both stores index by), and how a page of
session.search is made from a store's matches (grouped by session, ranked, cut at the
cursor, assembled with the hits' fields and the sessions' views).

Each store keeps its own index and query SQL (sqlite/search.py: FTS5; postgres/search.py:
a tsvector column with a GIN index); both give `page` the same (position, session_id,
score) rows, lower score first, so paging, cursors and the result shape are the same.
"""

from __future__ import annotations

import base64
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Final

import msgspec

from sessiond_schemas.errors import InvalidParamsError
from sessiond_schemas.events import Event
from sessiond_schemas.rpc import SearchHit, SearchResult, SearchSession

INDEXED_TYPES: Final = ("message.appended", "session.created", "session.forked",
                        "metadata.updated", "session.status_changed", "result.recorded",
                        "problem.recorded")
WINDOW: Final = 5_000  # matching events ranked per query, newest first
SNIPPET_CHARS: Final = 1_000  # a snippet is ~12 tokens; a token may be long: cut there

_json = msgspec.json.Encoder()


def _values(value: Any, out: list[str]) -> None:
    """Every scalar in a JSON value, as text, in document order (keys are not included)."""
    if isinstance(value, dict):
        for v in value.values():
            _values(v, out)
    elif isinstance(value, list):
        for v in value:
            _values(v, out)
    elif isinstance(value, str):
        out.append(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(str(value))


def _join(*parts: Any) -> str | None:
    text = " ".join(p for p in parts if isinstance(p, str) and p)
    return text or None


def text_of(event_type: str, data: dict[str, Any]) -> tuple[str | None, str | None]:
    """(body, tags) of one event: what the index holds for it."""
    meta: list[str] = []
    if event_type == "message.appended":
        _values(data.get("metadata", {}), meta)
        return data.get("content"), _join(data.get("tool_call_id"), *meta)
    if event_type in ("session.created", "session.forked"):
        d = data.get("state", {}) if event_type == "session.forked" else data
        if not isinstance(d, dict):
            return None, None
        _values(d.get("metadata", {}), meta)
        return (_join(d.get("task"), d.get("error")),
                _join(d.get("actor_name"), d.get("model"), d.get("adapter"), *meta))
    if event_type == "metadata.updated":
        _values(data.get("patch", {}), meta)
        return None, _join(*meta)
    if event_type in ("session.status_changed", "result.recorded"):
        return _join(data.get("error")), None
    if event_type == "problem.recorded":
        _values(data, meta)
        return _join(*meta), None
    return None, None


def documents(events: Sequence[Event]) -> list[tuple[Event, str | None, str | None]]:
    """The rule of the index: each event of an indexed type, with its (body, tags), in the
    batch's order (every such event is a document, even one with no text)."""
    return [(e, *text_of(e.type, e.data)) for e in events if e.type in INDEXED_TYPES]


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
