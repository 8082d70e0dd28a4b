"""The full-text index's rule: which events it holds and their text (`text_of`, the one
text rule every store's index uses: SQLite's FTS5 through its view and SQL function, a
store's own index through the rows below).

    body: message content, the task, errors;
    tags: tool_call_id, actor, model, adapter and metadata values.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Final

from sessiond_daemon.stores.models.ops import Insert, Op
from sessiond_schemas.events import Data, Event, Record, Unread

INDEXED_TYPES: Final = ("message.appended", "session.created", "session.forked",
                        "metadata.updated", "session.status_changed", "result.recorded",
                        "problem.recorded")
_INDEXED: Final = frozenset(INDEXED_TYPES)


def _values(value: Any, out: list[str]) -> None:
    """Every scalar in a JSON value, as text, in document order (keys are not included)."""
    if isinstance(value, dict):
        for v in value.values():
            _values(v, out)
    elif isinstance(value, list):
        for v in value:
            _values(v, out)
    elif isinstance(value, str):
        out.append(value)
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out.append(str(value))


def _join(*parts: Any) -> str | None:
    text = " ".join(p for p in parts if isinstance(p, str) and p)
    return text or None


def text_of(event_type: str, data: dict[str, Any] | Data) -> tuple[str | None, str | None]:
    """(body, tags) of one event: what the index holds for it (its data as decoded JSON,
    or typed: Event.data)."""
    meta: list[str] = []
    if isinstance(data, (Record, Unread)):
        data = data.body if isinstance(data.body, dict) else {}
    if event_type == "message.appended":
        _values(data.get("metadata", {}), meta)
        return data.get("content"), _join(data.get("tool_call_id"), *meta)
    if event_type in ("session.created", "session.forked"):
        d = data.get("state", {}) if event_type == "session.forked" else data
        if not isinstance(d, (dict, Data)):
            return None, None
        _values(d.get("metadata", {}), meta)
        return (_join(d.get("task"), d.get("error")),
                _join(d.get("actor_name"), d.get("model"), d.get("adapter"), *meta))
    if event_type == "metadata.updated":
        _values(data.get("patch", {}), meta)
        return None, _join(*meta)
    if event_type in ("session.status_changed", "result.recorded"):
        return _join(data.get("error")), None
    if event_type == "problem.recorded":
        _values(data, meta)
        return _join(*meta), None
    return None, None


def search_rows(events: Sequence[Event], payloads: Mapping[str, bytes]) -> list[Op]:
    """(position, body, tags) of the batch's events of indexed types."""
    rows = [(e.position, *text_of(e.type, e.data)) for e in events if e.type in _INDEXED]
    return [Insert("search", rows)] if rows else []
