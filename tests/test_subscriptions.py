"""Live subscriptions: catch-up then live with no gap or duplicate, drops, restarts, watch."""

from __future__ import annotations

import json
import os
import signal
import socket
import sys
from typing import Any

import anyio
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon

from sessiond import AsyncClient, InvalidParamsError, SessionNotFoundError
from sessiond_schemas.events import Event

pytestmark = pytest.mark.anyio


async def all_events(c: AsyncClient) -> list[Event]:
    events: list[Event] = []
    after: int | None = 0
    while after is not None:
        page = await c.read_events(from_position=after, limit=5000)
        events += page.events
        after = page.next
    return events


@pytest.mark.slow_on_postgresql
async def test_catch_up_then_live_under_load(daemon: Daemon, client: AsyncClient) -> None:
    """8 writers, 5,000 events; 4 subscribers each get exactly their events, in order, once."""
    sessions = [(await client.create_session(f"w{i}")).session_id for i in range(8)]
    subs: dict[str, Any] = {
        "all_from_0": client.subscribe(from_position=0),
        "tokens_only": client.subscribe(from_position=0, types=["tokens.recorded"]),
        "one_session": client.subscribe("w3", from_version=1),
    }
    got: dict[str, list[Event]] = {name: [] for name in [*subs, "all_from_now"]}
    writes_started = anyio.Event()
    expected: dict[str, list[int]] = {}

    async def consume(name: str, sub: Any) -> None:
        async with sub:
            async for event in sub:
                got[name].append(event)
                if name in expected and len(got[name]) >= len(expected[name]):
                    return

    async def writer(i: int) -> None:
        async with AsyncClient(daemon.socket) as c:
            for n in range(312):  # 8 x 312 x 2 = 4,992 events + 8 creations = 5,000
                await c.append_message(sessions[i], "user", f"{i}-{n}")
                await c.record_tokens(sessions[i], input_tokens=1)
                if n == 50:
                    writes_started.set()

    async with anyio.create_task_group() as tg:
        for name, sub in subs.items():
            tg.start_soon(consume, name, sub)
        async with anyio.create_task_group() as writers:
            for i in range(8):
                writers.start_soon(writer, i)
            await writes_started.wait()
            subs["all_from_now"] = client.subscribe()
            tg.start_soon(consume, "all_from_now", subs["all_from_now"])
        stored = await all_events(client)
        assert len(stored) == 5000
        await eventually(lambda: subs["all_from_now"].start_position is not None,
                         "all_from_now to start")
        now = subs["all_from_now"].start_position
        assert 0 < now < stored[-1].position  # it really started mid-stream
        expected.update({
            "all_from_0": [e.position for e in stored],
            "tokens_only": [e.position for e in stored if e.type == "tokens.recorded"],
            "one_session": [e.position for e in stored if e.session_id == "w3"],
            "all_from_now": [e.position for e in stored if e.position > now],
        })
        await eventually(lambda: all(len(got[n]) >= len(expected[n]) for n in expected),
                         "every subscriber to catch up")
        tg.cancel_scope.cancel()
    for name, positions in expected.items():
        assert [e.position for e in got[name]] == positions, name
    assert all(e.type == "tokens.recorded" for e in got["tokens_only"])


async def test_subscribe_errors_and_unsubscribe(daemon: Daemon, client: AsyncClient) -> None:
    """Unknown session -32001; both starts -32602; unsubscribe ends it and is counted."""
    with pytest.raises(SessionNotFoundError):
        await client.call("events.subscribe", session_id="missing")
    await client.create_session("u1")
    with pytest.raises(InvalidParamsError):
        await client.call("events.subscribe", session_id="u1", from_position=0, from_version=1)
    with pytest.raises(InvalidParamsError):
        await client.call("events.subscribe", from_version=1)
    started = await client.call("events.subscribe", session_id="u1")
    assert (await client.stats()).subscriptions == 1
    ended = await client.call("events.unsubscribe", subscription=started["subscription"])
    assert ended == {"ok": True}
    assert (await client.stats()).subscriptions == 0
    with pytest.raises(InvalidParamsError):
        await client.call("events.unsubscribe", subscription=started["subscription"])


async def test_a_subscription_is_live_once_its_block_runs(daemon: Daemon,
                                                          client: AsyncClient) -> None:
    """Entered with `async with`, a subscription "from now" is registered before the block
    runs: it hands out what the block writes before its first iteration. A subscribe the
    daemon refuses raises at the entry."""
    await client.create_session("now")
    async with client.subscribe("now") as sub:
        assert sub.start_position is not None  # answered already
        await client.append_message("now", "user", "first")
        await client.append_message("now", "user", "second")
        with anyio.fail_after(30):  # a guard against a hang, not a timing
            got = [(await sub.__anext__()).fields()["content"] for _ in range(2)]
    assert got == ["first", "second"]
    with pytest.raises(SessionNotFoundError):
        async with client.subscribe("missing"):
            pytest.fail("entered a subscription to a session that does not exist")


async def test_deleted_session_ends_the_subscription(daemon: Daemon, client: AsyncClient) -> None:
    """Deleting the followed session ends it with subscription.dropped saying so."""
    await client.create_session("doomed")
    async with client.subscribe("doomed", from_version=1) as sub:
        first = await sub.__anext__()
        assert first.type == "session.created"
        await client.append_message("doomed", "user", "last words")
        assert (await sub.__anext__()).type == "message.appended"
        await client.delete_session("doomed")
        with anyio.fail_after(10):
            rest = [e async for e in sub]
        assert rest == [] and sub.ended is not None and "session deleted" in sub.ended


@pytest.mark.slow_on_postgresql
async def test_stalled_consumer_is_dropped_and_bounded(short_dir: str, db_url: str) -> None:
    """A subscriber that never reads is dropped at its buffer bound, with last_position."""
    bound = 64 * 1024
    config = daemon_config(short_dir, db=db_url, max_subscription_buffer=bound)
    async with running_daemon(config) as d, AsyncClient(d.socket) as c:
        await c.create_session("flood")
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(d.socket)
        raw.sendall(b'{"jsonrpc":"2.0","id":1,"method":"events.subscribe","params":{}}\n')
        async def subscribed() -> bool:
            return (await c.stats()).subscriptions == 1

        await eventually(subscribed, "the raw subscription")
        for _ in range(60):  # 6,000 events, several MB of notifications, none read
            await c.append_messages("flood", [{"role": "user", "content": "x" * 300}] * 100)
        assert (await c.stats()).subscriptions == 0  # dropped; the writers never waited
        last = (await c.stats()).last_position
        received = bytearray()
        raw.settimeout(5)
        while b"subscription.dropped" not in received:
            chunk = await anyio.to_thread.run_sync(raw.recv, 1 << 20)
            assert chunk, "connection closed before the drop notice"
            received += chunk
        raw.close()
        lines = [json.loads(x) for x in bytes(received).splitlines() if x.strip()]
        events = [m["params"]["event"]["position"] for m in lines
                  if m.get("method") == "subscription.event"]
        dropped = [m["params"] for m in lines if m.get("method") == "subscription.dropped"]
        assert len(dropped) == 1 and "too slow" in dropped[0]["reason"]
        # Every event up to last_position was sent, in order, and no more: resuming is exact.
        assert events == list(range(events[0], dropped[0]["last_position"] + 1))
        assert dropped[0]["last_position"] < last // 2  # dropped near the bound, not at the end
        # What the daemon buffered stayed near the bound: one batch past it at most
        # (the rest of what we read sat in the kernel's socket buffers).
        assert len(received) < bound + 100 * 700 + 4 * 1024 * 1024


async def test_iterator_survives_a_daemon_restart(short_dir: str, db_url: str) -> None:
    """The client's iterator reconnects after a restart and loses nothing, doubles nothing."""
    config = daemon_config(short_dir, db=db_url)
    got: list[Event] = []
    async with anyio.create_task_group() as outer:
        async def consume() -> None:
            async with AsyncClient(config.socket).subscribe(from_position=0, retry_for=30) as sub:
                async for event in sub:
                    got.append(event)
                    if len(got) == 101:
                        return

        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            await c.create_session("phoenix")
            outer.start_soon(consume)
            for i in range(50):
                await c.append_message("phoenix", "user", f"before {i}")
            await eventually(lambda: len(got) >= 51, "the events before the restart")
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            for i in range(50):
                await c.append_message("phoenix", "user", f"after {i}")
            await eventually(lambda: len(got) >= 101, "the events after the restart")
    assert [e.version for e in got] == list(range(1, 102))


async def test_an_entry_waits_for_the_daemon(short_dir: str, db_url: str) -> None:
    """Entered before the daemon is up, a subscription waits for it (`retry_for`, as a
    resubscribe does) and is subscribed when its block runs."""
    config = daemon_config(short_dir, db=db_url)
    entered = anyio.Event()
    got: list[str] = []
    async with anyio.create_task_group() as tg:
        async def consume() -> None:
            async with AsyncClient(config.socket).subscribe(from_position=0,
                                                            retry_for=60) as sub:
                assert sub.start_position is not None  # answered already
                entered.set()
                async for event in sub:
                    got.append(event.type)
                    return

        tg.start_soon(consume)
        await anyio.sleep(0.2)  # the entry is waiting for a socket nobody listens on
        assert not entered.is_set()
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            with anyio.fail_after(60):  # a guard against a hang, not a timing
                await entered.wait()
            await c.create_session("late")
            await eventually(lambda: bool(got), "the subscription's first event")
    assert got == ["session.created"]


async def test_blocking_follow(daemon: Daemon, client: AsyncClient) -> None:
    """Client.subscribe is a blocking generator with the same guarantees."""
    from sessiond import Client

    await client.create_session("sync-follow")
    await client.append_messages("sync-follow",
                                 [{"role": "user", "content": f"m{i}"} for i in range(5)])

    def run() -> list[int]:
        with Client(daemon.socket) as c:
            gen = c.subscribe("sync-follow", from_version=1)
            versions = [next(gen).version for _ in range(6)]
            gen.close()
            return versions

    assert await anyio.to_thread.run_sync(run) == [1, 2, 3, 4, 5, 6]


async def test_sessionctl_watch(daemon: Daemon, client: AsyncClient) -> None:
    """`sessionctl watch` prints each event as it comes and ends cleanly on Ctrl-C."""
    await client.create_session("watched", task="demo")
    await client.append_message("watched", "user", "hello")
    proc = await anyio.open_process(
        [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "watch", "watched",
         "--from-start"])
    assert proc.stdout is not None and proc.stderr is not None
    lines: list[str] = []
    buffer = b""

    async def read_lines(n: int) -> None:
        nonlocal buffer
        while len(lines) < n:
            buffer += await proc.stdout.receive()  # type: ignore[union-attr]
            *done, buffer = buffer.split(b"\n")
            lines.extend(x.decode() for x in done)

    with anyio.fail_after(30):
        await read_lines(2)
        await client.transition("watched", "paused", reason="lunch")
        await read_lines(3)
    assert "session.created" in lines[0] and "demo" in lines[0]
    assert "message.appended" in lines[1] and "user: hello" in lines[1]
    assert "active -> paused (lunch)" in lines[2]
    proc.send_signal(signal.SIGINT)
    with anyio.fail_after(30):
        assert await proc.wait() == 0
    await proc.aclose()


async def test_sessionctl_watch_json_and_type_filter(daemon: Daemon, client: AsyncClient) -> None:
    """--json prints envelopes; --type filters."""
    await client.create_session("wj")
    await client.record_tokens("wj", input_tokens=7)
    proc = await anyio.open_process(
        [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "watch", "--from-start",
         "--type", "tokens.recorded", "--json"])
    assert proc.stdout is not None
    with anyio.fail_after(30):
        data = b""
        while b"\n" not in data:
            data += await proc.stdout.receive()
    event = json.loads(data.split(b"\n")[0])
    assert event["type"] == "tokens.recorded" and event["data"]["input_tokens"] == 7
    proc.send_signal(signal.SIGINT)
    with anyio.fail_after(30):
        assert await proc.wait() == 0
    await proc.aclose()
    assert os.path.exists(daemon.socket)
