"""An HTTP live tail's wait on the writer's bells (serve/web/tails.py), on its own."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import anyio
import pytest

from sessiond_daemon.core.bells import Bell, Followers
from sessiond_daemon.serve.web import tails

pytestmark = pytest.mark.anyio


class _Writer:
    """What tails.mark reads of the writer, and its ring (Writer._ring_bell)."""

    def __init__(self) -> None:
        self.followers = Followers()
        self.bell = Bell(self.followers)

    def ring(self, session_id: str) -> None:
        bell = self.bell
        bell.events = [SimpleNamespace(session_id=session_id)]  # all a bell's ring reads
        bell.next = self.bell = Bell(self.followers)
        bell.rung = True
        self.followers.ring(bell)


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the daemon's loop
async def test_a_ring_between_the_timeout_and_the_return_counts() -> None:
    """The wait times out, and before its task runs again a bell rings for its session:
    the wait says it was woken. (Said False, the tail would take its next mark past
    that bell and wait on without the event.)"""
    writer = _Writer()
    bell = tails.mark(writer)  # type: ignore[arg-type]
    loop = asyncio.get_running_loop()
    waiting = asyncio.ensure_future(tails.wait_for(bell, "s", 0.05))
    await anyio.sleep(0)
    assert len(writer.followers) == 1  # it waits now, as a follower of "s"
    loop.call_later(0.06, writer.ring, "s")  # due just after the timeout
    time.sleep(0.1)  # the loop is busy: both are due when it next looks
    assert await waiting is True
