"""An HTTP live tail's wait on the writer's bells (serve/web/tails.py), on its own."""

from __future__ import annotations

import asyncio
import gc
import time
import weakref
from types import SimpleNamespace

import anyio
import pytest

from sessiond_daemon.core.bells import Bell, Followers
from sessiond_daemon.serve.web import tails

pytestmark = pytest.mark.anyio


class _Writer:
    """What tails.following uses of the writer, and its ring (Writer._ring_bell)."""

    def __init__(self) -> None:
        self.followers = Followers()
        self.watchers = 0

    async def watch(self) -> None:
        self.watchers += 1

    def unwatch(self) -> None:
        self.watchers -= 1

    def watching(self) -> object:
        from contextlib import asynccontextmanager

        @asynccontextmanager
        async def block():  # type: ignore[no-untyped-def]
            await self.watch()
            try:
                yield
            finally:
                self.unwatch()

        return block()

    def ring(self, session_id: str, events: list[object] | None = None) -> None:
        self.followers.ring(Bell(events or [SimpleNamespace(session_id=session_id)],  # type: ignore[arg-type]
                                 frozenset()))


@pytest.mark.parametrize("anyio_backend", ["asyncio"])  # the daemon's loop
async def test_a_ring_between_the_timeout_and_the_return_counts() -> None:
    """The wait times out, and before its task runs again a bell rings for its session:
    the wait says it was woken. (Said False, the tail would take its next mark past
    that bell and wait on without the event.)"""
    writer = _Writer()
    async with tails.following(writer, "s") as tail:  # type: ignore[arg-type]
        assert len(writer.followers) == 1 and writer.watchers == 1
        loop = asyncio.get_running_loop()
        waiting = asyncio.ensure_future(tail.wait(0.05))
        await anyio.sleep(0)
        loop.call_later(0.06, writer.ring, "s")  # due just after the timeout
        time.sleep(0.1)  # the loop is busy: both are due when it next looks
        assert await waiting is True
    assert len(writer.followers) == 0 and writer.watchers == 0


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_ring_during_the_read_wakes_the_wait_after_it() -> None:
    """A bell rung between the mark and the wait (while the tail reads) is not missed;
    one rung before the mark is (the read saw its batch), and one of another session
    never wakes it."""
    writer = _Writer()
    async with tails.following(writer, "s") as tail:  # type: ignore[arg-type]
        writer.ring("s")
        tail.mark()  # the read that follows sees that batch
        writer.ring("other")
        assert await tail.wait(0.01) is False
        writer.ring("s")  # lands during the read
        assert await tail.wait(60) is True


@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_waiting_tail_keeps_no_batch() -> None:
    """Rung batches of its own session and of others are freed while a tail waits: it
    keeps a flag, not a bell (issue 45 §2: a tail held every batch written after it)."""
    writer = _Writer()

    class Batch:  # an event list that can be watched for being freed
        def __init__(self, sid: str) -> None:
            self.session_id = sid

    async with tails.following(writer, "s") as tail:  # type: ignore[arg-type]
        gone = []
        for sid in ("s", "other", "s"):
            event = Batch(sid)
            gone.append(weakref.ref(event))
            writer.ring(sid, [event])
            del event
        gc.collect()
        assert [ref() for ref in gone] == [None, None, None]
        assert await tail.wait(0) is True
