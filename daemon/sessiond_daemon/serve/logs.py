"""structlog set-up: JSON lines on stderr when not on a TTY (journald-aware), console otherwise."""

from __future__ import annotations

import logging
import os
import sys
from typing import Any

import msgspec
import structlog

_PRIORITY = {"debug": 7, "info": 6, "warning": 4, "error": 3, "critical": 2, "exception": 3}
_encoder = msgspec.json.Encoder(enc_hook=str)


def _under_journald() -> bool:
    stream = os.environ.get("JOURNAL_STREAM", "")
    try:
        st = os.fstat(sys.stderr.fileno())
    except (OSError, ValueError):
        return False
    return stream == f"{st.st_dev}:{st.st_ino}"


def _json_renderer(prefix: bool) -> Any:
    def render(logger: Any, name: str, event: dict[str, Any]) -> str:
        line = _encoder.encode(event).decode()
        return f"<{_PRIORITY.get(name, 6)}>{line}" if prefix else line
    return render


def _console_renderer() -> Any:
    """A line a record on a terminal, wrapped only between its `key=value` fields (never
    inside a word), the continuation lines indented, at the terminal's width then."""
    inner = structlog.dev.ConsoleRenderer(colors=False, pad_event=0)

    def render(logger: Any, name: str, event: dict[str, Any]) -> str:
        try:
            width = os.get_terminal_size(sys.stderr.fileno()).columns
        except (OSError, ValueError):
            width = 0
        exc = event.pop("exception", None)
        head = inner(logger, name, {k: event.pop(k) for k in
                                    ("timestamp", "level", "event") if k in event})
        fields = [inner(logger, name, {"event": "", k: v}).strip() for k, v in event.items()]
        return wrap_fields(head, fields, width) + (f"\n{exc}" if exc else "")
    return render


def wrap_fields(head: str, fields: list[str], width: int) -> str:
    """`head` then `fields`, space-separated; past `width` columns (0: never) a field goes
    to a line of its own, indented by 4 (a field longer than a line stays whole)."""
    lines, line = [], head
    for f in fields:
        if width and line.strip() and len(line) + 1 + len(f) > width:
            lines.append(line)
            line = "    " + f
        else:
            line = f"{line} {f}" if line else f
    return "\n".join([*lines, line])


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog once for the process (only `__main__` calls this)."""
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer = _json_renderer(_under_journald()) if as_json else _console_renderer()
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(logging.getLevelName(level.upper())),
        logger_factory=structlog.PrintLoggerFactory(sys.stderr),
        cache_logger_on_first_use=False,
    )

