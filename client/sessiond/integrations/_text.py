"""Store a message's text once: in its content, not again in the SDK object it renders.

An integration renders an SDK object (an OpenAI item, an ADK event) as a message's
readable content, and keeps the object whole in the message's metadata. The strings the
content is made of verbatim (a message's text, a tool's output) would then be stored
twice; instead they are lifted out of the kept object, and `spans` records where each
one lies in the content ([path, start, length], offsets in code points), so reading
puts them back. A value the content shows as its `json.dumps` text (a tool's arguments
or result) is lifted too: its span ends with "json", and reading parses it back. An
object stored before this (without spans) reads back as it is.
"""

from __future__ import annotations

import json
from typing import Any

Path = tuple[str | int, ...]
# text, where it came from in the object (None: only a rendering), and "json" when the text
# is json.dumps of the value there
Piece = tuple[str, Path | None] | tuple[str, Path | None, str]


def compose(pieces: list[Piece]) -> tuple[str, list[list[Any]]]:
    """The content made of these pieces, and the spans of the ones taken from the object."""
    spans: list[list[Any]] = []
    position = 0
    for text, path, *kind in pieces:
        if path is not None and text:
            spans.append([list(path), position, len(text), *kind])
        position += len(text)
    return "".join(piece[0] for piece in pieces), spans


def lift(obj: Any, spans: list[list[Any]]) -> Any:
    """A copy of `obj` with the spans' strings emptied; copies only along their paths."""
    if not spans:
        return obj
    top = _copy(obj)
    for path, _start, _length, *kind in spans:
        node = top
        for key in path[:-1]:
            node[key] = node = _copy(node[key])
        node[path[-1]] = None if kind else ""
    return top


def restore(obj: Any, content: str, spans: list[list[Any]]) -> Any:
    """Put the lifted strings back into `obj` (freshly decoded, so changed in place)."""
    for path, start, length, *kind in spans:
        node = obj
        for key in path[:-1]:
            node = node[key]
        text = content[start:start + length]
        node[path[-1]] = json.loads(text) if kind else text
    return obj


def _copy(node: Any) -> Any:
    return dict(node) if isinstance(node, dict) else list(node)
