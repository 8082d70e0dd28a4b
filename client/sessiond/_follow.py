"""Following events, blocking: the bookkeeping both forms share, and a generator.

Both forms resubscribe by themselves, from the last position they handed out,
after the daemon drops a lagging subscription or after the daemon restarts, and
skip anything they already handed out: the caller sees every matching event
once, in position order.
"""

from __future__ import annotations

import itertools
import socket
import time
from collections.abc import Callable, Iterator
from typing import Any

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.errors import ShuttingDownError
from sessiond_schemas.events import Event

from ._wire import connect_blocking, raise_for

_encoder = msgspec.json.Encoder()
_message_decoder = msgspec.json.Decoder(rpc.Response)
_event_decoder = msgspec.json.Decoder(rpc.SubscriptionEvent)
_caught_up_decoder = msgspec.json.Decoder(rpc.SubscriptionCaughtUp)
_dropped_decoder = msgspec.json.Decoder(rpc.SubscriptionDropped)
_subscribe_decoder = msgspec.json.Decoder(rpc.SubscribeResult)
RESUBSCRIBE_PAUSE = 0.05  # seconds; keeps a daemon that is going down from being hammered


class Follower:
    """The bookkeeping both forms share: what to ask for, and what each line means."""

    def __init__(self, session_id: str | None, from_position: int | None,
                 from_version: int | None, types: list[str] | None) -> None:
        self.session_id, self.types = session_id, types
        self._first = {"from_position": from_position, "from_version": from_version}
        self.cursor: int | None = None  # every matching event up to here was handed out
        self.start_position: int | None = None  # where the first subscription began
        self.caught_up = False
        self.answered = False  # the daemon has answered a subscribe of this follower once
        self.ended: str | None = None  # why the daemon ended it for good
        self._ids = itertools.count(1)

    def subscribe_line(self) -> bytes:
        if self.cursor is None:
            start: dict[str, Any] = self._first
        else:
            start = {"from_position": self.cursor}
        params = {k: v for k, v in (("session_id", self.session_id), ("types", self.types),
                                     *start.items()) if v is not None}
        body = {"jsonrpc": "2.0", "id": next(self._ids), "method": "events.subscribe",
                "params": params}
        return _encoder.encode(body) + b"\n"

    def on_line(self, line: bytes) -> Event | bool:
        """An event to hand out, True to go on reading, False to resubscribe."""
        msg = _message_decoder.decode(line)
        params = msg.params if isinstance(msg.params, msgspec.Raw) else msgspec.Raw(b"null")
        if msg.method == "subscription.event":
            event = _event_decoder.decode(params).event
            if self.cursor is not None and event.position <= self.cursor:
                return True  # already handed out before a resubscribe
            self.cursor = event.position
            return event
        if msg.method == "subscription.caught_up":
            self.caught_up = True
            self.cursor = max(self.cursor or 0, _caught_up_decoder.decode(params).position)
            return True
        if msg.method == "subscription.dropped":
            dropped = _dropped_decoder.decode(params)
            self.cursor = max(self.cursor or 0, dropped.last_position)
            if dropped.reason.startswith(("session deleted", "access revoked")):
                self.ended = dropped.reason
            return False
        # The answer to events.subscribe: errors (say, no such session) are raised,
        # except a daemon on its way down: the next one will answer.
        try:
            started = _subscribe_decoder.decode(raise_for(msg))
        except ShuttingDownError:
            return False
        self.answered = True
        if self.cursor is None:
            self.cursor = self.start_position = started.position
        return True


def follow(socket_path: str, *, session_id: str | None = None, from_position: int | None = None,
           from_version: int | None = None, types: list[str] | None = None,
           retry_for: float | None = None,
           on_state: Callable[[str, int | None], None] | None = None) -> Iterator[Event]:
    """Blocking form of Subscription: a generator of events on its own connection.

    `on_state(state, position)` hears of the connection: "lost" when the daemon went away
    (it reconnects by itself), "reconnected" when it is back, "caught_up" when the first
    subscription, or the one after a loss, has handed out every stored event."""
    follower = Follower(session_id, from_position, from_version, types)
    sock: socket.socket | None = None
    lost = False
    tell = on_state or (lambda state, position: None)
    try:
        while follower.ended is None:
            try:
                if sock is None:
                    sock = _connect_blocking(socket_path, retry_for)
                    sock.sendall(follower.subscribe_line())
                    lines = sock.makefile("rb")
                    if lost:
                        tell("reconnected", follower.cursor)
                        follower.caught_up, lost = False, False
                line = lines.readline()
            except ConnectionError:
                line = b""
            if not line and not lost:
                lost = True
                tell("lost", follower.cursor)
            was_caught_up = follower.caught_up
            outcome = follower.on_line(line) if line else False
            if follower.caught_up and not was_caught_up:
                tell("caught_up", follower.cursor)
            if isinstance(outcome, Event):
                yield outcome
            elif outcome is False:  # dropped, or the daemon went away: resubscribe
                if sock is not None:
                    sock.close()
                sock = None
                time.sleep(RESUBSCRIBE_PAUSE)
    finally:
        if sock is not None:
            sock.close()


def backoff(retry_for: float | None) -> Iterator[float]:
    """Pauses between reconnection attempts: 50 ms doubling to 1 s, for `retry_for` seconds
    (None: for ever). When it runs out, the caller gives up with the last error."""
    deadline = None if retry_for is None else time.monotonic() + retry_for
    delay = 0.05
    while deadline is None or time.monotonic() < deadline:
        yield delay
        delay = min(delay * 2, 1.0)


def _connect_blocking(path: str, retry_for: float | None) -> socket.socket:
    pauses = backoff(retry_for)
    while True:
        try:
            return connect_blocking(path)
        except OSError:  # DaemonUnavailableError: try again; an impostor is raised at once
            pause = next(pauses, None)
            if pause is None:
                raise
            time.sleep(pause)
