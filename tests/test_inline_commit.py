"""Where a SQLite commit runs (issue 31 §2): a small batch of one session commits on the
event loop's own thread (no hop to the writer thread and back); anything bigger, anything
while the writer thread has work, and everything while commits are slow, on the writer
thread. Either way the connection is used by one thread at a time."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest

from sessiond_daemon.core.writer import Command, Plan, Writer
from sessiond_daemon.stores.interface import Batch, Moved
from sessiond_daemon.stores.sqlite import SqliteStore
from sessiond_daemon.stores.sqlite.store import INLINE_MAX_BYTES, INLINE_SLOW_S
from sessiond_schemas.events import EventMeta, MessageAppended, SessionCreated, new_id

pytestmark = pytest.mark.anyio


class WatchedStore(SqliteStore):
    """The real SQLite store, saying on which thread each commit ran; `delay_s` makes each
    commit take that much longer (a slow disk's fsync)."""

    def __init__(self, path: str) -> None:
        super().__init__(path)
        self.threads: list[str] = []
        self.delay_s = 0.0
        self.running = threading.Lock()  # held while a commit runs: never two at once

    def _commit_now(self, batch: Batch) -> Moved | None:
        assert self.running.acquire(blocking=False), "two threads in the connection"
        try:
            self.threads.append(threading.current_thread().name)
            if self.delay_s:
                time.sleep(self.delay_s)
            return super()._commit_now(batch)
        finally:
            self.running.release()


def creating(state: Any) -> Plan:
    return Plan([("session.created", SessionCreated())], lambda s, events: {"version": s.version})


def appending(content: str) -> Any:
    def plan(state: Any) -> Plan:
        appended = MessageAppended(message_id=new_id(), sequence=state.message_count,
                                   role="user", content=content)
        return Plan([("message.appended", appended)], lambda s, events: {"version": s.version})
    return plan


@pytest.fixture
async def store(short_dir: str) -> AsyncIterator[WatchedStore]:
    s = WatchedStore(os.path.join(short_dir, "w.db"))
    await s.open()
    try:
        yield s
    finally:
        await s.close()


async def write(writer: Writer, sid: str, plan: Any) -> bytes:
    return await writer.submit(Command(session_id=sid, plan=plan, meta=EventMeta()))


async def test_a_small_commit_runs_on_the_loops_thread_a_big_one_on_the_writers(
        store: WatchedStore) -> None:
    loop_thread = threading.current_thread().name
    writer = Writer(store, max_queue=32, max_batch=32, cache_size=32)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        await write(writer, "a", creating)
        await write(writer, "b", creating)
        await write(writer, "a", appending("hi"))
        assert store.threads == [loop_thread] * 3
        store.threads.clear()
        # Past INLINE_MAX_BYTES of data: the writer thread.
        await write(writer, "a", appending("x" * (INLINE_MAX_BYTES + 1)))
        # Two sessions in one batch (both queued before the writer task wakes): the
        # writer thread too.
        before = writer.transactions
        async with anyio.create_task_group() as both:
            both.start_soon(write, writer, "a", appending("one"))
            both.start_soon(write, writer, "b", appending("two"))
        assert writer.transactions == before + 1  # one batch
        writer.close()
    assert store.threads == ["sessiond-writer"] * 2, store.threads


async def test_a_commit_waits_for_the_writer_threads_work_and_runs_there(
        store: WatchedStore) -> None:
    """While a call is queued or running on the writer thread (a checkpoint, a reindex, a
    view read), a commit is not run beside it on the loop's thread: it is queued after
    it, on the writer thread."""
    order: list[str] = []
    release = threading.Event()
    started = threading.Event()

    def slow_call() -> None:
        started.set()
        release.wait(10)
        order.append("call done")

    writer = Writer(store, max_queue=32, max_batch=32, cache_size=32)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        await write(writer, "a", creating)
        store.threads.clear()
        tg.start_soon(store._on_writer, slow_call)
        await anyio.to_thread.run_sync(started.wait)

        async def append() -> None:
            await write(writer, "a", appending("after the call"))
            order.append("committed")

        tg.start_soon(append)
        await anyio.sleep(0.05)
        assert order == []  # the commit waits behind the call
        release.set()
        with anyio.fail_after(10):
            while len(order) < 2:
                await anyio.sleep(0.01)
        writer.close()
    assert order == ["call done", "committed"]
    assert store.threads == ["sessiond-writer"]


async def test_while_commits_are_slow_they_run_on_the_writer_thread(
        store: WatchedStore) -> None:
    """A disk whose fsync is slow would hold up the whole loop: once the recent commits
    average INLINE_SLOW_S or more, they go to the writer thread; once fast again, back."""
    loop_thread = threading.current_thread().name
    writer = Writer(store, max_queue=32, max_batch=32, cache_size=32)
    async with anyio.create_task_group() as tg:
        await tg.start(writer.run)
        await write(writer, "a", creating)
        store.delay_s = 4 * INLINE_SLOW_S
        for i in range(12):
            await write(writer, "a", appending(f"slow {i}"))
        slow = list(store.threads[1:])
        assert slow[0] == loop_thread  # nothing was known to be slow yet
        assert slow[-4:] == ["sessiond-writer"] * 4, slow
        store.delay_s = 0.0
        store.threads.clear()
        for i in range(80):
            await write(writer, "a", appending(f"fast {i}"))
        assert store.threads[-10:] == [loop_thread] * 10, store.threads
        writer.close()
