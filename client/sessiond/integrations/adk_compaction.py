"""ADK's event compaction as sessiond compactions (issue 48): an ADK event whose actions
carry an `EventCompaction` (its summarizer's summary of the events between two
timestamps) is stored as every event is, and marked as a session.compacted (by
"adk", in the same write) whose summary is the compacted content and which stands for
the messages up to the last event of the compacted range, so session.context (and
`sessionctl context`) answers what the model sees after it. ADK's own reads are
unchanged: get_session still returns every event, the compaction event among them, and
ADK builds its prompt from them as over its own stores."""

from __future__ import annotations

from typing import Any

from google.adk.events.event import Event

from sessiond_schemas.errors import SessionNotFoundError

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


async def compacted(client: LoopClient, sid: str, event: Event) -> list[dict[str, Any]]:
    """The session.compacted to append with compaction event `event`, in the same write (an
    events.append item): it stands for the messages up to the last one of the compacted
    range, looked for among the newest WINDOW (none found: nothing, the event alone)."""
    compaction = event.actions.compaction
    assert compaction is not None
    try:
        page = await client.list_messages(sid, order="desc", limit=WINDOW)
    except SessionNotFoundError:
        return []  # the append says so
    for m in page.messages:
        stored = m.metadata.get("adk_event")
        if isinstance(stored, dict) and isinstance(stored.get("timestamp"), (int, float)) \
                and stored["timestamp"] <= compaction.end_timestamp:
            return [{"type": "session.compacted", "data": {
                "summary": summary_of(event), "through_sequence": m.sequence, "by": "adk"}}]
    return []
