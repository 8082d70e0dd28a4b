"""Full-text search: the FTS5 index of session text, kept in the writer's transaction, and
the session.search query.

The index (`search`) is a read model of the events: an FTS5 table whose external content
is the view `search_source`, one row per event of an indexed type (rowid = position),
with two columns computed from the event by `text_of` (registered in SQLite as
`sessiond_search_text`, so the view, the writer and a rebuild compute the same text):
  body: message content, the task, errors;
  tags: tool_call_id, actor, model, adapter and metadata values.
Messages taken out of a conversation (message.pop, message.clear) stay searchable, as
history: their hits say `current: false`.
"""

from __future__ import annotations

import base64
import re
import sqlite3
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from sessiond_schemas.errors import InvalidParamsError, SessiondError, StorageError
from sessiond_schemas.events import Data, Event, Record, Unread
from sessiond_schemas.rpc import SearchHit, SearchResult, SearchSession

from .eventstore import Batch, SqlAccess, Store

FUNCTION: Final = "sessiond_search_text"
INDEXED_TYPES: Final = ("message.appended", "session.created", "session.forked",
                        "metadata.updated", "session.status_changed", "result.recorded",
                        "problem.recorded")
_TYPES_SQL: Final = ", ".join(f"'{t}'" for t in INDEXED_TYPES)

# Migration 4's statements (daemon/sessiond_daemon/migrations.py): the view, the index,
# and its backfill from the events already stored.
MIGRATION: Final[list[str]] = [
    f"""CREATE VIEW search_source AS SELECT position,
        {FUNCTION}(0, type, data) AS body, {FUNCTION}(1, type, data) AS tags
        FROM events WHERE type IN ({_TYPES_SQL})""",
    # No prefix index: prefix='2 3' made a common 3-letter prefix 15x faster (B13) but
    # cost about 30 us per appended message, past the 10% the appends may pay (B13a).
    """CREATE VIRTUAL TABLE search USING fts5(body, tags, content='search_source',
        content_rowid='position', tokenize='unicode61 remove_diacritics 2')""",
    "INSERT INTO search(search) VALUES ('rebuild')",
]

_decode = msgspec.json.Decoder(dict[str, Any])
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


def text_of(event_type: str, data: dict[str, Any] | Data) -> tuple[str | None, str | None]:
    """(body, tags) of one event: what the index holds for it (its data as decoded JSON,
    or typed: Event.data)."""
    meta: list[str] = []
    if isinstance(data, (Record, Unread)):
        data = data.body if isinstance(data.body, dict) else {}
    if event_type == "message.appended":
        _values(data.get("metadata", {}), meta)
        return data.get("content"), _join(data.get("tool_call_id"), *meta)
    if event_type in ("session.created", "session.forked"):
        d = data.get("state", {}) if event_type == "session.forked" else data
        if not isinstance(d, (dict, Data)):
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


def _sql_text(column: int, event_type: str, data: bytes | str) -> str | None:
    try:
        return text_of(event_type, _decode.decode(data))[column]
    except (msgspec.DecodeError, AttributeError, TypeError):
        return None


def register(con: sqlite3.Connection) -> None:
    """Make the index's text function known to a connection (before it touches the index)."""
    con.create_function(FUNCTION, 3, _sql_text, deterministic=True)


async def register_async(db: Any) -> None:
    """register() for an aiosqlite connection."""
    await db.create_function(FUNCTION, 3, _sql_text, deterministic=True)


def sql_of(store: Store) -> SqlAccess:
    """The SQLite connections of a store, where the index lives."""
    caps = store.capabilities
    if caps.sql is None or caps.engine != "sqlite":
        raise StorageError(
            f"full-text search (session.search, daemon.reindex) is not available on"
            f" {'PostgreSQL' if caps.engine == 'postgresql' else caps.engine} yet: its index is"
            " built by the SQLite store only (README.md); every other method is served",
            {"detail": "no search index", "engine": caps.engine})
    return caps.sql


# --- the writer's side (inside the batch transaction) --------------------------------------


def project(db: sqlite3.Connection, batch: Batch) -> None:
    """The store's projection (sqlite/store.py PROJECTIONS): index the batch's events."""
    index(db, batch.events)


def index(db: sqlite3.Connection, events: list[Event]) -> None:
    """Add a batch's events of indexed types to the index."""
    rows = []
    for e in events:
        if e.type in INDEXED_TYPES:
            body, tags = text_of(e.type, e.data)
            rows.append((e.position, body, tags))
    if rows:
        db.executemany("INSERT INTO search (rowid, body, tags) VALUES (?, ?, ?)", rows)


def forget_session(db: sqlite3.Connection, session_id: str) -> None:
    """Take a session's events out of the index (before its events are deleted): an
    external-content index is told the text it indexed, which the view recomputes. Only
    rows it holds: telling it of another would corrupt it (a reindex may be under way)."""
    db.execute(
        "INSERT INTO search (search, rowid, body, tags) SELECT 'delete', position, body, tags"
        " FROM search_source WHERE position IN (SELECT position FROM events"
        f" WHERE session_id = ? AND type IN ({_TYPES_SQL}))"
        " AND position IN (SELECT id FROM search_docsize)", (session_id,))


def rebuild(db: sqlite3.Connection) -> int:
    """Rebuild the whole index from the events in one statement; return its row count."""
    db.execute("INSERT INTO search (search) VALUES ('rebuild')")
    return int(db.execute("SELECT COUNT(*) FROM search_docsize").fetchone()[0])


def clear(db: sqlite3.Connection) -> int:
    """Empty the index (the first step of daemon.reindex); return the last position, up to
    which rebuild_range must then be run (the writer indexes what comes after)."""
    db.execute("INSERT INTO search (search) VALUES ('delete-all')")
    return int(db.execute("SELECT COALESCE(MAX(position), 0) FROM events").fetchone()[0])


def rebuild_range(db: sqlite3.Connection, after: int, upto: int) -> None:
    """Index the events with after < position <= upto that the index does not hold."""
    db.execute("INSERT INTO search (rowid, body, tags) SELECT position, body, tags"
               " FROM search_source WHERE position > ? AND position <= ?"
               " AND position NOT IN (SELECT id FROM search_docsize)", (after, upto))


def count(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT COUNT(*) FROM search_docsize").fetchone()[0])


def problems(db: sqlite3.Connection) -> list[str]:
    """What daemon.verify finds wrong with the index: an event of an indexed type missing
    from it, or an entry whose event is gone."""
    found = []
    missing = db.execute("SELECT COUNT(*), MIN(position) FROM search_source WHERE position"
                         " NOT IN (SELECT id FROM search_docsize)").fetchone()
    if missing[0]:
        found.append(f"search index: {missing[0]} events are not indexed (first at position"
                     f" {missing[1]}); run `sessionctl reindex`")
    extra = db.execute("SELECT COUNT(*), MIN(id) FROM search_docsize WHERE id NOT IN"
                       " (SELECT position FROM search_source)").fetchone()
    if extra[0]:
        found.append(f"search index: {extra[0]} entries have no event (first at position"
                     f" {extra[1]}); run `sessionctl reindex`")
    return found


# --- the query (one read connection, one read transaction) -----------------------------


def _encode_cursor(score: float, session_id: str) -> str:
    return base64.urlsafe_b64encode(_json.encode([score, session_id])).decode()


def _decode_cursor(cursor: str) -> tuple[float, str]:
    try:
        score, sid = msgspec.json.decode(base64.urlsafe_b64decode(cursor.encode()),
                                         type=tuple[float, str])
    except (ValueError, msgspec.DecodeError) as exc:
        raise InvalidParamsError("`cursor` is not a cursor session.search returned",
                                 {"detail": str(exc), "path": "$.cursor"}) from exc
    return score, sid


def _bad_query(exc: sqlite3.OperationalError) -> InvalidParamsError | None:
    text = str(exc)
    if text.startswith(("fts5:", "no such column", "unknown special query", "unterminated")):
        return InvalidParamsError(f"query is not a valid search: {text}",
                                  {"detail": text, "path": "$.query"})
    return None


WINDOW: Final = 5_000  # matching events ranked per query, newest first
SNIPPET_CHARS: Final = 1_000  # a snippet is ~12 tokens; a token may be long: cut there


@dataclass(frozen=True)
class Budget:
    """What one query may cost (docs/reliability.md, "Budgets"): its terms and prefix
    terms, checked before it runs (-32602), and SQLite VM steps and seconds, counted by
    the progress handler while it runs (-32012); it also stops when its client goes."""

    max_terms: int = 64
    max_prefixes: int = 8
    max_steps: int = 500_000_000
    timeout_s: float = 10.0
    gone: Callable[[], bool] = lambda: False
    stop: threading.Event = field(default_factory=threading.Event)


_OPERATORS: Final = frozenset({"AND", "OR", "NOT", "NEAR"})
_TERM = re.compile(r"\w+\*?")


def check_terms(text: str, budget: Budget) -> None:
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


_STEPS: Final = 1000  # VM instructions between two calls of the progress handler


def _watch(con: sqlite3.Connection, budget: Budget) -> Callable[[], str | None]:
    """Install the budget's progress handler on `con` (on its own thread, where the query
    runs); return what stopped the query, if anything did."""
    deadline = time.monotonic() + budget.timeout_s
    state = {"steps": 0, "why": None}  # type: dict[str, Any]

    def progress() -> int:
        state["steps"] += _STEPS
        if state["steps"] > budget.max_steps:
            state["why"] = "search_max_steps"
        elif time.monotonic() > deadline:
            state["why"] = "search_timeout_s"
        elif budget.stop.is_set() or (state["steps"] % (_STEPS * 16) == 0 and budget.gone()):
            state["why"] = "client gone"
        return 1 if state["why"] else 0

    con.set_progress_handler(progress, _STEPS)
    return lambda: state["why"]


def _stopped(why: str, budget: Budget) -> SessiondError:
    if why == "client gone":
        return StorageError("search stopped: its client went away", {"detail": why})
    limit = budget.max_steps if why == "search_max_steps" else budget.timeout_s
    what = "SQLite steps" if why == "search_max_steps" else "seconds"
    return StorageError(
        f"search stopped: it passed {why} ({limit} {what}); narrow the query (fewer or"
        " longer prefixes, more words, filters)",
        {"detail": "over the search budget", "setting": why, "limit": limit})


def query(con: sqlite3.Connection, *, text: str, statuses: tuple[str, ...],
          namespace: str | None, actor_name: str | None, since: str | None,
          until: str | None, limit: int, hits: int, mark: tuple[str, str],
          cursor: str | None, window: int = WINDOW,
          budget: Budget | None = None) -> SearchResult:
    """Sessions whose events match `text`, best first, each with its best hits.

    The cost is bounded: only the newest `window` matching events (after the filters)
    are ranked. They are found by walking back through the positions in ranges that
    double (2 x window positions first), each read forward, as FTS5 reads doclists best
    (a descending walk of a long doclist costs its whole length); then ranked by bm25 and
    grouped by session here. Snippets are cut for this page's hits only."""
    where, args = ["search MATCH ?"], [text]  # type: tuple[list[str], list[Any]]
    joins = " FROM search f JOIN events e ON e.position = f.rowid"
    session_where: list[str] = []
    for column, value in (("s.namespace", namespace), ("s.actor_name", actor_name)):
        if value is not None:
            session_where.append(f"{column} = ?")
            args.append(value)
    if statuses:
        session_where.append(f"s.status IN ({', '.join('?' * len(statuses))})")
        args.extend(statuses)
    if session_where:  # the sessions table only when a filter needs it
        joins += " JOIN sessions s ON s.session_id = e.session_id"
        where += session_where
    for op, value in ((">=", since), ("<", until)):
        if value is not None:
            where.append(f"e.recorded_at {op} ?")
            args.append(value)
    after = _decode_cursor(cursor) if cursor is not None else None
    budget = budget or Budget()
    check_terms(text, budget)
    stopped = _watch(con, budget)
    con.execute("BEGIN")  # one snapshot for the ranking and the snippets
    try:
        return _ranked(con, joins + " WHERE " + " AND ".join(where), args, window, after,
                       text, limit, hits, mark)
    except sqlite3.OperationalError as exc:
        why = stopped()
        if why is not None:
            raise _stopped(why, budget) from exc
        bad = _bad_query(exc)
        if bad is not None:
            raise bad from exc
        raise
    finally:
        con.set_progress_handler(None, 0)
        con.execute("COMMIT")


def _ranked(con: sqlite3.Connection, matched: str, args: list[Any], window: int,
            after: tuple[float, str] | None, text: str, limit: int, hits: int,
            mark: tuple[str, str]) -> SearchResult:
    """The query's page: ranked on (position, session_id, score) only; the events, their
    snippets and views are read for the page's hits alone."""
    rows, complete = _newest(con, matched, args, window)
    by_session: dict[str, list[tuple[float, int]]] = {}
    for position, sid, rank in rows:
        by_session.setdefault(sid, []).append((rank, position))
    ranked = sorted((min(found)[0], sid) for sid, found in by_session.items())
    if after is not None:
        ranked = [r for r in ranked if r > after]
    page = ranked[:limit]
    best = {sid: [p for _, p in sorted(by_session[sid])[:hits]] for _, sid in page}
    chosen = {p for ps in best.values() for p in ps}
    cut: dict[int, tuple[Any, ...]] = {}
    if chosen:
        # One walk over the hits' range (a prefix's doclists are merged once, not once
        # per hit); `+rowid` keeps the IN out of FTS5, so that snippets are cut only
        # for the chosen rows.
        ids = sorted(chosen)
        # The message fields of the hits, never their whole event (a message may
        # be 16 MiB, and a page may show 2,000 hits).
        for row in con.execute(
                "SELECT f.rowid, e.version, e.type, e.recorded_at,"
                " json_extract(e.data, '$.sequence'), json_extract(e.data, '$.role'),"
                f" substr(snippet(search, -1, ?, ?, '\u2026', 12), 1, {SNIPPET_CHARS})"
                " FROM search f JOIN events e"
                " ON e.position = f.rowid WHERE search MATCH ? AND f.rowid >= ?"
                " AND f.rowid <= ? AND +f.rowid IN (SELECT value FROM json_each(?))",
                (*mark, text, ids[0], ids[-1], _json.encode(ids))):
            cut[row[0]] = row
    views = {r[0]: r[1:] for r in con.execute(
        "SELECT session_id, status, namespace, actor_name, task, updated_at FROM sessions"
        f" WHERE session_id IN ({', '.join('?' * len(page))})", tuple(best))} if page else {}
    found = [SearchSession(
        session_id=sid, status=views[sid][0], namespace=views[sid][1],
        actor_name=views[sid][2], task=views[sid][3], updated_at=views[sid][4],
        score=score, matches=len(by_session[sid]),
        hits=[_hit(con, sid, *cut[p]) for p in best[sid] if p in cut])
        for score, sid in page if sid in views]
    more = len(ranked) > limit
    return SearchResult(sessions=found, complete=complete,
                        next_cursor=_encode_cursor(page[-1][0], page[-1][1]) if more else None)


BROAD: Final = 10  # a query whose newest `window` matches lie in the last BROAD x window
# events matches a tenth of everything: bm25's idf is then near nothing, and FTS5 would
# count the query's rows over the whole index to compute it. Such queries rank by recency.


def _newest(con: sqlite3.Connection, matched: str, args: list[Any],
            window: int) -> tuple[list[tuple[int, str, float]], bool]:
    """(position, session_id, score) of the newest `window` matches, newest first, and
    whether those are all the matches. Score: bm25, or minus the position for a broad
    query (see BROAD)."""
    top = con.execute("SELECT COALESCE(MAX(rowid), 0) FROM search_docsize").fetchone()[0]
    select = "SELECT f.rowid, e.session_id" + matched
    rows: list[tuple[int, str]]
    if "*" in args[0]:
        # A prefix merges the doclists of all its terms whatever the range, so each range
        # would pay for all of them: one descending walk instead.
        rows = con.execute(select + " ORDER BY f.rowid DESC LIMIT ?",
                           (*args, window + 1)).fetchall()
    else:
        # Ranges that double, walking back from the newest event, each read forward (FTS5
        # reads a long doclist backwards only by reading all of it).
        rows, hi, span = [], top, 2 * window
        while True:  # at least once: FTS5 parses the query here, whatever the store holds
            lo = max(0, hi - span)
            found = con.execute(select + " AND f.rowid > ? AND f.rowid <= ?",
                                (*args, lo, hi)).fetchall()
            rows += sorted(found, reverse=True)
            if lo == 0 or len(rows) > window:
                break
            hi, span = lo, span * 2
    complete = len(rows) <= window
    rows = rows[:window]
    if not rows:
        return [], complete
    oldest = rows[-1][0]
    if not complete and top - oldest < BROAD * window:
        return [(pos, sid, float(-pos)) for pos, sid in rows], complete
    ranks = dict(con.execute("SELECT rowid, rank FROM search WHERE search MATCH ? AND rowid >= ?"
                             " AND rowid <= ?", (args[0], oldest, rows[0][0])).fetchall())
    return [(pos, sid, ranks[pos]) for pos, sid in rows], complete


def _hit(con: sqlite3.Connection, sid: str, position: int, version: int, event_type: str,
         recorded_at: str, sequence: int | None, role: str | None, snippet: str) -> SearchHit:
    current = None
    if event_type != "message.appended":
        sequence = role = None
    else:
        row = con.execute("SELECT position FROM messages WHERE session_id = ? AND sequence = ?",
                          (sid, sequence)).fetchone()
        current = row is not None and row[0] == position
    return SearchHit(position=position, version=version, type=event_type,
                     recorded_at=recorded_at, snippet=snippet, sequence=sequence, role=role,
                     current=current)


def storage_error(exc: sqlite3.Error) -> StorageError:
    return StorageError(f"storage error: {exc}", {"detail": str(exc)})
