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
from sessiond_schemas.events import (
    Data,
    Event,
    MessageAppended,
    MetadataUpdated,
    Record,
    ResultRecorded,
    SessionCreated,
    SessionForked,
    StatusChanged,
    Unread,
)

INDEXED_TYPES: Final = ("message.appended", "session.created", "session.forked",
                        "metadata.updated", "session.status_changed", "result.recorded",
                        "problem.recorded")
INDEXED: Final = frozenset(INDEXED_TYPES)  # for membership


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
    the stored bytes the SQL function and the backfills read; or typed: Event.data, read
    by `_typed_text`, the same rule over the Structs' attributes)."""
    if isinstance(data, (Record, Unread)):
        data = data.body if isinstance(data.body, dict) else {}
    if isinstance(data, Data):
        return _typed_text(data)
    meta: list[str] = []
    if event_type == "message.appended":
        _values(data.get("metadata", {}), meta)
        return data.get("content"), _join(data.get("tool_call_id"), *meta)
    if event_type in ("session.created", "session.forked"):
        d = data.get("state", {}) if event_type == "session.forked" else data
        if not isinstance(d, dict):
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


def _typed_text(data: Data) -> tuple[str | None, str | None]:
    """text_of's rule over typed data (an indexed type's Struct; Record and Unread are
    read as their bodies, above)."""
    meta: list[str] = []
    match data:
        case MessageAppended():
            _values(data.metadata, meta)
            return data.content, _join(data.tool_call_id, *meta)
        case SessionCreated():
            _values(data.metadata, meta)
            return (_join(data.task),
                    _join(data.actor_name, data.model, data.adapter, *meta))
        case SessionForked():
            return text_of("session.created", data.state)
        case MetadataUpdated():
            _values(data.patch, meta)
            return None, _join(*meta)
        case StatusChanged() | ResultRecorded():
            return _join(data.error), None
    return None, None


def search_rows(events: Sequence[Event], payloads: Mapping[str, bytes]) -> list[Op]:
    """(position, body, tags) of the batch's events of indexed types."""
    rows = [(e.position, *text_of(e.type, e.data)) for e in events if e.type in INDEXED]
    return [Insert("search", rows)] if rows else []
