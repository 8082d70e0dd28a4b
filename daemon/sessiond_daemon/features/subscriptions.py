"""Live subscriptions of one connection: catch up from the store, then follow the writer's bells.

The store is the buffer. A subscriber behind the end reads the store page by
page; once at the end it takes each committed batch straight from the bell the
writer rings, so following costs no store reads. It is a follower of the bells from
its start, but takes nothing from them until caught up (a deletion of its session
excepted, noted): while it catches up, and once live, it holds its cursor, never a
bell. Catch-up is paced by the consumer (drain); live sends are not awaited, and a
consumer whose unread output passes `max_buffer` bytes is dropped with the position to resume from.

A live subscription is a follower of the writer's bells (core/bells.py), indexed by its
session: a commit calls only the subscriptions of the sessions it touched (and those of
every session), synchronously as it rings, and each connection writes what they send in
one write. A subscription of another session costs nothing per commit. Its task only
waits to be cancelled (for the connection's task group to end it with the connection).
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

from sessiond_daemon.core.bells import Bell
from sessiond_daemon.core.writer import Writer
from sessiond_daemon.stores.interface import EventStore
from sessiond_schemas import rpc
from sessiond_schemas.errors import InvalidParamsError, OverloadedError, SessionNotFoundError
from sessiond_schemas.events import Event, new_id

log = structlog.get_logger("sessiond.subscriptions")
_encoder = msgspec.json.Encoder()
PAGE = 500


@dataclass(eq=False)
class _Subscription:
    id: str
    session_id: str | None
    types: frozenset[str] | None
    cursor: int  # every event at or before this position has been considered
    owner: Subscriptions
    scope: anyio.CancelScope = field(default_factory=anyio.CancelScope)
    # Live: caught up and a follower of the bells. Every event up to the writer's
    # committed_position has been considered then, rung or not for this subscription.
    live: bool = False
    deleted: bool = False  # a bell rang its session's deletion while it caught up
    head: bytes = b""  # of its subscription.event notifications, before the event
    between: bytes = b""  # after one event, before the next one's

    def __post_init__(self) -> None:
        self.head = (b'{"jsonrpc":"2.0","method":"subscription.event","params":'
                     b'{"subscription":"' + self.id.encode() + b'","event":')
        self.between = b"}}\n" + self.head

    def wants(self, event: Event) -> bool:
        return ((self.session_id is None or event.session_id == self.session_id)
                and (self.types is None or event.type in self.types))

    def ring(self, bell: Bell) -> Subscriptions | None:
        if not self.live:  # catching up: the events are read from the store
            if self.session_id is not None and self.session_id in bell.deleted:
                self.deleted = True
            return None
        self.owner.take(self, bell)
        return self.owner


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
        # What the subscriptions rung by the bell in hand send (one write: flush), and
        # those rung, to end after it if it deleted their session or the consumer is slow.
        self._pending: list[bytes] = []
        self._rung: list[tuple[_Subscription, bool]] = []

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
                            cursor, self)
        self._active[sub.id] = sub
        self._on_count(1)
        self.tg.start_soon(self._run, sub)
        return rpc.SubscribeResult(subscription=sub.id, position=cursor)

    async def unsubscribe(self, p: rpc.EventsUnsubscribeParams) -> rpc.UnsubscribeResult:
        sub = self._active.get(p.subscription)
        if sub is None:
            raise InvalidParamsError(f"no subscription {p.subscription} on this connection",
                                     {"detail": "unknown subscription", "path": "$.subscription"})
        self._end(sub)  # no event for it after this answer
        return rpc.UnsubscribeResult(ok=True)

    def cursors(self) -> list[int]:
        """Where each live subscription is (for the lag metrics)."""
        return [self._position(sub) for sub in self._active.values()]

    def close(self) -> None:
        """End every subscription (the client stopped sending); requests in flight go on."""
        for sub in list(self._active.values()):
            self._end(sub)

    def revoke(self, reason: str) -> None:
        """End every subscription at once, each with subscription.dropped giving `reason`
        (the peer lost its access): no event is sent after this."""
        for sub in list(self._active.values()):
            self._end(sub, reason)

    def _position(self, sub: _Subscription) -> int:
        """Every event at or before this position has been considered for `sub`."""
        return max(sub.cursor, self.writer.committed_position) if sub.live else sub.cursor

    def _end(self, sub: _Subscription, reason: str | None = None) -> None:
        """End `sub` now: no event is sent for it after this (`reason`: say so in a
        subscription.dropped, with the position to resume from)."""
        self.writer.followers.discard(sub.session_id, sub)
        sub.scope.cancel()
        if reason is not None and sub.id in self._active:
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
        if events_json:
            self.out.write(sub.head + sub.between.join(events_json) + b"}}\n")

    async def _run(self, sub: _Subscription) -> None:
        try:
            with sub.scope:
                # A follower from here on (rung for nothing but its session's deletion
                # until live): no deletion falls between the checks below and going live.
                self.writer.followers.add(sub.session_id, sub)
                await self._catch_up(sub)
                if sub.session_id is not None and not await self._exists(sub.session_id):
                    sub.deleted = True
                await self._catch_up(sub)  # what landed meanwhile; then live, no await
                sub.live = True
                if sub.deleted:
                    self._drop(sub, "session deleted")
                    return
                self._notify("subscription.caught_up",
                             rpc.SubscriptionCaughtUp(subscription=sub.id, position=sub.cursor))
                await anyio.sleep_forever()  # live: the bells call it (take), ended by _end
        except ConnectionError:
            pass  # the client went away
        finally:
            self._end(sub)

    async def _catch_up(self, sub: _Subscription) -> None:
        """Send stored events up to the end of the store: on return (no await since it
        read `committed_position`), every batch past the cursor is still to be rung."""
        while (upto := self.writer.committed_position) > sub.cursor:
            while sub.cursor < upto:
                page = await self.store.read_after(sub.cursor, upto, sub.session_id, sub.types,
                                                   PAGE)
                self._send_events(sub, [_encoder.encode(event) for event in page])
                sub.cursor = page[-1].position if len(page) == PAGE else upto
                del page
                await self.out.drain()  # catch-up goes at the consumer's pace

    def take(self, sub: _Subscription, bell: Bell) -> None:
        """`sub`'s part of a rung batch, sent at the flush (with the other subscriptions'
        of this connection rung by the same bell)."""
        events = bell.events
        if events:
            cursor = sub.cursor
            if sub.session_id is None and sub.types is None and events[0].position > cursor:
                sent = bell.encoded()
            else:
                sent = [event_json for event, event_json in zip(events, bell.encoded(),
                                                                strict=True)
                        if event.position > cursor and sub.wants(event)]
            if sent:  # its notifications as one bytes: the events joined by head and tail
                self._pending.append(sub.head + sub.between.join(sent) + b"}}\n")
            sub.cursor = max(cursor, events[-1].position)
        self._rung.append((sub, sub.session_id is not None and sub.session_id in bell.deleted))

    def flush(self) -> None:
        """Write what the rung subscriptions send, in one write; then end those whose
        session the batch deleted, and all of them if the consumer is too slow."""
        pending, rung = self._pending, self._rung
        self._pending, self._rung = [], []
        if len(pending) == 1:
            self.out.write(pending[0])
        elif pending:
            self.out.writelines(pending)
        waiting = self.out.transport.get_write_buffer_size()
        for sub, deleted in rung:
            if deleted:
                self._end(sub, "session deleted")
            elif waiting > self.max_buffer:
                self._end(sub, f"consumer too slow: {waiting} bytes unread, limit "
                               f"{self.max_buffer}; resubscribe from last_position")

    def _drop(self, sub: _Subscription, reason: str) -> None:
        log.info("subscription.dropped", subscription=sub.id,
                 reason=reason.split(":", maxsplit=1)[0])
        self._notify("subscription.dropped", rpc.SubscriptionDropped(
            subscription=sub.id, reason=reason, last_position=self._position(sub)))
