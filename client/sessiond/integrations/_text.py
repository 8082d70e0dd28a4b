"""Store a message's text once: in its content, not again in the SDK object it renders.

An integration renders an SDK object (an OpenAI item, an ADK event) as a message's
readable content, and keeps the object whole in the message's metadata. The strings the
content is made of verbatim (a message's text, a tool's output) would then be stored
twice; instead they are lifted out of the kept object, and `spans` records where each
one lies in the content ([path, start, length], offsets in code points), so reading
puts them back. An object stored before this (without spans) reads back as it is.
"""

from __future__ import annotations

from typing import Any

Path = tuple[str | int, ...]
Piece = tuple[str, Path | None]  # text, and where it came from in the object (None: rendering)


def compose(pieces: list[Piece]) -> tuple[str, list[list[Any]]]:
    """The content made of these pieces, and the spans of the ones taken from the object."""
    spans: list[list[Any]] = []
    position = 0
    for text, path in pieces:
        if path is not None and text:
            spans.append([list(path), position, len(text)])
        position += len(text)
    return "".join(text for text, _ in pieces), spans


def lift(obj: Any, spans: list[list[Any]]) -> Any:
    """A copy of `obj` with the spans' strings emptied; copies only along their paths."""
    if not spans:
        return obj
    top = _copy(obj)
    for path, _start, _length in spans:
        node = top
        for key in path[:-1]:
            node[key] = node = _copy(node[key])
        node[path[-1]] = ""
    return top


def restore(obj: Any, content: str, spans: list[list[Any]]) -> Any:
    """Put the lifted strings back into `obj` (freshly decoded, so changed in place)."""
    for path, start, length in spans:
        node = obj
        for key in path[:-1]:
            node = node[key]
        node[path[-1]] = content[start:start + length]
    return obj


def _copy(node: Any) -> Any:
    return dict(node) if isinstance(node, dict) else list(node)
