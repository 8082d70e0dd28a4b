"""Building an export document event by event, as the daemon would have written it."""

from __future__ import annotations

import os
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

    def add(self, event_type: str, data: dict[str, Any], at: str) -> None:
        version = len(self.events) + 1
        event = Event(position=version, session_id=self.session_id, version=version,
                      event_id=new_id(), type=event_type, schema_version=CURRENT_SCHEMA_VERSION,
                      recorded_at=rfc3339(at), data=data, meta=self.meta, hash="")
        self._hash = export.chain_hash(self._hash, event)
        self.events.append(msgspec.structs.replace(event, hash=self._hash))

    def retime_last(self, at: str) -> None:
        """Move the last event to time `at` (the view's updated_at is the last event's)."""
        last = self.events.pop()
        self._hash = self.events[-1].hash if self.events else ""
        self.add(last.type, last.data, at)

    def document(self) -> dict[str, Any]:
        doc: dict[str, Any] = {
            "format": export.FORMAT, "format_version": export.FORMAT_VERSION,
            "exported_at": now(), "session": None,
            "events": msgspec.to_builtins(self.events), "checkpoints": self.checkpoints,
        }
        doc["checksum"] = export.checksum(doc)
        return doc
