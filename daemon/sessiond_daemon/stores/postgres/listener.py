"""The one LISTEN connection of a daemon: wakes the follower of the shared log (follow.py)
on each NOTIFY, and on a periodic poll in case a notification was lost with a connection.

A notification is a wake-up only (its payload, the batch's last position, is a hint,
passed to `on_hint`: every position up to it is committed): the woken code reads the
events table past its own cursor, in position order. The
connection is checked at every poll; when it is lost the listener says so (`connected`,
`on_state`), reconnects with exponential backoff, and wakes once on reconnecting, since
notifications sent while it was away are gone.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import asyncpg
import structlog

from sessiond_daemon.stores.postgres.store import CHANNEL

log = structlog.get_logger("sessiond.store")


class Listener:
    def __init__(self, connect: Callable[[], Awaitable[Any]], on_wake: Callable[[], None], *,
                 channel: str = CHANNEL, poll_s: float = 1.0, backoff_s: float = 0.1,
                 max_backoff_s: float = 5.0,
                 on_state: Callable[[bool], None] | None = None,
                 on_hint: Callable[[int], None] | None = None) -> None:
        self._connect = connect
        self._on_wake = on_wake
        self.channel = channel
        self.poll_s = poll_s
        self.backoff_s = backoff_s
        self.max_backoff_s = max_backoff_s
        self._on_state = on_state
        # Given the payload (the batch's last position) instead of waking, when set.
        self._on_hint = on_hint
        self.connected = False
        self.connects = 0  # connections made (reconnections are connects - 1)
        self.notifications = 0
        self._lost = anyio.Event()

    def _notified(self, _con: Any, _pid: int, _channel: str, payload: str) -> None:
        self.notifications += 1
        if self._on_hint is not None and payload.isdigit():
            self._on_hint(int(payload))
        else:
            self._on_wake()

    def _terminated(self, _con: Any) -> None:
        self._lost.set()

    def _set_state(self, connected: bool) -> None:
        if connected != self.connected:
            self.connected = connected
            if self._on_state is not None:
                self._on_state(connected)

    async def run(self) -> None:
        """Listen until cancelled, reconnecting after every loss."""
        delay = self.backoff_s
        while True:
            con: Any = None
            try:
                con = await self._connect()
                await con.add_listener(self.channel, self._notified)
                con.add_termination_listener(self._terminated)
                self._lost = anyio.Event()
                self.connects += 1
                self._set_state(True)
                log.info("store.listening", channel=self.channel, connects=self.connects)
                delay = self.backoff_s
                self._on_wake()  # what was committed while nobody listened
                await self._watch(con)
            except (OSError, TimeoutError, asyncpg.PostgresError, asyncpg.InterfaceError) as exc:
                self._set_state(False)
                log.warning("store.listener_lost", error=str(exc), retry_in_s=delay)
            finally:
                if con is not None and not con.is_closed():
                    with anyio.CancelScope(shield=True):
                        await con.close(timeout=1)
            self._set_state(False)
            await anyio.sleep(delay)
            delay = min(self.max_backoff_s, delay * 2)

    async def _watch(self, con: Any) -> None:
        """Poll: wake the follower and check the connection every poll_s, until it is lost."""
        while not self._lost.is_set():
            with anyio.move_on_after(self.poll_s):
                await self._lost.wait()
            if self._lost.is_set():
                break
            # Raises when the server went away, or (a half-open connection, as after a
            # failover) answers nothing within a poll.
            await con.fetchval("SELECT 1", timeout=max(self.poll_s, 1.0))
            self._on_wake()
        raise asyncpg.InterfaceError("the LISTEN connection was closed")
