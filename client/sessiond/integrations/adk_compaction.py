"""ADK's event compaction as sessiond compactions (issue 48): an ADK event whose actions
carry an `EventCompaction` (its summarizer's summary of the events between two
timestamps) is stored as every event is, and then marked as a session.compacted (by
"adk") whose summary is the compacted content and which stands for the messages up to
the last event of the compacted range, so session.context (and `sessionctl context`)
answers what the model sees after it. ADK's own reads are unchanged: get_session still
returns every event, the compaction event among them, and ADK builds its prompt from
them as over its own stores."""

from __future__ import annotations

from typing import Any

from google.adk.events.event import Event

from sessiond_schemas.errors import SessionNotFoundError, VersionConflictError

from ._loop import LoopClient

# How far back the compacted range's last event is looked for: the events the compaction
# left out are the newest few (ADK compacts a prefix, then appends the summary event).
WINDOW = 200


def summary_of(event: Event) -> list[dict[str, Any]]:
    """The summary messages of a compaction event: its compacted content's text."""
    compaction = event.actions.compaction
    assert compaction is not None
    parts = compaction.compacted_content.parts or []
    text = "\n".join(p.text for p in parts if p.text) or "[compacted events]"
    return [{"role": "assistant", "content": text, "metadata": {"adk_compaction": {
        "event_id": event.id, "start_timestamp": compaction.start_timestamp,
        "end_timestamp": compaction.end_timestamp}}}]


async def record(client: LoopClient, sid: str, event: Event, version: int) -> int:
    """Mark the compaction event just stored (at `version`) as a session.compacted; the
    session's version after it (or `version`, unchanged, when it cannot be marked: the
    range's end is not among the newest WINDOW messages, or another write came between).
    """
    compaction = event.actions.compaction
    assert compaction is not None
    page = await client.list_messages(sid, order="desc", limit=WINDOW)
    through = None
    for m in page.messages[1:]:  # [0] is the compaction event's own message
        stored = m.metadata.get("adk_event")
        if isinstance(stored, dict) and stored.get("timestamp", float("inf")) \
                <= compaction.end_timestamp:
            through = m.sequence
            break
    if through is None:
        return version
    try:
        state = await client.compact(sid, summary_of(event), through_sequence=through,
                                     by="adk", expected_version=version)
    except (VersionConflictError, SessionNotFoundError):
        return version
    return int(state.version)
