"""Compaction and the context read: session.compact writes a session.compacted event (a
summary that stands for the messages before it; nothing is cut), session.context reads
what the model sees now, the last summary and the messages after it, in time and memory
proportional to that tail (the view says where it starts; the message index pages it)."""

from __future__ import annotations

import msgspec

from sessiond_daemon.core.commands import Commands, require
from sessiond_daemon.core.histories import unreadable_error
from sessiond_daemon.core.request import page_budget
from sessiond_daemon.core.writer import Plan
from sessiond_daemon.stores.interface import Page, Store
from sessiond_schemas import rpc
from sessiond_schemas.bounds import INT64_MAX
from sessiond_schemas.errors import InvalidParamsError
from sessiond_schemas.events import Event, EventMeta, SessionCompacted
from sessiond_schemas.state import ContextStart, Message, SessionState


def compaction_data(p: rpc.SessionCompactParams, s: SessionState) -> SessionCompacted:
    """The session.compacted event of `p` on the view `s`: through_sequence checked
    against its messages (left out: every one so far), through_version its version now."""
    through = s.message_count - 1 if p.through_sequence is None else p.through_sequence
    if through >= s.message_count:
        raise InvalidParamsError(
            f"through_sequence {through} is past session {s.session_id}'s"
            f" {s.message_count} messages (the last is {s.message_count - 1})",
            {"detail": "through_sequence too large", "path": "$.through_sequence"})
    return SessionCompacted(summary=p.summary, through_sequence=through,
                            through_version=s.version, by=p.by, reason=p.reason)


class Context:
    """The methods of compaction: session.compact and session.context."""

    def __init__(self, store: Store, commands: Commands) -> None:
        self.store = store
        self.commands = commands

    async def session_compact(self, p: rpc.SessionCompactParams,
                              meta: EventMeta) -> msgspec.Raw:
        for m in p.summary:
            self.commands.check_message(m)

        def plan(state: SessionState | None) -> Plan:
            data = compaction_data(p, require(state, p.session_id))
            self.commands.check_event_size(data, "session.compacted data")
            return Plan([("session.compacted", data)], lambda s, ev: s,
                        paths=["$.summary"])

        return await self.commands.submit_params(p, meta, plan)

    async def session_context(self, p: rpc.SessionContextParams,
                              meta: EventMeta) -> rpc.SessionContextResult:
        state = await self.commands.state(p.session_id)
        start = state.context
        through = start.through_sequence if start is not None else -1
        first = max(through, -1 if p.after_sequence is None else p.after_sequence) + 1
        messages: Page[Message] = Page() if first > INT64_MAX or first >= state.message_count \
            else await self.store.list_messages(p.session_id, first=first, limit=p.limit,
                                                descending=False, max_bytes=page_budget.get())
        compaction, summary = None, []
        if start is not None:
            data = await self.compaction(start)
            compaction = rpc.Compaction(
                session_id=start.session_id, version=start.version,
                through_sequence=data.through_sequence, through_version=data.through_version,
                recorded_at=start.recorded_at, by=data.by, reason=data.reason)
            if p.after_sequence is None:
                summary = data.summary
        last = messages[-1].sequence if messages else None
        more = last is not None and last + 1 < state.message_count
        return rpc.SessionContextResult(
            session_id=state.session_id, version=state.version, compaction=compaction,
            summary=summary, messages=messages,
            total=max(0, state.message_count - through - 1),
            next=last if more else None, truncated_by_bytes=messages.cut)

    async def compaction(self, start: ContextStart) -> SessionCompacted:
        """The session.compacted event the context starts at: one event, read by version."""
        data = (await self.compaction_event(start)).data
        assert isinstance(data, SessionCompacted)
        return data

    async def compaction_event(self, start: ContextStart) -> Event:
        """The session.compacted event itself (its meta says who wrote it)."""
        events = await self.store.read_events(
            session_id=start.session_id, from_version=start.version, after_position=0,
            limit=1, types=None)
        event = events[0] if events and events[0].version == start.version else None
        if event is None or not isinstance(event.data, SessionCompacted):
            raise unreadable_error(start.session_id, LookupError(
                f"its compaction at version {start.version} is not there"
                f" ({events[0].type if events else 'no event'})"))
        return event
