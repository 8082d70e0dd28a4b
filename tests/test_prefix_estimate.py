"""The SQLite store's estimate of a prefix's index entries (sqlite/search.py prefix_matches),
read from FTS5's pages, against the truth fts5vocab counts by reading every doclist: on an
index of several segments, long doclists over many pages and words alone on a page."""

from __future__ import annotations

import random
import sqlite3

import pytest

from sessiond_daemon.stores.models.search import prefixes
from sessiond_daemon.stores.sqlite.search import prefix_matches

# 26 x 26 x 4 words: "ab" + 2 letters; Zipf frequencies, so some doclists run over many
# pages and many words fill part of one
LETTERS = "abcdefghijklmnopqrstuvwxyz"
WORDS = [f"{a}{b}{c}" for a in LETTERS for b in LETTERS for c in ("", "x", "yy", "zzz")]


@pytest.fixture(scope="module")
def index() -> sqlite3.Connection:
    rng = random.Random(31)
    weights = [1 / (i + 1) for i in range(len(WORDS))]
    rng.shuffle(weights)
    con = sqlite3.connect(":memory:", isolation_level=None)
    con.execute("CREATE VIRTUAL TABLE search USING fts5(body, tags,"
                " tokenize='unicode61 remove_diacritics 2')")
    con.execute("INSERT INTO search (search, rank) VALUES ('automerge', 0)")  # keep them
    rowid = 0
    for batch in (20_000, 5_000, 2_000, 500, 50):  # one segment per transaction
        con.execute("BEGIN")
        for _ in range(batch):
            rowid += 1
            con.execute("INSERT INTO search (rowid, body) VALUES (?, ?)",
                        (rowid, " ".join(rng.choices(WORDS, weights, k=8))))
        con.execute("COMMIT")
    con.execute("CREATE VIRTUAL TABLE temp.vocab USING fts5vocab(main, 'search', 'row')")
    return con


def truth(con: sqlite3.Connection, prefix: str) -> int:
    """The (event, word) entries of the words starting with `prefix`, every doclist read."""
    hi = prefix[:-1] + chr(ord(prefix[-1]) + 1)
    return int(con.execute("SELECT COALESCE(SUM(doc), 0) FROM temp.vocab"
                           " WHERE term >= ? AND term < ?", (prefix, hi)).fetchone()[0])


def test_the_index_has_several_segments(index: sqlite3.Connection) -> None:
    assert index.execute("SELECT COUNT(DISTINCT segid) FROM search_idx").fetchone()[0] >= 4


@pytest.mark.parametrize("prefix", list(LETTERS))
def test_a_prefix_is_estimated_within_a_factor_of_two(index: sqlite3.Connection,
                                                      prefix: str) -> None:
    real = truth(index, prefix)
    assert real > 3_000  # long doclists: pages each, in every segment
    assert real / 2 <= prefix_matches(index, [prefix]) <= real * 2


def test_rare_and_absent_prefixes_count_about_nothing(index: sqlite3.Connection) -> None:
    """A word with a few entries costs at most the pages it shares; no word, nothing."""
    rare = sorted(WORDS, key=lambda w: truth(index, w + "zzzz") or truth(index, w))
    for word in ("0", "ñ", "abzzzz", "zzzzq"):
        assert truth(index, word) == 0
        assert prefix_matches(index, [word]) == 0
    for word in rare[:20]:
        real = truth(index, word)
        assert prefix_matches(index, [word]) <= real + 3 * 4050 // 4, word


def test_prefixes_add_up(index: sqlite3.Connection) -> None:
    each = [prefix_matches(index, [p]) for p in ("a", "m", "z")]
    assert abs(prefix_matches(index, ["a", "m", "z"]) - sum(each)) <= 2  # rounding


def test_a_query_s_prefixes_are_its_words_as_indexed() -> None:
    assert prefixes('Deplo* AND "login te"* NOT ab * x body:ÉTÉ* kab') == [
        "deplo", "te", "ab", "ete"]
    assert prefixes("bash_3*") == ["3"]
    assert prefixes('"not a prefix*" x NEAR(y* "q""uote"*)') == ["y", "uote"]
    assert prefixes("no prefix here") == []
