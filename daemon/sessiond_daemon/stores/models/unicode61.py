"""FTS5's unicode61 tokenizer (remove_diacritics 2, the SQLite store's), in Python: the
PostgreSQL store builds its tsvectors and parses its queries with these tokens, so the two
stores find the same events.

unicode61 reads a text one code point at a time: a code point of a token category (as
SQLite's fts5_unicode2.c classes them, not as Python's unicodedata does: emoji and most
symbols separate, ligatures, superscripts and roman numerals are letters) extends the
token, any other ends it; each token character is then folded on its own (lower case,
diacritics removed, no compatibility decomposition: "ﬁ" stays "ﬁ", "²" stays "²"), and a
few combining marks fold to nothing. The tables (unicode61_tables.py) are measured from
FTS5 itself (`measure`; `python -m sessiond_daemon.stores.models.unicode61` writes them
again), and a test checks them against the FTS5 this Python links.
"""

from __future__ import annotations

import re
from typing import Final

from sessiond_daemon.stores.models.unicode61_tables import FOLD, SEPARATORS

_ASCII: Final = re.compile(r"[0-9a-z]+")
_RANGES: Final = "".join(re.escape(chr(lo)) if lo == hi else
                         f"{re.escape(chr(lo))}-{re.escape(chr(hi))}" for lo, hi in SEPARATORS)
# ASCII's separators (all but letters and digits), the measured ones, and the surrogates
# (no UTF-8 text holds them).
TOKEN_CHAR: Final = f"[^\\x00-/:-@\\[-`{{-\\x7f{_RANGES}\\ud800-\\udfff]"  # one, as a regex
_TOKEN: Final = re.compile(TOKEN_CHAR + "+")
_FOLD: Final = {**{c: chr(c + 32) for c in range(ord("A"), ord("Z") + 1)},
                **{c: (f or None) for c, f in FOLD.items()}}


def tokens(text: str | None) -> list[str]:
    """The tokens of a text, in order, as FTS5's unicode61 (remove_diacritics 2) makes
    them."""
    if not text:
        return []
    if text.isascii():
        return _ASCII.findall(text.lower())
    return [t for t in (w.translate(_FOLD) for w in _TOKEN.findall(text)) if t]


def measure() -> tuple[list[tuple[int, int]], dict[int, str]]:
    """(SEPARATORS, FOLD) as the FTS5 of this Python's sqlite3 tokenizes every non-ASCII
    code point: the ranges of those that end a token, and how each token character that
    does not stay itself folds ("" for none). A few seconds."""
    import sqlite3

    db = sqlite3.connect(":memory:")
    db.execute("CREATE VIRTUAL TABLE t USING fts5(body,"
               " tokenize='unicode61 remove_diacritics 2')")
    db.execute("CREATE VIRTUAL TABLE v USING fts5vocab(t, 'instance')")
    points = [c for c in range(0x80, 0x110000) if not 0xD800 <= c <= 0xDFFF]
    # Each code point between two "q": one token "q<fold>q" if it is a token character
    # (its fold may be nothing), two tokens "q" if it separates.
    db.executemany("INSERT INTO t (rowid, body) VALUES (?, ?)",
                   [(c, f"q{chr(c)}q") for c in points])
    fold: dict[int, str] = {}
    separate = set()
    for term, doc in db.execute("SELECT term, doc FROM v"):
        if term == "q":
            separate.add(int(doc))
        elif term != f"q{chr(doc)}q":
            fold[int(doc)] = term[1:-1]
    db.close()
    ranges: list[tuple[int, int]] = []
    for c in sorted(separate):
        if ranges and ranges[-1][1] == c - 1:
            ranges[-1] = (ranges[-1][0], c)
        else:
            ranges.append((c, c))
    return ranges, fold


def _write(path: str) -> None:
    ranges, fold = measure()
    lines = ['"""unicode61.py\'s tables, measured from FTS5 (unicode61 remove_diacritics 2) by',
             "`python -m sessiond_daemon.stores.models.unicode61`: do not edit.\"\"\"",
             "", "from typing import Final", "",
             "# The non-ASCII code points that end a token, as (first, last) ranges.",
             "SEPARATORS: Final[list[tuple[int, int]]] = ["]
    lines += [f"    ({lo:#x}, {hi:#x})," for lo, hi in ranges]
    lines += ["]", "# How a non-ASCII token character folds when not to itself (\"\": to nothing).",
              "FOLD: Final[dict[int, str]] = {"]
    lines += [f"    {c:#x}: {f!r}," for c, f in sorted(fold.items())]
    lines += ["}", ""]
    with open(path, "w", encoding="utf-8") as out:
        out.write("\n".join(lines))


if __name__ == "__main__":
    import os

    _write(os.path.join(os.path.dirname(os.path.abspath(__file__)), "unicode61_tables.py"))
