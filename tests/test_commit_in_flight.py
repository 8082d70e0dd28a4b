"""A session's view read while a commit that changes it is in flight (docs/protocol.md,
"Writes"): the commit's events may be readable before the writer hears back, so its cached
view may be older than the store's. The read waits for that commit, up to
LANDING_WAIT_S, and is answered with the view the commit left, with no store read, even
when the writer has begun its next commit by then; past the wait, or when the commit
fails or deletes the session, it reads the store. Either way it answers what is stored.
A real daemon on a SQLite file (PostgreSQL's store is shared: there every view is read
from the store), real clients; the store is wrapped only to hold commits (after they
land, or before they are written and then fail) and to count the reads of stored views."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from conftest import PATIENCE_S, daemon_config, eventually, running_daemon
from faulty_store import FaultyStore, faulty, touches

from sessiond import AsyncClient, SessionNotFoundError, StorageError
from sessiond_daemon.core import writer
from sessiond_daemon.stores.interface import Batch
from sessiond_daemon.stores.sqlite import store as sqlite_store

pytestmark = pytest.mark.anyio


class Held:
    """The daemon of a test: the commits `hold` picks (by default those appending to "s")
    held, one release each; the stored views it reads counted; its writer seen when a read
    of "s" waits, and whether a commit of "s" was in flight again when that read was
    answered."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, wait_s: float) -> None:
        monkeypatch.setattr(writer, "LANDING_WAIT_S", wait_s)
        # No search-index catch-up between batches (due 0.2 s after an indexed event):
        # the writer goes from one commit straight to the next queued one.
        monkeypatch.setattr(sqlite_store, "INDEX_LAG_S", 3600.0)
        self.stores: list[FaultyStore] = []
        self.held = 0  # commits held (or released)
        self.releases: list[anyio.Event] = []
        self.stored_reads = 0
        self.waiting = anyio.Event()  # a read of "s" found a commit of it in flight
        self.in_flight_after: list[bool] = []  # per such read, when it was answered
        self.writer: writer.Writer | None = None
        original = writer.Writer.view

        async def view(w: writer.Writer, session_id: str) -> Any:
            waits = session_id == "s" and session_id in w._committing
            if waits:
                self.writer = w
                self.waiting.set()
            state = await original(w, session_id)
            if waits:
                self.in_flight_after.append(session_id in w._committing)
            return state

        monkeypatch.setattr(writer.Writer, "view", view)

    def hold(self, *, fail: bool, rule: Callable[[Batch], bool] | None = None) -> None:
        """Hold the commits `rule` picks (by default those appending to "s"): after they
        land, or (`fail`) before they are written, then failing them."""
        rule = rule if rule is not None else touches("s")
        async def hold() -> None:
            release = anyio.Event()
            self.releases.append(release)
            self.held += 1
            await release.wait()
            if fail:
                raise StorageError("storage error: disk I/O error; nothing was written",
                                   {"detail": "disk I/O error"})

        async def count() -> None:
            self.stored_reads += 1

        if fail:
            self.stores[0].before_commits(rule, hold)
        else:
            self.stores[0].after_commits(rule, hold)
        self.stores[0].before_reads("state_json", count)

    async def start_read(self, reader: AsyncClient, tg: anyio.abc.TaskGroup) -> list[int]:
        """Start a session.get of "s"; return once it waits for the commit in flight. The
        list returned gets the version it answers."""
        got: list[int] = []

        async def read() -> None:
            got.append((await reader.get_session("s")).version)

        tg.start_soon(read)
        with anyio.fail_after(PATIENCE_S):  # a guard: the read must reach the writer
            await self.waiting.wait()
        return got

    def release_all(self) -> None:
        self.stores[0].heal()
        for release in self.releases:
            release.set()


Body = Callable[[Held, AsyncClient, AsyncClient, int, anyio.abc.TaskGroup], Awaitable[None]]


async def _with_a_held_commit(monkeypatch: pytest.MonkeyPatch, short_dir: str, wait_s: float,
                              body: Body, *, fail: bool = False) -> list[str]:
    """Run `body` with "s" at version `before` and its next commit (appending "b") held;
    return how that append ended ("ok", or the error's message)."""
    held = Held(monkeypatch, wait_s)
    ended: list[str] = []

    async def append(client: AsyncClient) -> None:
        try:
            await client.append_message("s", "user", "b")
            ended.append("ok")
        except StorageError as exc:
            ended.append(exc.message)

    async with running_daemon(daemon_config(short_dir), faulty(held.stores)) as daemon, \
            AsyncClient(daemon.socket) as client, AsyncClient(daemon.socket) as reader:
        before = (await client.append_message(
            (await client.create_session("s")).session_id, "user", "a")).version
        held.hold(fail=fail)
        async with anyio.create_task_group() as tg:
            tg.start_soon(append, client)
            try:
                await eventually(lambda: held.held == 1, "the commit of b held")
                await body(held, client, reader, before, tg)
            finally:
                held.release_all()  # never leave the writer waiting
    return ended


async def test_a_read_waits_for_the_commit_and_answers_from_memory(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    async def body(held: Held, client: AsyncClient, reader: AsyncClient, before: int,
                   tg: anyio.abc.TaskGroup) -> None:
        got = await held.start_read(reader, tg)
        await anyio.sleep(0.1)
        assert not got  # it waits for the commit (LANDING_WAIT_S is a minute here)
        held.releases[0].set()
        await eventually(lambda: got, "the read's answer")
        assert got == [before + 1]  # the landed view
        assert held.stored_reads == 0  # from memory

    assert await _with_a_held_commit(monkeypatch, short_dir, 60.0, body) == ["ok"]


async def test_a_read_gets_its_commits_view_though_the_next_commit_began(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """With writes queued, the writer begins the next commit of the session before the
    waiting read runs again: the read is answered with the view of the commit it waited
    for, still from memory."""

    async def body(held: Held, client: AsyncClient, reader: AsyncClient, before: int,
                   tg: anyio.abc.TaskGroup) -> None:
        got = await held.start_read(reader, tg)
        tg.start_soon(client.append_message, "s", "user", "c")
        w = held.writer
        assert w is not None
        await eventually(lambda: w.queue_depth == 1, "the write of c queued")
        held.releases[0].set()  # the writer adopts b's view, then begins c's commit
        await eventually(lambda: held.held == 2, "the commit of c landing")
        await eventually(lambda: got, "the read's answer")
        assert held.in_flight_after == [True]  # c's commit had begun when it was answered
        assert got == [before + 1]  # b's view: the read began before c was sent
        assert held.stored_reads == 0

    assert await _with_a_held_commit(monkeypatch, short_dir, 60.0, body) == ["ok"]


async def test_a_read_during_a_commit_that_fails_answers_what_is_stored(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit fails with nothing written: the waiting read gets the stored view, the
    one before it, never the view the failed commit would have left."""

    async def body(held: Held, client: AsyncClient, reader: AsyncClient, before: int,
                   tg: anyio.abc.TaskGroup) -> None:
        got = await held.start_read(reader, tg)
        held.releases[0].set()  # the commit of b fails
        await eventually(lambda: got, "the read's answer")
        assert got == [before]
        assert held.stored_reads == 1

    ended = await _with_a_held_commit(monkeypatch, short_dir, 60.0, body, fail=True)
    assert ended == ["storage error: disk I/O error; nothing was written"]


async def test_past_the_wait_a_read_answers_the_stored_view(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """A commit that takes long (a stalled disk) does not hold the read past the wait:
    it answers from the store, which holds the landed events already."""

    async def body(held: Held, client: AsyncClient, reader: AsyncClient, before: int,
                   tg: anyio.abc.TaskGroup) -> None:
        with anyio.fail_after(PATIENCE_S):  # a guard: the read must end while b is held
            version = (await reader.get_session("s")).version
        # It waited, and was let go while b's commit was still held: by the wait's end.
        assert held.waiting.is_set() and held.in_flight_after == [True]
        assert version == before + 1  # the store's: b landed
        assert held.stored_reads == 1

    assert await _with_a_held_commit(monkeypatch, short_dir, 0.2, body) == ["ok"]


async def test_a_read_during_a_commit_that_deletes_the_session_answers_not_found(
        short_dir: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """The commit in flight deletes the session: the waiting read is handed no view (the
    writer's cached one is the deleted session's), reads the store, and answers that the
    session is gone."""
    held = Held(monkeypatch, 60.0)
    ended: list[bool] = []
    async with running_daemon(daemon_config(short_dir), faulty(held.stores)) as daemon, \
            AsyncClient(daemon.socket) as client, AsyncClient(daemon.socket) as reader:
        await client.create_session("s")
        await client.append_message("s", "user", "a")
        held.hold(fail=False, rule=lambda batch: "s" in batch.deletes)

        async def delete() -> None:
            ended.append(await client.delete_session("s"))

        async with anyio.create_task_group() as tg:
            tg.start_soon(delete)
            try:
                await eventually(lambda: held.held == 1, "the delete's commit held")
                got: list[str] = []

                async def read() -> None:
                    with pytest.raises(SessionNotFoundError) as refused:
                        await reader.get_session("s")
                    got.append(refused.value.message)

                tg.start_soon(read)
                with anyio.fail_after(PATIENCE_S):  # a guard: the read must reach the writer
                    await held.waiting.wait()
                held.releases[0].set()
                await eventually(lambda: got, "the read's answer")
            finally:
                held.release_all()
        assert got == ["session s not found"]
        assert held.stored_reads == 1
    assert ended == [True]
