"""session.search stays inside its budget, snippets included, and never takes every reader
(issue 45 §3).

A message of one word said 262,144 times made a search for it take minutes on SQLite
(FTS5's snippet() costs the square of a document's matches, in one call the progress
handler cannot stop), and two such searches held both read connections: every other
read waited. Now the daemon cuts the snippet of a large document itself, from a window
of its text, and searches run apart from the other reads (SQLite: a read connection of
their own, one search at a time; PostgreSQL: at most one reader less than the pool)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import anyio
import pytest
from conftest import PATIENCE_S, POLL_S, Daemon, daemon_config, eventually, running_daemon

from sessiond import AsyncClient, StorageError
from sessiond_daemon.stores.postgres import search as pg_search
from sessiond_daemon.stores.sqlite import search as sqlite_search

pytestmark = pytest.mark.anyio

REPEATS = 262_144  # the largest: 296 s of snippet() for one hit


async def test_a_search_on_a_word_said_262144_times_keeps_its_budget(
        store_kind: str, short_dir: str, db_url: str) -> None:
    """The search for the word is answered within its budget: a page whose snippet is
    short and marked, or the budget's error; never minutes of an uninterruptible call.
    Two of them at once leave `session.get` answered."""
    config = daemon_config(short_dir, db=db_url, search_timeout_s=5.0)
    async with running_daemon(config) as d, AsyncClient(d.socket) as client:
        await client.create_session(session_id="x", task="many words")
        await client.append_message("x", "user", " ".join(["x"] * REPEATS))
        await client.append_message("x", "user", "x and y")
        answers: list[Any] = []

        async def search() -> None:
            async with AsyncClient(d.socket) as own:
                try:
                    answers.append(await own.search("x"))
                except StorageError as exc:
                    answers.append(exc)

        with anyio.fail_after(PATIENCE_S):  # a guard against hanging, not a bound
            async with anyio.create_task_group() as tg:
                tg.start_soon(search)
                tg.start_soon(search)
                assert (await client.get_session("x")).message_count == 2
        assert len(answers) == 2
        for answer in answers:
            if isinstance(answer, StorageError):
                assert answer.data["setting"] in ("search_timeout_s", "search_max_steps")
                continue
            [found] = answer.sessions
            assert found.matches == 2 and len(found.hits) == 2
            for hit in found.hits:  # about 12 words, the matches marked
                assert 1 <= hit.snippet.count("«x»") <= 20 and len(hit.snippet) < 1_000
            if store_kind == "sqlite":  # the daemon's cut: the first 12 tokens, and `…`
                assert "«x» " * 11 + "«x»\u2026" in [h.snippet for h in found.hits]


def _hold(store_kind: str, monkeypatch: pytest.MonkeyPatch,
          entered: list[int], gate: threading.Event) -> None:
    """Make each search wait at its query, once it holds its connection, until `gate`."""
    if store_kind == "sqlite":
        real: Callable[..., Any] = sqlite_search.query

        def held(*args: Any) -> Any:  # on the connection's thread
            entered.append(1)
            gate.wait(PATIENCE_S)
            return real(*args)
        monkeypatch.setattr(sqlite_search, "query", held)
    else:
        real_async: Callable[..., Any] = pg_search._query

        async def held_async(*args: Any) -> Any:  # holding a connection of the pool
            entered.append(1)
            while not gate.is_set():
                await anyio.sleep(POLL_S)
            return await real_async(*args)
        monkeypatch.setattr(pg_search, "_query", held_async)


async def test_reads_are_answered_while_two_searches_run(
        store_kind: str, daemon: Daemon, client: AsyncClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Two searches in flight, each as long as its budget lets it run, hold no connection
    the other reads need: session.get, session.list, events.read and message.list are
    answered meanwhile. Then both searches answer."""
    await client.create_session(session_id="s", task="the wombat task")
    await client.append_message("s", "user", "a wombat")
    entered: list[int] = []
    gate = threading.Event()
    _hold(store_kind, monkeypatch, entered, gate)
    answers: list[Any] = []

    async def search() -> None:
        async with AsyncClient(daemon.socket) as own:
            answers.append(await own.search("wombat"))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(search)
            tg.start_soon(search)
            await eventually(lambda: entered, "a search holds its connection")
            await anyio.sleep(0.2)  # pacing: the second search's request reaches the daemon
            with anyio.fail_after(PATIENCE_S):  # a guard against hanging, not a bound
                assert (await client.get_session("s")).message_count == 1
                assert [s.session_id for s in (await client.list_sessions()).sessions] == ["s"]
                assert len((await client.read_events("s")).events) == 2
                assert len((await client.list_messages("s")).messages) == 1
            assert len(answers) == 0  # the searches were in flight all along
            gate.set()
    finally:
        gate.set()
    assert [[s.session_id for s in a.sessions] for a in answers] == [["s"], ["s"]]
    assert 1 <= len(entered) <= 2


async def test_a_search_waiting_for_its_turn_ends_when_its_client_goes(
        store_kind: str, daemon: Daemon, client: AsyncClient,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A search in flight holds the searches' connection; another client's search waits
    for its turn, and its client leaves: that search never runs. The next one does."""
    await client.create_session(session_id="s", task="the wombat task")
    entered: list[int] = []
    gate = threading.Event()
    _hold(store_kind, monkeypatch, entered, gate)
    answers: list[Any] = []

    async def search() -> None:
        async with AsyncClient(daemon.socket) as own:
            answers.append(await own.search("wombat"))

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(search)
            await eventually(lambda: entered, "a search holds its connection")
            async with anyio.create_task_group() as leaving:
                leaving.start_soon(search)
                await anyio.sleep(0.2)  # pacing: its request reaches the daemon, and waits
                leaving.cancel_scope.cancel()  # the client closes its connection
            await anyio.sleep(0.5)  # pacing: the daemon sees it gone (it looks every 50 ms)
            gate.set()
        assert (await client.search("wombat")).sessions[0].session_id == "s"
    finally:
        gate.set()
    assert len(answers) == 1 and len(entered) == 2  # the first, and the last: not the one gone
