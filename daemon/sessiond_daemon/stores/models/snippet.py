"""Snippets the daemon cuts itself, from a bounded window of a document's text: for a hit
whose document is too large for the store's own snippet function to be cheap (FTS5's
snippet() costs about the square of the query's matches in the document, in one call
nothing can stop: issue 45 §3), sqlite/search.py uses this instead.

The window is found with one regular expression over the text (its cost linear, in C):
the first match of any of the query's words (search.words: its strings' and barewords'
tokens, prefixes as prefixes), matched as FTS5's unicode61 tokenizer reads a text (token
characters, case and diacritics folded: unicode61.py's tables). The snippet is the
LEAD tokens before it and TOKENS in all, every word of the query in it between the
marks, `…` where the text goes on (as FTS5's snippet). It marks the query's words one
by one, where FTS5 marks a phrase's match whole and only where the query matches.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Final

from sessiond_daemon.stores.models.unicode61 import TOKEN_CHAR
from sessiond_daemon.stores.models.unicode61_tables import FOLD

TOKENS: Final = 12  # as the SQLite store asks of FTS5's snippet()
LEAD: Final = 3  # tokens before the first match
REACH: Final = 4_096  # characters read on either side of the first match
ELLIPSIS: Final = "\u2026"
_TOKEN: Final = re.compile(TOKEN_CHAR + "+")


def _folding_to() -> dict[str, str]:
    """Each folded character: every character that folds to it, itself first."""
    same: dict[str, str] = {chr(c): chr(c) + chr(c - 32) for c in range(ord("a"), ord("z") + 1)}
    for code, folded in FOLD.items():
        if len(folded) == 1:
            same[folded] = same.get(folded, folded) + chr(code)
    return same


_SAME: Final = _folding_to()
# Characters that fold to nothing (a few combining marks): a token may hold them anywhere.
_NOTHING: Final = "".join(chr(c) for c, folded in FOLD.items() if not folded)
_SKIP: Final = f"[{re.escape(_NOTHING)}]*" if _NOTHING else ""


def _word(word: str, prefix: bool) -> str:
    chars = "".join(f"[{re.escape(_SAME.get(c, c))}]{_SKIP}" for c in word)
    return chars + (TOKEN_CHAR + "*" if prefix else "")


def pattern(words: Sequence[tuple[str, bool]]) -> re.Pattern[str] | None:
    """The query's words (search.words) as one expression matching a whole token of a
    text; None for a query with none."""
    if not words:
        return None
    ordered = sorted(words, key=lambda w: -len(w[0]))
    alternatives = "|".join(_word(w, prefix) for w, prefix in ordered)
    return re.compile(f"(?<!{TOKEN_CHAR})(?:{alternatives})(?!{TOKEN_CHAR})")


def cut(texts: Sequence[str | None], words: re.Pattern[str] | None,
        mark: tuple[str, str]) -> str:
    """The snippet of a document (its columns' texts, the first found first): around the
    first match of `words` in the first column holding one, else the document's start."""
    for text in texts:
        if text and words is not None and (found := words.search(text)) is not None:
            return _around(text, found.start(), words, mark)
    first = next((t for t in texts if t), "")
    return _around(first, 0, words, mark)


def _around(text: str, at: int, words: re.Pattern[str] | None,
            mark: tuple[str, str]) -> str:
    before = [t.start() for t in _TOKEN.finditer(text, max(0, at - REACH), at)][-LEAD:]
    start = before[0] if before else at
    end, count = at, len(before)
    for token in _TOKEN.finditer(text, at, min(len(text), at + REACH)):
        end, count = token.end(), count + 1
        if count >= TOKENS:
            break
    head = ELLIPSIS if _TOKEN.search(text, 0, start) else ""
    tail = ELLIPSIS if _TOKEN.search(text, end) else ""
    # At either end of the text, what lies outside its first or last token comes too.
    piece = text[0 if not head else start:len(text) if not tail else end]
    if words is not None:
        opened, closed = mark
        piece = words.sub(lambda m: opened + m.group(0) + closed, piece)
    return head + piece + tail
