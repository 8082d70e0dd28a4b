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


def configure(level: str = "info", fmt: str = "auto") -> None:
    """Configure structlog once for the process (only `__main__` calls this)."""
    as_json = fmt == "json" or (fmt == "auto" and not sys.stderr.isatty())
    renderer = _json_renderer(_under_journald()) if as_json else structlog.dev.ConsoleRenderer()
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

