"""Small builders shared by the unit tests of the fold."""

from __future__ import annotations

from typing import Any

import msgspec

from sessiond_schemas.events import Event, EventMeta
from sessiond_schemas.export import canonical


class History:
    """Builds a session's events one by one, as the writer would number them."""

    def __init__(self, session_id: str = "s1", **created: Any) -> None:
        self.session_id = session_id
        self.events: list[Event] = []
        self.add("session.created", created, at="2026-01-01T00:00:00.000000Z")

    def add(self, event_type: str, data: dict[str, Any], at: str | None = None) -> Event:
        version = len(self.events) + 1
        event = Event(
            position=version, session_id=self.session_id, version=version,
            event_id=f"e{version}", type=event_type, schema_version=1,
            recorded_at=at or f"2026-01-01T00:00:{version:02d}.000000Z",
            data_json=msgspec.Raw(canonical(data)), meta=EventMeta(), hash="",
        )
        self.events.append(event)
        return event

    def message(self, role: str, content: str, **extra: Any) -> Event:
        seq = sum(1 for e in self.events if e.type == "message.appended")
        return self.add("message.appended", {"message_id": f"m{seq}", "sequence": seq,
                                             "role": role, "content": content, **extra})

    def status(self, frm: str, to: str, at: str | None = None, **extra: Any) -> Event:
        return self.add("session.status_changed", {"from": frm, "to": to, **extra}, at=at)
