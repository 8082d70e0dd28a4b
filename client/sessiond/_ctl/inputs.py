"""What sessionctl reads and writes locally: strict JSON, files, standard input, times."""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from typing import Any

from .registry import CliError


def _finite(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise ValueError(f"{text} is past the largest number sessiond stores (a finite"
                         " 64-bit float)")
    return value


def _not_a_number(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _loads(text: str) -> Any:
    """Strict JSON: NaN, Infinity and numbers that overflow to infinity are errors (the
    encoder would send them as null, which a merge patch takes for "delete")."""
    return json.loads(text, parse_float=_finite, parse_constant=_not_a_number)


def parse_json(text: str, what: str) -> Any:
    try:
        return _loads(text)
    except json.JSONDecodeError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}", "bad_json", 2,
                       {"line": exc.lineno, "column": exc.colno}) from exc
    except ValueError as exc:
        raise CliError(f"{what} is not valid JSON: {exc}", "bad_json", 2) from exc


def json_arg(text: str) -> Any:
    try:
        return _loads(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not valid JSON: {exc}") from exc


def file_problem(path: str, exc: OSError | UnicodeDecodeError) -> CliError:
    """A local file that cannot be read or written, said as what it is."""
    if isinstance(exc, UnicodeDecodeError):
        reason = f"not UTF-8 text ({exc.reason} at byte {exc.start})"
    elif isinstance(exc, IsADirectoryError):
        reason = "is a directory, not a file"
    elif isinstance(exc, FileNotFoundError):
        parent = os.path.dirname(os.path.abspath(path))
        reason = ("no such file" if os.path.isdir(parent)
                  else f"no such directory: {parent}")
    elif isinstance(exc, PermissionError):
        reason = "permission denied"
    else:
        reason = exc.strerror or str(exc)
    return CliError(f"{path}: {reason}", "file_error", 1, {"path": path})


def read_file(path: str) -> str:
    try:
        with open(path, encoding="utf-8") as f:
            return f.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise file_problem(path, exc) from exc


def write_file(path: str, text: str) -> None:
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as exc:
        raise file_problem(path, exc) from exc


def read_stdin() -> str:
    if sys.stdin.isatty():  # a person at a terminal may not know we are waiting for them
        print("sessionctl: reading standard input; end it with Ctrl-D", file=sys.stderr)
    try:
        return sys.stdin.read()
    except UnicodeDecodeError as exc:
        raise file_problem("standard input", exc) from exc


def read_text(arg: str | None) -> str:
    """An argument, or standard input when it is '-' or missing."""
    if arg is None or arg == "-":
        return read_stdin()
    return arg


def read_json_items(source: str | None) -> list[Any]:
    """A JSON array, or JSON lines, from a file or standard input."""
    name = "standard input" if source in (None, "-") else source
    text = read_stdin() if source in (None, "-") else read_file(str(source))
    text = text.strip()
    if text.startswith("["):
        items: list[Any] = parse_json(text, name)  # a "[" that parses is an array
        return items
    return [parse_json(line, f"{name} line {n}")
            for n, line in enumerate(text.splitlines(), 1) if line.strip()]


def days(text: str) -> float:
    """7d, 12h, 30m, or a number of days."""
    units = {"d": 1.0, "h": 1 / 24, "m": 1 / 1440}
    try:
        if text[-1:] in units:
            return float(text[:-1]) * units[text[-1]]
        return float(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"not a duration like 7d, 12h or 30m: {text}") from exc


def when(text: str | None) -> str | None:
    """7d, 12h, 30m ago as an RFC 3339 time; an RFC 3339 time as it is."""
    if text is None:
        return None
    from datetime import UTC, datetime, timedelta
    try:
        datetime.fromisoformat(text)
        return text
    except ValueError:
        at = datetime.now(UTC) - timedelta(days=days(text))
        return at.strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def render_console() -> Any:
    from rich.console import Console
    return Console()
