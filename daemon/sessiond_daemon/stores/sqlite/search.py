"""SQLite's full-text index and query: the FTS5 table of the search read model (its rule:
stores/models/search_text.py; the store indexes what its commits left, `index_range`,
store.py INDEX_LAG_EVENTS), and session.search's SQL.

The index (`search`) is an FTS5 table whose external content is the view
`search_source`, one row per event of an indexed type (rowid = position), with two columns
computed from the event by `text_of` (registered in SQLite as `sessiond_search_text`, so
the view, the writer and a rebuild compute the same text):
  body: message content, the task, errors;
  tags: tool_call_id, actor, model, adapter and metadata values.
Messages taken out of a conversation (message.pop, message.clear) stay searchable, as
history: their hits say `current: false`.
"""

from __future__ import annotations

import re
import sqlite3
import time
from collections.abc import Awaitable, Callable
from typing import Any, Final, Protocol, TypeVar

import anyio
import msgspec
import structlog

from sessiond_daemon.stores.interface import SearchBudget, SearchQuery, SqlAccess
from sessiond_daemon.stores.models import search as model
from sessiond_daemon.stores.models import snippet
from sessiond_daemon.stores.models.conversation import relink
from sessiond_daemon.stores.models.search_text import INDEXED_TYPES, text_of
from sessiond_daemon.stores.models.unicode61 import tokens
from sessiond_daemon.stores.rows import EVENT_COLUMNS, event_from_row
from sessiond_daemon.stores.sqlite import executor
from sessiond_daemon.stores.sqlite.migrations import INDEXED_UPTO, SEARCH_FUNCTION
from sessiond_schemas.errors import InvalidParamsError, SessiondError, StorageError
from sessiond_schemas.rpc import SearchHit, SearchResult

# The index's text function and migration 4 (the view, the index, its backfill) are in
# migrations.py, the SQLite schema.
FUNCTION: Final = SEARCH_FUNCTION
_TYPES_SQL: Final = ", ".join(f"'{t}'" for t in INDEXED_TYPES)

log = structlog.get_logger("sessiond.search")
_decode = msgspec.json.Decoder(dict[str, Any])
_json = msgspec.json.Encoder()
T = TypeVar("T")


# The last event's texts. The view asks for an event's body, then for its tags: two calls
# with the same arguments, the second answered from here instead of decoding the data
# again (a quarter of the catch-up's CPU per event: bench/README, "Less Python per
# append"). One event's worth is held, in one tuple replaced whole, so a connection's
# thread never reads one event's key with another event's texts; and only an event of
# up to MEMO_MAX_BYTES, so that no large event stays in memory after its indexing.
MEMO_MAX_BYTES: Final = 64 * 1024
_last: list[tuple[str, bytes | str, tuple[str | None, str | None]] | None] = [None]


def _sql_text(column: int, event_type: str, data: bytes | str) -> str | None:
    last = _last[0]
    if (last is not None and last[0] == event_type and type(last[1]) is type(data)
            and last[1] == data):
        return last[2][column]
    try:
        texts = text_of(event_type, _decode.decode(data))
    except (msgspec.DecodeError, AttributeError, TypeError):
        texts = (None, None)
    if len(data) <= MEMO_MAX_BYTES:
        _last[0] = (event_type, data, texts)
    return texts[column]


def register(con: sqlite3.Connection) -> None:
    """Make the index's text function known to a connection (before it touches the index)."""
    con.create_function(FUNCTION, 3, _sql_text, deterministic=True)


async def register_async(db: Any) -> None:
    """register() for an aiosqlite connection."""
    await db.create_function(FUNCTION, 3, _sql_text, deterministic=True)


# --- the writer's side (inside the batch transaction; the rows are the rule's ops) ----


def forget_session(db: sqlite3.Connection, session_id: str) -> None:
    """Take a session's events out of the index (before its events are deleted): an
    external-content index is told the text it indexed, which the view recomputes. Only
    rows it holds: telling it of another would corrupt it (a reindex may be under way)."""
    db.execute(
        "INSERT INTO search (search, rowid, body, tags) SELECT 'delete', position, body, tags"
        " FROM search_source WHERE position IN (SELECT position FROM events"
        f" WHERE session_id = ? AND type IN ({_TYPES_SQL}))"
        " AND position IN (SELECT id FROM search_docsize)", (session_id,))


def forget_trimmed(db: sqlite3.Connection, session_id: str, version: int) -> None:
    """Take a session's events up to `version` out of the index (retention's trim, before
    those events are deleted), as forget_session does for all of them."""
    db.execute(
        "INSERT INTO search (search, rowid, body, tags) SELECT 'delete', position, body, tags"
        " FROM search_source WHERE position IN (SELECT position FROM events"
        f" WHERE session_id = ? AND version <= ? AND type IN ({_TYPES_SQL}))"
        " AND position IN (SELECT id FROM search_docsize)", (session_id, version))


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


def index_range(db: sqlite3.Connection, after: int, upto: int) -> None:
    """Index the events with after < position <= upto that the index does not hold (the
    catch-up of the commits' positions: a look-up by rowid each, so the cost is the
    range's, never the index's size)."""
    db.execute("INSERT INTO search (rowid, body, tags) SELECT position, body, tags"
               " FROM search_source WHERE position > ? AND position <= ? AND NOT EXISTS"
               " (SELECT 1 FROM search_docsize WHERE id = position)", (after, upto))


def piece_end(db: sqlite3.Connection, after: int, upto: int, max_bytes: int) -> tuple[int, int]:
    """Where a piece of the catch-up starting past `after` ends (<= `upto`), so that its
    events of indexed types hold at most `max_bytes` of data (at least one event), and
    those bytes. Reads the sizes only (length() of a blob reads none of its pages)."""
    total = 0
    cur = db.execute(f"SELECT position, length(data) FROM events WHERE position > ? AND"
                     f" position <= ? AND type IN ({_TYPES_SQL}) ORDER BY position",
                     (after, upto))
    try:
        for position, size in cur:
            if total and total + size > max_bytes:
                return int(position) - 1, total
            total += int(size)
    finally:
        cur.close()
    return upto, total


def count(db: sqlite3.Connection) -> int:
    return int(db.execute("SELECT COUNT(*) FROM search_docsize").fetchone()[0])


def relink_forks(con: sqlite3.Connection) -> int:
    """The fork links again, from the session.forked events (the forks rule's ops)."""
    cur = con.execute(f"SELECT {EVENT_COLUMNS} FROM events"
                      " WHERE type = 'session.forked' ORDER BY position")
    first = True
    while (rows := cur.fetchmany(500)) or first:
        executor.run(con, relink([event_from_row(r) for r in rows], first=first))
        first = False
    return int(con.execute("SELECT COUNT(*) FROM forks").fetchone()[0])


def problems(db: sqlite3.Connection) -> list[str]:
    """What daemon.verify finds wrong with the index: an event of an indexed type missing
    from it, up to the mark it has caught up to (those past it, committed meanwhile, are
    not missing yet), or an entry whose event is gone."""
    missing = db.execute(
        "SELECT COUNT(*), MIN(position) FROM search_source WHERE position <= (SELECT"
        f" CAST(value AS INTEGER) FROM meta WHERE key = '{INDEXED_UPTO}') AND position NOT IN"
        " (SELECT id FROM search_docsize)").fetchone()
    extra = db.execute("SELECT COUNT(*), MIN(id) FROM search_docsize WHERE id NOT IN"
                       " (SELECT position FROM search_source)").fetchone()
    return model.problems(missing, extra)


class Lane(Protocol):
    """Runs a function on the search lane's connection, on its thread."""

    async def __call__(self, fn: Callable[[sqlite3.Connection], T], /) -> T: ...


class FullText:
    """The `full_text` capability of the SQLite store: these functions on its
    connections (the search lane's thread for the query, the writer's for the rest).
    Each read of the index first has the store index what its commits left out
    (`catch_up`), so it sees every acknowledged write. When that cannot be written (a full
    disk, as writes then fail too), reads go on with the index as it stands, and verify
    says what waits.

    Queries run on a read connection of their own, the search lane (`lane`), one at a
    time: the other reads never wait behind a search. A query waiting for the lane waits
    here, where its client's leaving or its time running out ends the wait."""

    def __init__(self, sql: SqlAccess, catch_up: Callable[[], Awaitable[None]],
                 lane: Lane) -> None:
        self.sql = sql
        self.catch_up = catch_up
        self.lane = lane
        self._busy = anyio.Lock()

    async def _caught_up(self) -> str | None:
        """Catch the index up; what stopped it, if something did."""
        try:
            await self.catch_up()
        except SessiondError as exc:
            log.warning("search.index_behind", error=exc.message)
            return exc.message
        return None

    async def search(self, q: SearchQuery, budget: SearchBudget) -> SearchResult:
        deadline = time.monotonic() + budget.timeout_s  # its waits count
        # The catch-up goes on without it (a step at a time, between the writer's
        # batches) when its time runs out first.
        with anyio.move_on_after(budget.timeout_s) as waited:
            await self._caught_up()
        if waited.cancelled_caught:
            raise stopped("search_timeout_s", budget)
        try:
            await self._take_lane(budget, deadline)
            try:
                return await self.lane(lambda con: query(con, q, budget, deadline))
            finally:
                self._busy.release()
        finally:
            # Cancelled (the client went, the daemon stops): the query on the lane's
            # thread stops at its next progress call instead of running on.
            budget.stop.set()

    async def _take_lane(self, budget: SearchBudget, deadline: float) -> None:
        while True:
            with anyio.move_on_after(_POLL_S):
                await self._busy.acquire()
                return
            if (why := _why(budget, deadline)) is not None:
                raise stopped(why, budget)

    async def clear(self) -> int:
        return await self.sql.on_writer(clear)

    async def rebuild_range(self, after: int, upto: int) -> None:
        await self.sql.on_writer(lambda con: rebuild_range(con, after, upto))

    async def relink_forks(self) -> int:
        return await self.sql.on_writer(relink_forks)

    async def count(self) -> int:
        await self._caught_up()
        return await self.sql.on_reader(count)

    async def problems(self) -> list[str]:
        behind = await self._caught_up()
        found = await self.sql.on_reader(problems)
        if behind is not None:
            found.append(f"search index: the latest events are not indexed yet ({behind})")
        return found


# --- the query (one read connection, one read transaction) -----------------------------


def _bad_query(exc: sqlite3.OperationalError) -> InvalidParamsError | None:
    text = str(exc)
    if text.startswith(("fts5:", "no such column", "unknown special query", "unterminated")):
        return InvalidParamsError(f"query is not a valid search: {text}",
                                  {"detail": text, "path": "$.query"})
    return None


_STEPS: Final = 1000  # VM instructions between two calls of the progress handler
_POLL_S: Final = 0.05  # how often a query waiting for the lane looks at its budget


def _why(budget: SearchBudget, deadline: float) -> str | None:
    """What ends a query now, if anything: its time, or its client gone."""
    if time.monotonic() > deadline:
        return "search_timeout_s"
    if budget.stop.is_set() or budget.gone():
        return "client gone"
    return None


class _Watch:
    """The budget's progress handler on a connection (on its own thread, where the query
    runs), and the same checks for the Python work between statements (`check`)."""

    def __init__(self, con: sqlite3.Connection, budget: SearchBudget, deadline: float) -> None:
        self.budget, self.deadline = budget, deadline
        self.steps = 0
        self.why: str | None = None
        con.set_progress_handler(self._progress, _STEPS)

    def _progress(self) -> int:
        self.steps += _STEPS
        if self.steps > self.budget.max_steps:
            self.why = "search_max_steps"
        elif time.monotonic() > self.deadline:
            self.why = "search_timeout_s"
        elif self.budget.stop.is_set() or (
                self.steps % (_STEPS * 16) == 0 and self.budget.gone()):
            self.why = "client gone"
        return 1 if self.why else 0

    def check(self) -> None:
        """Stop the query (-32012) when its time has run out or its client went."""
        self.why = self.why or _why(self.budget, self.deadline)
        if self.why is not None:
            raise stopped(self.why, self.budget)


def stopped(why: str, budget: SearchBudget) -> SessiondError:
    """The error of a query its budget stopped (`why`: the setting, or "client gone")."""
    if why == "client gone":
        return StorageError("search stopped: its client went away", {"detail": why})
    limit = budget.max_steps if why == "search_max_steps" else budget.timeout_s
    what = "SQLite steps" if why == "search_max_steps" else "seconds"
    return StorageError(
        f"search stopped: it passed {why} ({limit} {what}); narrow the query (fewer or"
        " longer prefixes, more words, filters)",
        {"detail": "over the search budget", "setting": why, "limit": limit})


# What FTS5 keeps of its index (its file format, stable across SQLite versions): each
# segment's leaf pages are rows of `search_data`, keyed (segment << 37) + page; a leaf
# page is a 4-byte header (the second u16: where its footer starts), its terms and
# doclists, then the footer, a varint per term that starts on the page (its offset, then
# deltas); the first term is stored whole (varint length, bytes), the next ones after the
# bytes they share with the one before (varint shared, varint length, bytes). A long
# doclist runs on into pages that start no term. `search_idx` holds, per segment, for
# each page that starts a term, a prefix of that first term ('0' first: the main index)
# and (page << 1) | a flag.
_SEGMENT: Final = 37
_LEAVES: Final = 1 << 31
ENTRY_BYTES: Final = 4  # a doclist's bytes per (event, word), about: rowid delta, positions


def _varint(block: bytes, at: int) -> tuple[int, int]:
    value = 0
    for i in range(9):
        byte = block[at + i]
        if i == 8:
            return (value << 8) | byte, at + 9
        value = (value << 7) | (byte & 0x7F)
        if byte < 0x80:
            return value, at + i + 1
    raise AssertionError("unreachable")


def _terms(con: sqlite3.Connection, segment: int, page: int) -> list[tuple[bytes, int, int]]:
    """The terms that start on a leaf page: each with where its data starts and stops."""
    row = con.execute("SELECT block FROM search_data WHERE id = ?",
                      ((segment << _SEGMENT) + page,)).fetchone()
    if row is None or len(row[0]) < 4:
        return []
    block = bytes(row[0])
    footer = int.from_bytes(block[2:4], "big")
    at, offsets, offset = footer, [], 0
    terms: list[tuple[bytes, int, int]] = []
    try:
        while at < len(block):
            delta, at = _varint(block, at)
            offset += delta
            offsets.append(offset)
        term = b""
        for i, start in enumerate(offsets):
            shared, at = _varint(block, start) if i else (0, start)
            size, at = _varint(block, at)
            term = term[:shared] + block[at:at + size]
            terms.append((term, start, offsets[i + 1] if i + 1 < len(offsets) else footer))
    except IndexError:
        return []
    return terms


def prefix_matches(con: sqlite3.Connection, words: list[str]) -> int:
    """About how many (event, word) entries the index holds for the words starting with
    `words` (prefixes), from the bytes their doclists fill: per segment and prefix, four
    seeks in `search_idx` and two pages read, whatever the doclists' size (reading them,
    as fts5vocab does, costs what the query would)."""
    if not words:
        return 0
    row = con.execute("SELECT v FROM search_config WHERE k = 'pgsz'").fetchone()
    page_bytes = int(row[0]) if row else 4050  # FTS5's default page size
    segments: list[tuple[int, int]] = []
    segment = -1
    while (row := con.execute("SELECT segid FROM search_idx WHERE segid > ? ORDER BY segid"
                              " LIMIT 1", (segment,)).fetchone()) is not None:
        segment = int(row[0])
        first = segment << _SEGMENT
        last = con.execute("SELECT MAX(id) FROM search_data WHERE id >= ? AND id < ?",
                           (first, first + _LEAVES)).fetchone()[0]
        segments.append((segment, int(last or first) - first))

    def page(segment: int, sql: str, term: bytes) -> int | None:
        row = con.execute(f"SELECT pgno FROM search_idx WHERE segid = ? AND term {sql}"
                          " LIMIT 1", (segment, term)).fetchone()
        return None if row is None else int(row[0]) >> 1

    size = 0
    for word in words:
        lo = b"0" + word.encode()
        hi = lo[:-1] + bytes([lo[-1] + 1])  # UTF-8 has no 0xFF byte
        for segment, last in segments:
            # before: the last page whose first term is below the prefix; inside: the
            # first whose first term has it, upto: the last; after: the first above it.
            # The pages between two that start a term hold the doclist of the first one's
            # last term: counted whole when it has the prefix.
            before = page(segment, "< ? ORDER BY term DESC", lo)
            upto = page(segment, "< ? ORDER BY term DESC", hi)
            after = page(segment, ">= ? ORDER BY term", hi)
            end = last + 1 if after is None else after
            inside = page(segment, ">= ? ORDER BY term", lo) if upto != before else None
            if inside is not None and upto is not None and inside > upto:
                inside, end = None, upto  # `upto` starts past the prefix (a short key)
            for start, stop in ((before, end if inside is None else inside),
                                (None if inside is None else upto, end)):
                if start is None:
                    continue
                terms = _terms(con, segment, start)
                size += sum(b - a for t, a, b in terms if lo <= t < hi)
                if terms and lo <= terms[-1][0] < hi:  # its doclist runs on to `stop`
                    size += (stop - start - 1) * page_bytes
            if inside is not None and upto is not None:
                size += (upto - inside) * page_bytes  # pages inside..upto-1, whole
    return size // ENTRY_BYTES


def query(con: sqlite3.Connection, q: SearchQuery, budget: SearchBudget | None = None,
          deadline: float | None = None) -> SearchResult:
    """Sessions whose events match `q.text`, best first, each with its best hits.

    The cost is bounded: only the newest `window` matching events (after the filters)
    are ranked. They are found by walking back through the positions in ranges that
    double (2 x window positions first), each read forward, as FTS5 reads doclists best
    (a descending walk of a long doclist costs its whole length); then ranked by bm25 and
    grouped by session (stores/models/search.py). Snippets are cut for this page's hits
    only, within the budget too (`_snippets`)."""
    where, args = ["search MATCH ?"], [q.text]  # type: tuple[list[str], list[Any]]
    joins = " FROM search f JOIN events e ON e.position = f.rowid"
    session_where: list[str] = []
    for column, value in (("s.namespace", q.namespace), ("s.actor_name", q.actor_name)):
        if value is not None:
            session_where.append(f"{column} = ?")
            args.append(value)
    if q.statuses:
        session_where.append(f"s.status IN ({', '.join('?' * len(q.statuses))})")
        args.extend(q.statuses)
    if session_where:  # the sessions table only when a filter needs it
        joins += " JOIN sessions s ON s.session_id = e.session_id"
        where += session_where
    for op, value in ((">=", q.since), ("<", q.until)):
        if value is not None:
            where.append(f"e.recorded_at {op} ?")
            args.append(value)
    budget = budget or SearchBudget()
    con.execute("BEGIN")  # one snapshot for the estimate, the ranking and the snippets
    watch = _Watch(con, budget, deadline if deadline is not None
                   else time.monotonic() + budget.timeout_s)
    try:
        # A prefix merges all its words' doclists, whatever the LIMIT: refused up front
        # when they are too long, in a few index seeks.
        if (found := prefix_matches(con, model.prefixes(q.text))) > budget.max_prefix_matches:
            raise model.too_broad(found, budget.max_prefix_matches)
        return _ranked(con, joins + " WHERE " + " AND ".join(where), args, q, watch)
    except sqlite3.OperationalError as exc:
        reason = watch.why
        if reason is not None:
            raise stopped(reason, budget) from exc
        bad = _bad_query(exc)
        if bad is not None:
            raise bad from exc
        raise
    finally:
        con.set_progress_handler(None, 0)
        con.execute("COMMIT")


# FTS5's snippet() scores a window at each match by looking at every match of the
# document: its cost grows with the square of the matches, in one call the progress
# handler cannot stop (262,144 matches: minutes). It cuts the snippets of documents
# whose tokens times the query's tokens are at most this (about 30 ms at worst, measured
# in bench/README "Search snippets and the index's catch-up"); the daemon cuts the others
# (models/snippet.py).
SNIPPET_FTS_MATCHES: Final = 512


def _ranked(con: sqlite3.Connection, matched: str, args: list[Any],
            q: SearchQuery, watch: _Watch) -> SearchResult:
    """The query's page: ranked on (position, session_id, score) only; the events, their
    snippets and views are read for the page's hits alone."""
    rows, complete = _newest(con, matched, args, q.window)
    ranked = model.rank(rows, q.after, q.limit, q.hits)
    hits: dict[int, SearchHit] = {}
    if ids := ranked.chosen:
        words = model.words(q.text)
        # every token of the query (operators, repeats too) may be a phrase of its own
        small = _small(con, ids, max(1, len(tokens(q.text))))
        # One walk over the hits' range (a prefix's doclists are merged once, not once
        # per hit); `+rowid` keeps the IN out of FTS5, so that snippets are cut only
        # for the chosen rows, and by FTS5 only for the small ones (CASE evaluates its
        # THEN only when its WHEN holds).
        # The message fields of the hits, never their whole event (a message may
        # be 16 MiB, and a page may show 2,000 hits).
        found = con.execute(
            "SELECT f.rowid, e.version, e.type, e.recorded_at,"
            " json_extract(e.data, '$.sequence'), json_extract(e.data, '$.role'),"
            " CASE WHEN +f.rowid IN (SELECT value FROM json_each(?)) THEN"
            f" substr(snippet(search, -1, ?, ?, '\u2026', 12), 1, {model.SNIPPET_CHARS}) END,"
            " e.session_id FROM search f JOIN events e"
            " ON e.position = f.rowid WHERE search MATCH ? AND f.rowid >= ?"
            " AND f.rowid <= ? AND +f.rowid IN (SELECT value FROM json_each(?))",
            (_json.encode(small), *q.mark, q.text, ids[0], ids[-1],
             _json.encode(ids))).fetchall()
        pattern = snippet.pattern(words)
        for row in found:
            watch.check()  # between hits: the Python work below is outside the handler
            text = row[6] if row[6] is not None else _cut(con, row[0], pattern, q.mark)
            current = (_current(con, row[7], row[0], row[4])
                       if row[2] == "message.appended" else None)
            hits[row[0]] = model.hit(row[0], row[1], row[2], row[3], row[4], row[5], text,
                                     current)
    page = ranked.page
    views = {r[0]: r[1:] for r in con.execute(
        "SELECT session_id, status, namespace, actor_name, task, updated_at FROM sessions"
        f" WHERE session_id IN ({', '.join('?' * len(page))})", tuple(ranked.best))} if page else {}
    return model.result(ranked, hits, views, complete)


def _small(con: sqlite3.Connection, ids: list[int], words: int) -> list[int]:
    """The hits whose snippet FTS5 may cut (SNIPPET_FTS_MATCHES), from the documents'
    token counts (`search_docsize`: a varint per column)."""
    small = []
    for position, sizes in con.execute(
            "SELECT id, sz FROM search_docsize WHERE id IN (SELECT value FROM json_each(?))",
            (_json.encode(ids),)):
        block, at, tokens = bytes(sizes), 0, 0
        while at < len(block):
            size, at = _varint(block, at)
            tokens += size
        if tokens * words <= SNIPPET_FTS_MATCHES:
            small.append(position)
    return small


def _cut(con: sqlite3.Connection, position: int, pattern: re.Pattern[str] | None,
         mark: tuple[str, str]) -> str:
    """A large document's snippet, cut by the daemon from its text (models/snippet.py)."""
    row = con.execute("SELECT body, tags FROM search_source WHERE position = ?",
                      (position,)).fetchone()
    texts = (None, None) if row is None else (row[0], row[1])
    return snippet.cut(texts, pattern, mark)[:model.SNIPPET_CHARS]


def _current(con: sqlite3.Connection, sid: str, position: int, sequence: int | None) -> bool:
    row = con.execute("SELECT position FROM messages WHERE session_id = ? AND sequence = ?",
                      (sid, sequence)).fetchone()
    return row is not None and row[0] == position


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
