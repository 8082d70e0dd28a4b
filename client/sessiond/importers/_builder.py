"""Building an export document event by event, as the daemon would have written it, and
reading a source's JSON so that what is wrong is named by its JSON path."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import msgspec

from sessiond_schemas import export
from sessiond_schemas.events import (
    CURRENT_SCHEMA_VERSION,
    Event,
    EventMeta,
    new_id,
    now,
    parse_time,
)


class Problem(Exception):
    """What makes a source file unimportable: `path` is the JSON path of the field
    (`$.timestamps.started_at`), `line` the line of a JSON Lines file (1-based)."""

    def __init__(self, reason: str, path: str = "$", line: int | None = None) -> None:
        super().__init__(reason)
        self.reason, self.path, self.line = reason, path, line

    def describe(self) -> str:
        where = (f"line {self.line}" if self.line is not None else "") + (
            ("" if self.path == "$" else f" at {self.path}") if self.line is not None
            else ("" if self.path == "$" else f"at {self.path}"))
        return f"{where}: {self.reason}" if where else self.reason


@dataclass
class Found:
    """One session an importer found in a source: its export document, or why not."""

    file: str
    document: dict[str, Any] | None = None
    warnings: list[str] = field(default_factory=list)
    problem: Problem | None = None


def child(path: str, key: object) -> str:
    if isinstance(key, int):
        return f"{path}[{key}]"
    text = str(key)
    return f"{path}.{text}" if text.isidentifier() else f"{path}[{text!r}]"


def _kind(value: object) -> str:
    return {dict: "an object", list: "a list", str: "a string", bool: "a boolean",
            type(None): "null", int: "a number", float: "a number"}.get(
                type(value), type(value).__name__)


class Tracker:
    """The last JSON path read, so that an error deep in a conversion can say where."""

    last = "$"


class TDict(dict[str, Any]):
    """A JSON object that knows its path: a missing key is a Problem naming it."""

    def __init__(self, value: dict[str, Any], path: str) -> None:
        super().__init__(value)
        self.path = path

    def __getitem__(self, key: str) -> Any:
        where = child(self.path, key)
        Tracker.last = where
        if key not in self:
            raise Problem("missing", where)
        return traced(super().__getitem__(key), where)

    def get(self, key: str, default: Any = None) -> Any:
        where = child(self.path, key)
        Tracker.last = where
        return traced(super().get(key, default), where)

    def obj(self, key: str) -> TDict:
        """An optional object field (absent or null: empty)."""
        value = self.get(key)
        if value is None:
            return TDict({}, child(self.path, key))
        if not isinstance(value, TDict):
            raise Problem(f"expected an object, found {_kind(value)}", child(self.path, key))
        return value

    def seq(self, key: str) -> list[Any]:
        """An optional list field (absent or null: empty)."""
        value = self.get(key)
        if value is None:
            return []
        if not isinstance(value, TList):
            raise Problem(f"expected a list, found {_kind(value)}", child(self.path, key))
        return list(value)

    def text(self, key: str, default: str | None = None, *, required: bool = False) -> Any:
        value = self[key] if required else self.get(key, default)
        if value is not None and not isinstance(value, str):
            raise Problem(f"expected a string, found {_kind(value)}", child(self.path, key))
        return value

    def number(self, key: str, default: int = 0) -> Any:
        value = self.get(key, default)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise Problem(f"expected a number, found {_kind(value)}", child(self.path, key))
        return value

    def time(self, key: str, default: str | None = None, *, required: bool = False) -> Any:
        """A time field, checked to parse (naive times are UTC)."""
        value = self.text(key, default, required=required)
        if value is None:
            return None
        try:
            rfc3339(value)
        except (ValueError, TypeError, OverflowError):
            raise Problem(f"not a time: {value[:60]!r}", child(self.path, key)) from None
        return value


class TList(list[Any]):
    def __init__(self, value: list[Any], path: str) -> None:
        super().__init__(value)
        self.path = path

    def __iter__(self) -> Iterator[Any]:
        for i, value in enumerate(super().__iter__()):
            Tracker.last = child(self.path, i)
            yield traced(value, child(self.path, i))

    def get(self, key: str, default: Any = None) -> Any:
        raise Problem(f"expected an object, found a list (asked for {key!r})", self.path)


def traced(value: Any, path: str = "$") -> Any:
    if isinstance(value, (TDict, TList)):
        return value
    if isinstance(value, dict):
        return TDict(value, path)
    if isinstance(value, list):
        return TList(value, path)
    return value


def root_object(value: Any, what: str) -> TDict:
    doc = traced(value)
    if not isinstance(doc, TDict):
        raise Problem(f"expected {what} (a JSON object), found {_kind(value)}")
    return doc


def plain(value: Any) -> Any:
    """Traced JSON back to plain dicts and lists (what goes into event data)."""
    if isinstance(value, dict):
        return {k: plain(dict.__getitem__(value, k)) for k in value}
    if isinstance(value, list):
        return [plain(v) for v in list.__iter__(value)]
    return value


def problem_of(exc: BaseException) -> Problem:
    """Any failure of a conversion as a Problem: where it happened, what it was."""
    if isinstance(exc, Problem):
        return exc
    if isinstance(exc, UnicodeDecodeError):
        return Problem(f"not UTF-8 text (byte {exc.start})")
    if isinstance(exc, OSError):
        return Problem(exc.strerror or type(exc).__name__)
    if isinstance(exc, RecursionError):
        return Problem("nested too deeply")
    detail = str(exc) or type(exc).__name__
    return Problem(f"unexpected value near here ({detail})", Tracker.last)


def load_json(file: str) -> Any:
    """A JSON file's value; a Problem naming what is wrong with it (OSError as it is)."""
    with open(file, "rb") as f:
        raw = f.read()
    try:
        return json.loads(raw.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError included
        raise json_problem(exc) from None


def json_problem(exc: ValueError) -> Problem:
    if isinstance(exc, UnicodeDecodeError):
        return problem_of(exc)
    doc_error = getattr(exc, "msg", None)
    if doc_error is not None:  # json.JSONDecodeError
        return Problem(f"invalid JSON: {doc_error} (line {getattr(exc, 'lineno', '?')},"
                       f" column {getattr(exc, 'colno', '?')})")
    return Problem(f"invalid JSON: {exc}")


def rfc3339(value: str) -> str:
    """A source time (naive ones are taken as UTC) in the contract's form."""
    return parse_time(value).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class DocumentBuilder:
    """Numbers, times and hash-chains events for one session; makes the document."""

    def __init__(self, session_id: str, source: str) -> None:
        self.session_id = session_id
        self.meta = EventMeta(peer_uid=os.getuid(), peer_pid=os.getpid(),
                              correlation_id=f"import:{source}")
        self.events: list[Event] = []
        self.checkpoints: list[dict[str, Any]] = []
        self._hash = ""

    def add(self, event_type: str, data: dict[str, Any], at: str,
            key: str | None = None) -> None:
        """Append an event at source time `at`; `key` goes into meta.idempotency_key (the
        transcript importers find what a session already holds by it)."""
        version = len(self.events) + 1
        meta = self.meta if key is None else msgspec.structs.replace(
            self.meta, idempotency_key=key)
        event = Event(position=version, session_id=self.session_id, version=version,
                      event_id=new_id(), type=event_type, schema_version=CURRENT_SCHEMA_VERSION,
                      recorded_at=rfc3339(at),
                      data_json=msgspec.Raw(msgspec.json.encode(plain(data))), meta=meta,
                      hash="")
        self._hash = export.chain_hash(self._hash, event)
        self.events.append(msgspec.structs.replace(event, hash=self._hash))

    def retime_last(self, at: str) -> None:
        """Move the last event to time `at` (the view's updated_at is the last event's)."""
        last = self.events.pop()
        self._hash = self.events[-1].hash if self.events else ""
        self.add(last.type, last.fields(), at, last.meta.idempotency_key)

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": export.FORMAT, "format_version": export.FORMAT_VERSION,
            "exported_at": now(), "session": None,
            "events": msgspec.json.decode(msgspec.json.encode(self.events)),
            "checkpoints": self.checkpoints,
        }
        doc["checksum"] = export.checksum(doc)
        return doc
