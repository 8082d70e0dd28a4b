"""The one rule for text on both stores: no NUL (U+0000) in anything the daemon stores.

PostgreSQL's jsonb cannot hold U+0000 and SQLite can; so that a history means the same on
both, and `sessionctl migrate` can move every session the daemon wrote, NUL is refused at
the boundary everywhere (-32602 naming the JSON path), in ids and content alike; output
the daemon captures from executors has it replaced by U+FFFD, as invalid UTF-8 is.
"""

from __future__ import annotations

import re
from typing import Any

import msgspec

from sessiond_schemas.errors import InvalidParamsError

# An escaped NUL in JSON text: `\u0000` after an even run of backslashes (an odd run means
# the backslash itself is escaped: the six characters of text, which are fine).
_ESCAPED_NUL = re.compile(rb"(?<!\\)(?:\\\\)*\\u0000")
REPLACEMENT = "\ufffd"


_U0000 = re.compile(rb"u0000")


def nul_in_json(raw: Any) -> bool:
    """Whether JSON text (any bytes-like object, not copied) holds a NUL in a string or
    key: a literal search first, the exact pattern only where it finds one."""
    data = memoryview(raw)
    return _U0000.search(data) is not None and _ESCAPED_NUL.search(data) is not None


def nul_path(value: Any, path: str = "$") -> str | None:
    """The JSON path of the first string or key holding a NUL in a decoded value, or None.
    Iterative: a value as deep as the decoder allows is walked without recursion."""
    stack: list[tuple[Any, str]] = [(value, path)]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            if "\x00" in item:
                return where
        elif isinstance(item, dict):
            for key in reversed(list(item)):
                if isinstance(key, str) and "\x00" in key:
                    return where
                stack.append((item[key], f"{where}.{key}"))
        elif isinstance(item, (list, tuple)):
            stack.extend((v, f"{where}[{i}]") for i, v in reversed(list(enumerate(item))))
    return None


def refuse_nul(value: Any, path: str = "$") -> None:
    """-32602 naming the path of the first NUL in a decoded value."""
    where = nul_path(value, path)
    if where is not None:
        raise nul_error(where)


def refuse_nul_in_params(raw: Any, method: str) -> None:
    """The boundary check of every request's params (only a line holding an escaped NUL is
    decoded again, to name the path)."""
    if nul_in_json(raw):
        raise nul_error(nul_path(msgspec.json.decode(bytes(raw))) or "$", method)


def nul_error(path: str, method: str | None = None) -> InvalidParamsError:
    where = f" of {method}" if method else ""
    return InvalidParamsError(
        f"invalid params{where}: {path} holds a NUL character (U+0000), which sessiond"
        " stores nowhere (docs/protocol.md, Text)", {"detail": "NUL character", "path": path})


_ESCAPED_NUL_TEXT = re.compile(r"(?<!\\)((?:\\\\)*)\\u0000")


def scrub_line(line: str) -> str:
    """A captured output line with every NUL replaced by U+FFFD: the character itself, and
    the JSON escape of it (so what an adapter parses from the line holds none either)."""
    if "\x00" in line:
        line = line.replace("\x00", REPLACEMENT)
    if "u0000" in line:
        line = _ESCAPED_NUL_TEXT.sub(r"\1\\ufffd", line)
    return line
