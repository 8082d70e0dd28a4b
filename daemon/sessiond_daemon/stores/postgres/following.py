"""The PostgreSQL store's `SharedLog` capability: one LISTEN connection (listener.py)
wakes a follower of the shared log (follow.py), and a poll covers a lost NOTIFY; the
follower hands the daemon every host's events, in position order (serve/lifecycle.py rings the
writer's bells with them, so subscriptions see them all)."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio

from sessiond_daemon.stores.postgres.follow import Follower, LogReads
from sessiond_daemon.stores.postgres.listener import Listener
from sessiond_schemas.events import Event


class SharedLogFollower:
    def __init__(self, store: LogReads, connect: Callable[[], Awaitable[Any]],
                 deliver: Callable[[list[Event], int], Awaitable[None]], *, cursor: int,
                 at: Callable[[], int], deleted: Callable[[frozenset[str]], None],
                 on_state: Callable[[bool], None],
                 needed: Callable[[], bool] | None = None) -> None:
        self.follower = Follower(store, deliver, cursor=cursor, at=at, deleted=deleted,
                                 needed=needed)
        self.listener = Listener(connect, self.follower.wake, on_state=on_state,
                                 on_hint=self.follower.hint)

    def wake(self) -> None:
        self.follower.wake()

    def hint(self, position: int) -> None:
        self.follower.hint(position)

    async def resume(self) -> None:
        await self.follower.resume()

    def idle(self) -> None:
        self.follower.idle()

    async def run(self) -> None:
        async with anyio.create_task_group() as tg:
            tg.start_soon(self.follower.run)
            tg.start_soon(self.listener.run)
