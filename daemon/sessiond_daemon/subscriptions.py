"""Live subscriptions of one connection: catch up from the store, then follow the writer's bells.

The store is the buffer. A subscriber behind the end reads the store page by
page; once at the end it takes each committed batch straight from the bell the
writer rings, so following costs no store reads. Catch-up is paced by the
consumer (drain); live sends are not awaited, and a consumer whose unread
output passes `max_buffer` bytes is dropped with the position to resume from.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import TaskGroup

from sessiond_schemas import rpc
from sessiond_schemas.errors import InvalidParamsError, OverloadedError, SessionNotFoundError
from sessiond_schemas.events import Event, new_id

from .eventstore import EventStore
from .writer import Bell, Writer

log = structlog.get_logger("sessiond.subscriptions")
_encoder = msgspec.json.Encoder()
PAGE = 500


@dataclass(eq=False)
class _Subscription:
    id: str
    session_id: str | None
    types: frozenset[str] | None
    cursor: int  # every event at or before this position has been considered
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)

    def wants(self, event: Event) -> bool:
        return ((self.session_id is None or event.session_id == self.session_id)
                and (self.types is None or event.type in self.types))


class Subscriptions:
    """The subscriptions of one connection, each a task in the connection's task group."""

    def __init__(self, store: EventStore, writer: Writer, out: asyncio.StreamWriter,
                 tg: TaskGroup, *, max_buffer: int, max_subscriptions: int,
                 on_count: Callable[[int], None]) -> None:
        self.store, self.writer, self.out, self.tg = store, writer, out, tg
        self.max_buffer = max_buffer
        self.max_subscriptions = max_subscriptions
        self._on_count = on_count  # tells the server's total (daemon.stats)
        self._active: dict[str, _Subscription] = {}

    async def subscribe(self, p: rpc.EventsSubscribeParams) -> rpc.SubscribeResult:
        if len(self._active) >= self.max_subscriptions:
            raise OverloadedError(
                f"this connection has {len(self._active)} subscriptions, the most allowed",
                {"retry_after_ms": 1000})
        if p.from_position is not None and p.from_version is not None:
            raise InvalidParamsError("give from_position or from_version, not both",
                                     {"detail": "both given", "path": "$.from_version"})
        await self.writer.watch()  # before the mark (fleet mode: the log is followed)
        try:
            cursor = await self._start(p)
        except BaseException:
            self.writer.unwatch()
            raise
        sub = _Subscription(new_id(), p.session_id, frozenset(p.types) if p.types else None,
                            cursor)
        self._active[sub.id] = sub
        self._on_count(1)
        self.tg.start_soon(self._run, sub)
        return rpc.SubscribeResult(subscription=sub.id, position=cursor)

    async def unsubscribe(self, p: rpc.EventsUnsubscribeParams) -> rpc.UnsubscribeResult:
        sub = self._active.get(p.subscription)
        if sub is None:
            raise InvalidParamsError(f"no subscription {p.subscription} on this connection",
                                     {"detail": "unknown subscription", "path": "$.subscription"})
        sub.scope.cancel()
        self._forget(sub)
        return rpc.UnsubscribeResult(ok=True)

    def cursors(self) -> list[int]:
        """Where each live subscription is (for the lag metrics)."""
        return [sub.cursor for sub in self._active.values()]

    def close(self) -> None:
        """End every subscription (the client stopped sending); requests in flight go on."""
        for sub in list(self._active.values()):
            sub.scope.cancel()

    def revoke(self, reason: str) -> None:
        """End every subscription at once, each with subscription.dropped giving `reason`
        (the peer lost its access): no event is sent after this."""
        for sub in list(self._active.values()):
            sub.scope.cancel()
            self._drop(sub, reason)
            self._forget(sub)

    async def _start(self, p: rpc.EventsSubscribeParams) -> int:
        """The position after which events are sent."""
        if p.session_id is None:
            if p.from_version is not None:
                raise InvalidParamsError("from_version needs a session_id",
                                         {"detail": "from_version without session_id",
                                          "path": "$.from_version"})
        elif not await self._exists(p.session_id):
            raise SessionNotFoundError(f"session {p.session_id} not found",
                                       {"session_id": p.session_id})
        if p.from_position is not None:
            return p.from_position
        # Taken before the look-up: an event committed while it runs is either seen by it
        # or lies past this mark, so none falls between the two.
        mark = self.writer.committed_position
        if p.from_version is not None and p.session_id is not None:
            first = await self.store.first_position(p.session_id, p.from_version)
            if first is not None:
                return first - 1
        return mark  # from now (or from the first event at from_version, when it comes)

    async def _exists(self, session_id: str) -> bool:
        return (self.writer.cached(session_id) is not None
                or await self.store.state_json(session_id) is not None)

    def _forget(self, sub: _Subscription) -> None:
        if self._active.pop(sub.id, None) is not None:
            self._on_count(-1)
            self.writer.unwatch()

    def _notify(self, method: str, params: Any) -> None:
        self.out.write(_encoder.encode(
            rpc.Notification(jsonrpc="2.0", method=method, params=params)) + b"\n")

    def _send_events(self, sub: _Subscription, events_json: list[bytes]) -> None:
        # subscription.event notifications spliced around each event's JSON (encoded once
        # per batch, not once per subscriber), in one write: one syscall per batch.
        # Subscription ids are ULIDs, so they need no escaping.
        head = (b'{"jsonrpc":"2.0","method":"subscription.event","params":{"subscription":"'
                + sub.id.encode() + b'","event":')
        self.out.writelines([head + e + b"}}\n" for e in events_json])

    async def _run(self, sub: _Subscription) -> None:
        try:
            with sub.scope:
                bell = await self._catch_up(sub)
                if sub.session_id is not None and not await self._exists(sub.session_id):
                    self._drop(sub, "session deleted")
                    return
                self._notify("subscription.caught_up",
                             rpc.SubscriptionCaughtUp(subscription=sub.id, position=sub.cursor))
                await self._follow(sub, bell)
        except ConnectionError:
            pass  # the client went away
        finally:
            self._forget(sub)

    async def _catch_up(self, sub: _Subscription) -> Bell:
        """Send stored events up to the end of the store; return the bell to follow from."""
        while True:
            # Taken together, with no await between: everything up to `upto` is in the
            # store, everything after it comes through `bell` and its successors.
            bell, upto = self.writer.bell, self.writer.committed_position
            if sub.cursor >= upto:
                return bell
            while sub.cursor < upto:
                page = await self.store.read_after(sub.cursor, upto, sub.session_id, sub.types,
                                                   PAGE)
                self._send_events(sub, [_encoder.encode(event) for event in page])
                sub.cursor = page[-1].position if len(page) == PAGE else upto
                await self.out.drain()  # catch-up goes at the consumer's pace

    async def _follow(self, sub: _Subscription, bell: Bell) -> None:
        while True:
            await bell.rung.wait()
            self._send_events(sub, [
                event_json for event, event_json in zip(bell.events, bell.encoded(), strict=True)
                if event.position > sub.cursor and sub.wants(event)])
            if bell.events:
                sub.cursor = max(sub.cursor, bell.events[-1].position)
            if sub.session_id is not None and sub.session_id in bell.deleted:
                self._drop(sub, "session deleted")
                return
            waiting = self.out.transport.get_write_buffer_size()
            if waiting > self.max_buffer:
                self._drop(sub, f"consumer too slow: {waiting} bytes unread, limit "
                                f"{self.max_buffer}; resubscribe from last_position")
                return
            assert bell.next is not None
            bell = bell.next

    def _drop(self, sub: _Subscription, reason: str) -> None:
        log.info("subscription.dropped", subscription=sub.id,
                 reason=reason.split(":", maxsplit=1)[0])
        self._notify("subscription.dropped", rpc.SubscriptionDropped(
            subscription=sub.id, reason=reason, last_position=sub.cursor))
