"""A session's view read while a commit that changes it is in flight (docs/protocol.md,
"Writes"): the commit's events may be readable before the writer hears back, so its cached
view may be older than the store's. The read waits for that commit, up to
LANDING_WAIT_S, and answers from the writer's cache, with no store read; past that wait it
reads the store. Either way the view it answers is the landed one. A real daemon on a
SQLite file (PostgreSQL's store is shared: there every view is read from the store), a
real client; the store is wrapped only to hold the commit between landing and answer and
to count the reads of stored views."""

from __future__ import annotations

import anyio
import pytest
from conftest import PATIENCE_S, daemon_config, running_daemon
from faulty_store import FaultyStore, faulty, touches

from sessiond import AsyncClient
from sessiond_daemon.core import writer

pytestmark = pytest.mark.anyio


async def _hold_a_commit(wait_s: float, short_dir: str, monkeypatch: pytest.MonkeyPatch,
                         release_after_read: bool) -> tuple[int, int, int]:
    """Append to "s" and hold its commit after it landed; read the view meanwhile. Returns
    (the version before, the version the read answered, the stored views it read)."""
    monkeypatch.setattr(writer, "LANDING_WAIT_S", wait_s)
    stores: list[FaultyStore] = []
    landed, answer = anyio.Event(), anyio.Event()
    reads = 0

    async def hold() -> None:
        landed.set()
        await answer.wait()

    async def count() -> None:
        nonlocal reads
        reads += 1

    async with running_daemon(daemon_config(short_dir), faulty(stores)) as daemon, \
            AsyncClient(daemon.socket) as client, AsyncClient(daemon.socket) as reader:
        before = (await client.append_message(
            (await client.create_session("s")).session_id, "user", "a")).version
        stores[0].after_commits(touches("s"), hold)
        stores[0].before_reads("state_json", count)
        got: list[int] = []
        async with anyio.create_task_group() as tg:
            tg.start_soon(client.append_message, "s", "user", "b")
            try:
                with anyio.fail_after(PATIENCE_S):  # a guard: the hold must run
                    await landed.wait()  # "b" is stored; the writer has not heard yet

                async def read() -> None:
                    got.append((await reader.get_session("s")).version)

                tg.start_soon(read)
                if release_after_read:
                    with anyio.fail_after(PATIENCE_S):  # a guard: the read must end
                        while not got:
                            await anyio.sleep(0.01)
                else:
                    await anyio.sleep(0.3)
                    assert not got  # the read waits for the commit
            finally:
                answer.set()  # never leave the writer waiting
    return before, got[0], reads


async def test_a_read_waits_for_the_commit_and_answers_from_the_cache(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    before, read, stored_reads = await _hold_a_commit(60.0, short_dir, monkeypatch,
                                                      release_after_read=False)
    assert read == before + 1  # the landed view
    assert stored_reads == 0  # from the writer's cache, once the commit was adopted


async def test_past_the_wait_a_read_answers_the_stored_view(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that takes long (a stalled disk) does not hold the read past the wait:
    it answers from the store, which holds the landed events already."""
    before, read, stored_reads = await _hold_a_commit(0.05, short_dir, monkeypatch,
                                                      release_after_read=True)
    assert read == before + 1
    assert stored_reads == 1
