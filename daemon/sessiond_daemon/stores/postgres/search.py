"""PostgreSQL's full-text index and query: the search read model (stores/models/search.py)
as a table with a tsvector column and a GIN index, kept in the batch transaction, and
session.search's SQL.

`search_index` holds one row per event of an indexed type (the rule's rows,
stores/models/search_text.py, the same as SQLite's), keyed by its position: the event's
session, the body and tags text (ts_headline cuts snippets from them) and `doc`, the
tsvector of both, which the GIN index covers.

The tsvector is built here, not by to_tsvector, so that a document holds the tokens
FTS5's unicode61 tokenizer would make (stores/models/unicode61.py: its token characters,
lower-cased, diacritics removed: `bash_3` is `bash` and `3`, `me/bot` is `me` and `bot`,
`ﬁle` is not `file`), and the query is parsed
here from the same FTS5 syntax (`to_tsquery_text`) into the same lexemes: the two stores
find the same events. The tags come first, then the body 128 positions on, with weights
B and A (a column filter `body:`/`tags:` is a weight; no phrase or NEAR spans the two).
Where PostgreSQL's limits differ (positions stop at 16,383, 256 positions per word, 1 MB
of distinct words per document) and how ranking differs from bm25: docs/protocol.md,
"Search on PostgreSQL".
"""

from __future__ import annotations

import itertools
import math
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

import anyio
import asyncpg
import msgspec

from sessiond_daemon.stores.interface import SearchBudget, SearchQuery
from sessiond_daemon.stores.models import search as model
from sessiond_daemon.stores.models.conversation import relink
from sessiond_daemon.stores.models.search_text import INDEXED_TYPES, text_of
from sessiond_daemon.stores.models.unicode61 import tokens
from sessiond_daemon.stores.postgres.errors import RETRYABLE, storage_error
from sessiond_daemon.stores.rows import EVENT_COLUMNS, event_from_row
from sessiond_schemas.errors import InvalidParamsError, StorageError
from sessiond_schemas.rpc import SearchHit, SearchResult

_TYPES: Final = list(INDEXED_TYPES)
_TYPES_SQL: Final = ", ".join(f"'{t}'" for t in INDEXED_TYPES)

# Migration 7's statements (postgres/schema.py); `backfill` then indexes the events stored
# (all of them idempotent: run again, they add nothing).
MIGRATION: Final[list[str]] = [
    """CREATE TABLE IF NOT EXISTS search_index (
        position BIGINT PRIMARY KEY,
        session_id TEXT COLLATE "C" NOT NULL,
        body TEXT,
        tags TEXT,
        doc TSVECTOR NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS search_index_doc ON search_index USING gin (doc)",
    # A session's deletion takes its rows (`forget`).
    "CREATE INDEX IF NOT EXISTS search_index_by_session ON search_index (session_id)",
]

# --- the tokens: unicode61's, as a tsvector literal ----------------------------------------

TAGS_AT: Final = 1
GAP: Final = 128  # positions between the tags and the body: more than NEAR's widest
MAX_NEAR: Final = GAP - 2
MAX_NEAR_WAYS: Final = 4_096  # placements a NEAR of three phrases or more may expand to
MAX_TSQUERY: Final = 1_000_000  # characters of tsquery one query may expand to
INITIAL: Final = "_"  # before a column's first token, indexed once more (`^`); no token
# has it ("_" separates tokens)
MAX_POSITION: Final = 16_383  # PostgreSQL's: later words all sit at this one
MAX_POSITIONS: Final = 256  # per word, PostgreSQL's
MAX_WORD_BYTES: Final = 2_046  # a longer word is not indexed (PostgreSQL cannot)
MAX_DOC_BYTES: Final = 900_000  # distinct words' bytes per document (PostgreSQL: < 1 MiB)
MAX_DEPTH: Final = 97  # nested parentheses: FTS5's parser (a 100-entry stack) refuses 98


def tsvector(body: str | None, tags: str | None) -> str:
    """The document's tsvector, as a literal: tags (weight B) from position 1, the body
    (weight A) GAP positions after the tags' last."""
    where: dict[str, list[str]] = {}
    size = 0
    tag_tokens = tokens(tags)
    for start, column, weight in ((TAGS_AT, tag_tokens, "B"),
                                  (TAGS_AT + len(tag_tokens) + GAP, tokens(body), "A")):
        if column and len(column[0].encode()) < MAX_WORD_BYTES:  # `^`: the first, again
            where.setdefault(INITIAL + column[0], []).append(f"{start}{weight}")
        for position, token in enumerate(column, start):
            found = where.get(token)
            if found is None:
                n = len(token) if token.isascii() else len(token.encode())
                if n > MAX_WORD_BYTES or size + n > MAX_DOC_BYTES:
                    continue
                size += n + 8
                found = where[token] = []
            if len(found) < MAX_POSITIONS:
                found.append(f"{position if position < MAX_POSITION else MAX_POSITION}{weight}")
    return " ".join([f"'{t}':{','.join(ps)}" for t, ps in where.items()])


# --- the query: FTS5's syntax, parsed into a tsquery ---------------------------------------

# FTS5's barewords: ASCII letters, digits, "_", 0x1A and every non-ASCII character.
_LEX = re.compile(r'\s+|(?P<word>[A-Za-z0-9_\x1a\x80-\U0010ffff]+)|(?P<str>"(?:[^"]|"")*")'
                  r'|(?P<op>[()*:+^\-{},])|(?P<bad>.)', re.S)
_COLUMNS: Final = {"body": "A", "tags": "B"}
ALL: Final = "AB"


class _Bad(Exception):
    pass


@dataclass(frozen=True, slots=True)
class _Phrase:
    tokens: tuple[tuple[str, bool], ...]  # (lexeme, whether it is a prefix)
    weights: str


@dataclass(frozen=True, slots=True)
class _Op:
    op: str  # "&", "|", "not", "near"
    left: Any
    right: Any
    distance: int = 0


class _Parser:
    """FTS5's grammar (fts5parse.y): OR < AND < NOT < juxtaposition (an implicit AND),
    each left-associative; a unit is a phrase (words or a "string", then `*` for a
    prefix, `+` joining phrases), `( … )`, `NEAR( … [, N])`, after an optional column
    filter (`col:`, `{col col}:`, `-col:`). A phrase with no tokens is left out."""

    def __init__(self, text: str) -> None:
        self.items: list[tuple[str, str]] = []
        for m in _LEX.finditer(text):
            kind = m.lastgroup
            if kind is None:
                continue
            if kind == "bad":
                raise _Bad("unterminated string" if m.group() == '"'
                           else f'fts5: syntax error near "{m.group()}"')
            if kind == "str":
                self.items.append(("str", m.group()[1:-1].replace('""', '"')))
            else:
                self.items.append((kind, m.group()))
        self.at = 0
        self.depth = 0  # the parentheses open here

    def group(self, weights: str) -> Any:
        """`( … )` once its `(` is taken; deeper than FTS5 parses is refused as FTS5 does."""
        self.depth += 1
        if self.depth > MAX_DEPTH:
            raise _Bad("fts5: parser stack overflow")
        node = self.or_(weights)
        self.expect(")")
        self.depth -= 1
        return node

    def peek(self, k: int = 0) -> tuple[str, str]:
        i = self.at + k
        return self.items[i] if i < len(self.items) else ("end", "")

    def take(self) -> tuple[str, str]:
        item = self.peek()
        self.at += 1
        return item

    def expect(self, value: str) -> None:
        kind, got = self.take()
        if got != value or kind != "op":
            raise _Bad(f'fts5: syntax error near "{got}"')

    def parse(self) -> Any:
        node = self.or_(ALL)
        if self.peek()[0] != "end":
            raise _Bad(f'fts5: syntax error near "{self.peek()[1]}"')
        return node

    def _keyword(self, word: str) -> bool:
        return self.peek() == ("word", word)

    def or_(self, weights: str) -> Any:
        node = self.and_(weights)
        while self._keyword("OR"):
            self.take()
            node = _join("|", node, self.and_(weights))
        return node

    def and_(self, weights: str) -> Any:
        node = self.not_(weights)
        while self._keyword("AND"):
            self.take()
            node = _join("&", node, self.not_(weights))
        return node

    def not_(self, weights: str) -> Any:
        node = self.primary(weights)
        while self._keyword("NOT"):
            self.take()
            right = self.primary(weights)
            node = node if right is None or node is None else _Op("not", node, right)
        return node

    def _starts_nearset(self) -> bool:
        """Whether a phrase or NEAR group (after an optional column filter) starts here:
        what juxtaposition joins (FTS5 joins no parenthesised group that way)."""
        kind, value = self.peek()
        if kind == "word":
            return value not in ("AND", "OR", "NOT")
        return kind == "str" or (kind == "op" and value in "^{-")

    def primary(self, weights: str) -> Any:
        """`( … )`, `col: ( … )`, or phrases and NEAR groups side by side (an AND)."""
        if self.peek() == ("op", "("):
            self.take()
            return self.group(weights)
        at = self.at
        filtered = self.column_filter(weights)
        if self.peek() == ("op", "(") and self.at != at:
            self.take()
            return self.group(filtered)
        node = self.nearset(filtered)
        while self._starts_nearset():
            node = _join("&", node, self.nearset(self.column_filter(weights)))
        return node

    def nearset(self, weights: str) -> Any:
        kind, value = self.peek()
        if kind == "word" and value == "NEAR" and self.peek(1) == ("op", "("):
            return self.near(weights)
        return self.phrase_group(weights)

    def column_filter(self, weights: str) -> str:
        kind, value = self.peek()
        negate = (kind, value) == ("op", "-")
        k = 1 if negate else 0
        names: list[str] = []
        if self.peek(k) == ("op", "{"):
            k += 1
            while self.peek(k)[0] == "word":
                names.append(self.peek(k)[1])
                k += 1
            if self.peek(k) != ("op", "}"):
                raise _Bad(f'fts5: syntax error near "{self.peek(k)[1]}"')
            k += 1
        elif self.peek(k)[0] in ("word", "str") and self.peek(k + 1) == ("op", ":"):
            names.append(self.peek(k)[1])
            k += 1
        elif negate:
            raise _Bad('fts5: syntax error near "-"')
        else:
            return weights
        if self.peek(k) != ("op", ":"):
            raise _Bad(f'fts5: syntax error near "{self.peek(k)[1]}"')
        self.at += k + 1
        chosen = set()
        for name in names:
            if name.lower() not in _COLUMNS:
                raise _Bad(f"no such column: {name}")
            chosen.add(_COLUMNS[name.lower()])
        if negate:
            chosen = set(ALL) - chosen
        return "".join(w for w in weights if w in chosen)

    def phrase(self, weights: str) -> _Phrase:
        kind, value = self.take()
        if kind not in ("word", "str") or (kind == "word" and value in ("AND", "OR", "NOT")):
            raise _Bad(f'fts5: syntax error near "{value}"')
        found = [(t, False) for t in tokens(value)]
        if self.peek() == ("op", "*"):
            self.take()
            if found:
                found[-1] = (found[-1][0], True)
        return _Phrase(tuple(found), weights)

    def phrase_group(self, weights: str, caret: bool = True) -> Any:
        initial = caret and self.peek() == ("op", "^")
        if initial:
            self.take()
        phrase = self.phrase(weights)
        while self.peek() == ("op", "+"):
            self.take()
            phrase = _Phrase(phrase.tokens + self.phrase(weights).tokens, weights)
        if not phrase.tokens:
            return None
        if initial:  # the column's first token: indexed once more as INITIAL + itself
            (first, prefix), *rest = phrase.tokens
            phrase = _Phrase(((INITIAL + first, prefix), *rest), weights)
        return phrase

    def near(self, weights: str) -> Any:
        self.take()
        self.expect("(")
        phrases: list[_Phrase] = []
        while self.peek()[0] in ("word", "str"):
            group = self.phrase_group(weights, caret=False)
            if group is not None:
                phrases.append(group)
        distance = 10
        if self.peek() == ("op", ","):
            self.take()
            kind, value = self.take()
            if kind != "word" or not value.isdigit():
                raise _Bad(f'expected integer, got "{value}"')
            distance = int(value)
        self.expect(")")
        if not phrases:
            return None
        if len(phrases) == 1:
            return phrases[0]
        longest = max(len(p.tokens) for p in phrases)
        if len(phrases) > 2:
            ways = math.prod(len(p.tokens) + distance + 1 for p in phrases)
            if ways > MAX_NEAR_WAYS:
                raise _Bad(f"NEAR of {len(phrases)} phrases within {distance} tokens is not"
                           f" supported by the PostgreSQL store's search (it would try {ways:,}"
                           f" placements, more than {MAX_NEAR_WAYS:,}): use fewer phrases or"
                           " a shorter distance")
            return _NearAll(tuple(phrases), distance)
        if distance + longest > MAX_NEAR:
            raise _Bad(f"NEAR's distance and its longest phrase's words may be at most"
                       f" {MAX_NEAR} together on the PostgreSQL store")
        return _Op("near", phrases[0], phrases[1], distance)


@dataclass(frozen=True, slots=True)
class _NearAll:
    """NEAR of three phrases or more."""

    phrases: tuple[_Phrase, ...]
    distance: int


def _join(op: str, left: Any, right: Any) -> Any:
    """`left op right`; a side without tokens is left out (as FTS5 drops an empty phrase)."""
    if left is None:
        return right
    if right is None:
        return left
    return _Op(op, left, right)


def _render(node: Any) -> str:
    if isinstance(node, _Phrase):
        return _phrase(node.tokens, node.weights)
    if isinstance(node, _NearAll):
        return _near_all(node.phrases, node.distance)
    if node.op == "near":
        return _near(node.left, node.right, node.distance)
    a, b = _render(node.left), _render(node.right)
    if node.op == "not":
        return f"({a} & !{b})"
    return f"({a} {node.op} {b})"


def _phrase(tokens: Sequence[tuple[str, bool]], weights: str) -> str:
    if not weights:  # a column filter that leaves no column: matches nothing
        return "('a' & !'a')"
    return "(" + " <-> ".join(f"'{t}':{'*' if prefix else ''}{weights}"
                              for t, prefix in tokens) + ")"


def _same(a: tuple[str, bool], b: tuple[str, bool]) -> tuple[str, bool] | None:
    """The token both a and b can be at one position (a prefix takes any word it starts)."""
    (x, x_prefix), (y, y_prefix) = a, b
    if x_prefix and y.startswith(x) and (not y_prefix or len(y) >= len(x)):
        return b
    if y_prefix and x.startswith(y):
        return a
    return a if a == b else None


def _overlaid(a: list[tuple[str, bool]], b: list[tuple[str, bool]],
              k: int) -> list[tuple[str, bool]] | None:
    """The tokens of phrase b starting at a's token k, over a (None if they disagree)."""
    out = list(a)
    for j, token in enumerate(b):
        if k + j < len(out):
            same = _same(out[k + j], token)
            if same is None:
                return None
            out[k + j] = same
        else:
            out.append(token)
    return out


def _near_all(phrases: Sequence[_Phrase], distance: int) -> str:
    """NEAR(p1 … pk, N) as every placement that FTS5 accepts: with M the latest start, each
    phrase starts at most its length + N before it. Each placement is the phrases' tokens
    laid at their positions (where they overlap they must agree), as one chain."""
    weights = phrases[0].weights
    ways = set()
    for back in itertools.product(*(range(len(p.tokens) + distance + 1) for p in phrases)):
        if 0 not in back:
            continue
        placed: dict[int, tuple[str, bool]] = {}
        for phrase, before in zip(phrases, back, strict=True):
            for j, token in enumerate(phrase.tokens):
                here = placed.get(j - before)
                same = token if here is None else _same(here, token)
                if same is None:
                    break
                placed[j - before] = same
            else:
                continue
            break
        else:
            at = sorted(placed)
            chain = f"'{placed[at[0]][0]}':{'*' if placed[at[0]][1] else ''}{weights}"
            for prev, pos in itertools.pairwise(at):
                t, prefix = placed[pos]
                chain += f" <{pos - prev}> '{t}':{'*' if prefix else ''}{weights}"
            ways.add(f"({chain})")
    if not ways or not weights:
        return "('a' & !'a')"
    return "(" + " | ".join(sorted(ways)) + ")"


def _near(a: _Phrase, b: _Phrase, distance: int) -> str:
    """FTS5's NEAR(a b, N): both phrases in one column, with a's start s1 and b's start s2
    such that -(len b + N) <= s2 - s1 <= len a + N (at most N tokens between them;
    overlapping too). `x <d> y` puts y's first token d after x's last; an overlap short
    of that is the phrases laid over each other."""
    ta, tb = list(a.tokens), list(b.tokens)
    ra, rb = _phrase(ta, a.weights), _phrase(tb, b.weights)
    ways = [f"{x} <{d}> {y}" for d in range(distance + 2) for x, y in ((ra, rb), (rb, ra))]
    overlaps = [_overlaid(ta, tb, k) for k in range(len(ta) - 1)]
    overlaps += [_overlaid(tb, ta, k) for k in range(1, len(tb) - 1)]
    ways += [_phrase(o, a.weights) for o in overlaps if o is not None]
    return "(" + " | ".join(ways) + ")"


def to_tsquery_text(text: str) -> str | None:
    """The tsquery (as its text) of an FTS5 query, or None when it has no token (FTS5
    then matches nothing); -32602 naming `$.query` when it does not parse."""
    try:
        try:
            node = _Parser(text).parse()
            rendered = None if node is None else _render(node)
        except RecursionError:  # deeper than Python's stack, short of MAX_DEPTH
            raise _Bad("fts5: parser stack overflow") from None
        if rendered is not None and len(rendered) > MAX_TSQUERY:
            raise _Bad(f"the query's NEAR groups expand past what the PostgreSQL store's"
                       f" search takes ({len(rendered):,} characters of tsquery, more than"
                       f" {MAX_TSQUERY:,}): use fewer NEAR groups, or shorter distances")
    except _Bad as exc:
        raise InvalidParamsError(f"query is not a valid search: {exc}",
                                 {"detail": str(exc), "path": "$.query"}) from exc
    return rendered


# --- the writer's side (inside the batch transaction) -------------------------------------

# The session comes from the event (inserted before, in the same transaction).
_INSERT: Final = """
    INSERT INTO search_index (position, session_id, body, tags, doc)
    SELECT u.position, e.session_id, u.body, u.tags, u.doc
    FROM unnest($1::bigint[], $2::text[], $3::text[], $4::tsvector[])
        AS u(position, body, tags, doc)
    JOIN events e ON e.position = u.position
    ON CONFLICT (position) DO NOTHING"""


async def insert(con: Any, rows: Sequence[tuple[Any, ...]]) -> None:
    """The rule's rows (position, body, tags, and the tsvector if built already:
    executor.documents) into the index (executor.py runs this for the rule's Insert,
    inside the commit, after the batch's events)."""
    if rows:
        await con.execute(_INSERT, [r[0] for r in rows], [r[1] for r in rows],
                          [r[2] for r in rows],
                          [r[3] if len(r) > 3 else tsvector(r[1], r[2]) for r in rows])


async def forget(con: Any, session_ids: Sequence[str]) -> None:
    """Take deleted sessions' documents out of the index, in the delete's transaction."""
    if session_ids:
        await con.execute("DELETE FROM search_index WHERE session_id = ANY($1::text[])",
                          list(session_ids))


async def forget_trimmed(con: Any, session_id: str, version: int) -> None:
    """Take a session's documents up to `version` out of the index (retention's trim, in
    its transaction, before those events are deleted)."""
    await con.execute("DELETE FROM search_index WHERE session_id = $1 AND position IN"
                      " (SELECT position FROM events WHERE session_id = $1 AND version <= $2)",
                      session_id, version)


# --- migration 7's backfill, daemon.reindex and daemon.verify -----------------------------

_decode = msgspec.json.Decoder(dict[str, Any])
BACKFILL_ROWS: Final = 2_000  # events read at once (each may be a 16 MiB message)


async def rebuild_range(con: Any, after: int, upto: int) -> None:
    """Index the events with after < position <= upto the index does not hold, in the
    transaction `con` is in. The events are locked (FOR SHARE) until it commits, so a
    delete of their session waits for it and then takes these rows too."""
    while after < upto:
        rows = await con.fetch(
            "SELECT position, type, data FROM events e"
            f" WHERE position > $1 AND position <= $2 AND type IN ({_TYPES_SQL})"
            " AND NOT EXISTS (SELECT 1 FROM search_index f WHERE f.position = e.position)"
            " ORDER BY position LIMIT $3 FOR SHARE", after, upto, BACKFILL_ROWS)
        if not rows:
            return
        documents = []
        for position, event_type, data in rows:
            try:
                decoded = _decode.decode(data)
            except msgspec.DecodeError:
                decoded = {}  # verify reports the event itself; the index holds no text
            documents.append((int(position), *text_of(event_type, decoded)))
        await insert(con, documents)
        after = int(rows[-1][0])


async def backfill(con: Any) -> None:
    """Migration 7's last step: every stored event of an indexed type, in one transaction
    (the migration's)."""
    top = int(await con.fetchval("SELECT position FROM log_head WHERE id = 1"))
    await rebuild_range(con, 0, top)


async def problems(con: Any) -> list[str]:
    """What daemon.verify finds wrong with the index (as sqlite/search.py's)."""
    missing = await con.fetchrow(
        "SELECT COUNT(*), MIN(position) FROM events e WHERE type IN"
        f" ({_TYPES_SQL}) AND NOT EXISTS (SELECT 1 FROM search_index f"
        " WHERE f.position = e.position)")
    extra = await con.fetchrow(
        "SELECT COUNT(*), MIN(position) FROM search_index f WHERE NOT EXISTS (SELECT 1 FROM"
        f" events e WHERE e.position = f.position AND e.type IN ({_TYPES_SQL}))")
    return model.problems(missing, extra)


# --- the query ------------------------------------------------------------------------

_OPEN, _CLOSE = "\ue000", "\ue001"  # ts_headline's marks, replaced by the client's after
_HEADLINE: Final = (f"StartSel={_OPEN}, StopSel={_CLOSE}, MaxWords=12, MinWords=6,"
                    " ShortWord=0, MaxFragments=1")


def _newest_sql(q: SearchQuery) -> tuple[str, list[Any]]:
    """The newest `window` + 1 matches after the filters ($1 the tsquery), and their rank."""
    args: list[Any] = []
    joins, where = "", ["f.doc @@ $1::tsquery"]

    def arg(value: Any) -> str:
        args.append(value)
        return f"${len(args) + 1}"

    if q.since is not None or q.until is not None:
        joins += " JOIN events e ON e.position = f.position"
        if q.since is not None:
            where.append(f"e.recorded_at >= {arg(q.since)}")
        if q.until is not None:
            where.append(f"e.recorded_at < {arg(q.until)}")
    if q.namespace is not None or q.actor_name is not None or q.statuses:
        joins += " JOIN sessions s ON s.session_id = f.session_id"
        if q.namespace is not None:
            where.append(f"s.namespace = {arg(q.namespace)}")
        if q.actor_name is not None:
            where.append(f"s.actor_name = {arg(q.actor_name)}")
        if q.statuses:
            where.append(f"s.status = ANY({arg(list(q.statuses))}::text[])")
    limit = arg(q.window + 1)
    return (f"SELECT m.position, m.session_id, ts_rank(m.doc, $1::tsquery) FROM ("
            f"SELECT f.position, f.session_id, f.doc FROM search_index f{joins}"
            f" WHERE {' AND '.join(where)} ORDER BY f.position DESC LIMIT {limit}) m"
            " ORDER BY m.position DESC"), args


# A message's sequence and role from its event, as SQLite's json_extract reads them.
_HITS: Final = f"""
    SELECT f.position, e.version, e.type, e.recorded_at, (j.d->>'sequence')::bigint,
        j.d->>'role',
        left(CASE WHEN strpos(h.body, '{_OPEN}') > 0 OR f.tags IS NULL THEN h.body
            ELSE ts_headline('simple', f.tags, $1::tsquery, '{_HEADLINE}') END,
            {model.SNIPPET_CHARS}),
        COALESCE(m.position = f.position, false)
    FROM search_index f JOIN events e ON e.position = f.position
    CROSS JOIN LATERAL (SELECT CASE WHEN e.type = 'message.appended'
        THEN convert_from(e.data, 'UTF8')::json END AS d) j
    LEFT JOIN messages m ON m.session_id = f.session_id
        AND m.sequence = (j.d->>'sequence')::bigint
    CROSS JOIN LATERAL (SELECT ts_headline('simple', COALESCE(f.body, ''), $1::tsquery,
        '{_HEADLINE}') AS body) h
    WHERE f.position = ANY($2::bigint[])"""
_VIEWS: Final = ("SELECT session_id, status, namespace, actor_name, task, updated_at"
                 " FROM sessions WHERE session_id = ANY($1::text[])")


# The planner's statistics of the index's words (ANALYZE, kept by autovacuum): the most
# common ones (up to ten times the statistics target) and the share of rows each is in.
_STATS: Final = """
    SELECT s.most_common_elems::text::text[], s.most_common_elem_freqs, c.reltuples
    FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
    JOIN pg_stats s ON s.schemaname = n.nspname AND s.tablename = c.relname
        AND s.attname = 'doc'
    WHERE c.oid = 'search_index'::regclass"""


async def prefix_matches(con: Any, words: list[str]) -> int:
    """About how many (event, word) entries the GIN index holds for the words starting
    with `words` (prefixes), from the planner's statistics: one catalog read, whatever the
    index's size (ts_stat, or the index itself, would read every entry). Words too rare to
    be among the most common count nothing; a table never analyzed counts nothing."""
    if not words:
        return 0
    row = await con.fetchrow(_STATS)
    if row is None or row[0] is None or row[1] is None:
        return 0
    rows = max(0.0, float(row[2]))
    share = sum(freq for elem, freq in zip(row[0], row[1], strict=False)
                if elem.startswith(tuple(words)))
    return int(share * rows)


async def _query(con: Any, q: SearchQuery, tsquery: str, budget: SearchBudget) -> SearchResult:
    # One snapshot for the ranking, the hits and the views; the server's own bound too.
    async with con.transaction(isolation="repeatable_read", readonly=True):
        await con.execute("SET LOCAL statement_timeout ="
                          f" {max(1, int(budget.timeout_s * 1000))}")
        # A prefix reads the index entries of all its words (a GIN scan) unless the
        # planner walks the positions instead: refused up front when they are too many.
        found = await prefix_matches(con, model.prefixes(q.text))
        if found > budget.max_prefix_matches:
            raise model.too_broad(found, budget.max_prefix_matches)
        sql, args = _newest_sql(q)
        rows = [(int(r[0]), r[1], -float(r[2])) for r in await con.fetch(sql, tsquery, *args)]
        complete = len(rows) <= q.window
        ranked = model.rank(rows[:q.window], q.after, q.limit, q.hits)
        hits: dict[int, SearchHit] = {}
        if chosen := ranked.chosen:
            opened, closed = q.mark
            for r in await con.fetch(_HITS, tsquery, chosen):
                snippet = r[6].replace(_OPEN, opened).replace(_CLOSE, closed)
                hits[r[0]] = model.hit(r[0], r[1], r[2], r[3], r[4], r[5], snippet, r[7])
        views = {r[0]: tuple(r[1:]) for r in await con.fetch(_VIEWS, list(ranked.best))}
    return model.result(ranked, hits, views, complete)


RELINK_PAGE = 500  # session.forked events read at once by relink_forks
_POLL_S: Final = 0.05  # how often a running query looks whether its client is still there


class FullText:
    """The `full_text` capability of the PostgreSQL store, on its read pool (the query)
    and on connections of their own (reindex, in ranges).

    At most one pool connection less than the pool holds runs a search (`_lanes`, at
    least one), so the other reads always have a connection to take; a search waiting
    for its turn waits within its time and ends when its client goes."""

    def __init__(self, store: Any) -> None:
        self.store = store  # a PostgresStore: its pool (`_pool`) and `connect`
        self._lanes = anyio.Semaphore(max(1, int(store._reader_count) - 1))

    async def search(self, q: SearchQuery, budget: SearchBudget) -> SearchResult:
        tsquery = to_tsquery_text(q.text)
        if tsquery is None:
            return SearchResult(sessions=[], complete=True)
        deadline = time.monotonic() + budget.timeout_s
        why: list[str] = []
        result: list[SearchResult] = []
        failed: list[Exception] = []

        async def run(scope: anyio.CancelScope) -> None:
            try:
                async with self._lanes, self.store._pool.acquire() as con:
                    result.append(await _query(con, q, tsquery, budget))
            except Exception as exc:  # raised below, outside the task group
                failed.append(exc)
            finally:
                scope.cancel()

        async with anyio.create_task_group() as tg:
            tg.start_soon(run, tg.cancel_scope)
            while True:  # the watcher: the client gone, the time spent
                await anyio.sleep(_POLL_S)
                if budget.stop.is_set() or budget.gone():
                    why.append("client gone")
                elif time.monotonic() > deadline:
                    why.append("search_timeout_s")
                if why:
                    tg.cancel_scope.cancel()  # asyncpg asks the server to cancel the query
                    break
        if failed:
            exc = failed[0]
            if isinstance(exc, asyncpg.QueryCanceledError):
                raise _stopped("search_timeout_s", budget) from exc
            if isinstance(exc, (*RETRYABLE, asyncpg.PostgresError)):
                raise storage_error(exc) from exc
            raise exc
        if result:
            return result[0]
        raise _stopped(why[0] if why else "client gone", budget)

    async def _own(self, fn: Any) -> Any:
        """`fn(con)` in a transaction on a connection of its own (not the writer's)."""
        try:
            con = await self.store.connect()
            try:
                async with con.transaction():
                    return await fn(con)
            finally:
                await con.close()
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            raise storage_error(exc) from exc

    async def clear(self) -> int:
        async def run(con: Any) -> int:
            top = int(await con.fetchval("SELECT position FROM log_head WHERE id = 1"))
            await con.execute("DELETE FROM search_index WHERE position <= $1", top)
            return top
        return int(await self._own(run))

    async def rebuild_range(self, after: int, upto: int) -> None:
        await self._own(lambda con: rebuild_range(con, after, upto))

    async def relink_forks(self) -> int:
        """The fork links again, from the session.forked events (the forks rule's ops),
        ordered with every host's commits as SQLite's runs on its writer's thread: each
        commit starts by locking its sessions' rows (store.py's _LOCK, a ROW SHARE lock
        of the table), which EXCLUSIVE waits for and then holds off until this transaction
        ends (reads go on). So no fork is committed between a page's read and the links'
        delete (its link would be lost), and no delete of a fork between its event's read
        and its link's insert (the link would come back for a session that is gone)."""
        from sessiond_daemon.stores.postgres import executor  # it runs this module's insert

        async def run(con: Any) -> int:
            await con.execute("LOCK TABLE sessions IN EXCLUSIVE MODE")
            first, after = True, 0
            while True:
                rows = await con.fetch(f"SELECT {EVENT_COLUMNS} FROM events WHERE"
                                       " type = 'session.forked' AND position > $1"
                                       " ORDER BY position LIMIT $2", after, RELINK_PAGE)
                if rows or first:
                    await executor.run(con, relink([event_from_row(r) for r in rows],
                                                   first=first))
                first = False
                if not rows:
                    return int(await con.fetchval("SELECT COUNT(*) FROM forks"))
                after = int(rows[-1][0])
        return int(await self._own(run))

    async def _read(self, fn: Any) -> Any:
        try:
            async with self.store._pool.acquire() as con:
                return await fn(con)
        except (*RETRYABLE, asyncpg.PostgresError) as exc:
            raise storage_error(exc) from exc

    async def count(self) -> int:
        return int(await self._read(lambda con: con.fetchval(
            "SELECT COUNT(*) FROM search_index")))

    async def problems(self) -> list[str]:
        found: list[str] = await self._read(problems)
        return found


def _stopped(why: str, budget: SearchBudget) -> StorageError:
    if why == "client gone":
        return StorageError("search stopped: its client went away", {"detail": why})
    return StorageError(
        f"search stopped: it passed search_timeout_s ({budget.timeout_s} seconds); narrow"
        " the query (fewer or longer prefixes, more words, filters)",
        {"detail": "over the search budget", "setting": "search_timeout_s",
         "limit": budget.timeout_s, "retryable": True})
