"""The async connection core: opened and closed from any task, in any order, on asyncio
and trio; and a call refused before it is sent leaves nothing pending behind."""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Awaitable, Callable
from typing import Any

import anyio
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon

from sessiond import AsyncClient, ConnectionLostError, InvalidParamsError, InvalidRequestError
from sessiond.integrations._loop import LoopClient

pytestmark = pytest.mark.anyio


async def close_orders(socket: str) -> list[str]:
    """Two clients closed first-in-first-out; one opened in a task and closed in another;
    one closed while another task waits on it. What each step saw, as text."""
    seen: list[str] = []
    first, second = AsyncClient(socket), AsyncClient(socket)
    await first.connect()
    await second.connect()
    seen.append(f"{(await first.ping()).pong} {(await second.ping()).pong}")
    await first.aclose()  # the first opened closes first
    await second.aclose()
    seen.append("fifo closed")

    other = AsyncClient(socket)
    async with anyio.create_task_group() as tg:
        tg.start_soon(other.connect)  # opened in a task that then ends
    seen.append(str((await other.ping()).pong))
    async with anyio.create_task_group() as tg:
        tg.start_soon(other.aclose)  # closed from another one
    with pytest.raises(ConnectionLostError):
        await other.ping()
    seen.append("closed from another task")

    async with AsyncClient(socket) as shared:
        session = await shared.create_session(task="order")
        results: list[str] = []

        async def append(n: int) -> None:
            results.append((await shared.append_message(session.session_id, "user",
                                                        f"m{n}")).session_id)

        async with anyio.create_task_group() as tg:
            for n in range(10):
                tg.start_soon(append, n)
        seen.append(f"{len(results)} from tasks")
    return seen


EXPECTED = ["True True", "fifo closed", "True", "closed from another task", "10 from tasks"]


async def test_open_and_close_in_any_order_on_asyncio(daemon: Daemon) -> None:
    assert await close_orders(daemon.socket) == EXPECTED


async def test_open_and_close_in_any_order_on_trio(daemon: Daemon) -> None:
    """The same under trio (in a thread of its own: the daemon runs on asyncio here)."""
    pytest.importorskip("trio")
    seen = await anyio.to_thread.run_sync(
        lambda: anyio.run(close_orders, daemon.socket, backend="trio"))
    assert seen == EXPECTED


async def test_closing_wakes_a_waiting_call(daemon: Daemon) -> None:
    """aclose() from one task while another waits for its answer: that call gets
    ConnectionLostError at once, and nothing stays pending."""
    client = AsyncClient(daemon.socket)
    await client.connect()
    conn = client._conn
    assert conn is not None
    outcome: list[str] = []

    async def wait_for_follow() -> None:
        with pytest.raises(ConnectionLostError):
            # a subscription's first answer comes, then nothing: its follow-up never does
            await conn.request(99, b'{"jsonrpc":"2.0","id":98,"method":"daemon.ping"}\n')
        outcome.append("woken")

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(wait_for_follow)
            await anyio.wait_all_tasks_blocked()
            assert list(conn.replies.pending) == [99]
            await client.aclose()
    assert outcome == ["woken"] and conn.replies.pending == {}


def record_loop_errors() -> list[dict[str, Any]]:
    """Every call of the running loop's exception handler (say "Future exception was
    never retrieved"), kept for the test to look at."""
    calls: list[dict[str, Any]] = []
    asyncio.get_running_loop().set_exception_handler(lambda loop, context: calls.append(context))
    return calls


async def refused_calls(call: Callable[..., Awaitable[Any]], size: int) -> list[str]:
    """A NaN and an over-sized request: refused (before or by the daemon), both."""
    seen = []
    with pytest.raises(InvalidParamsError, match="not a finite number"):
        await call("s1", {"x": float("nan")})
    seen.append("nan refused")
    with pytest.raises(InvalidRequestError) as refused:
        await call("s1", {"x": "y" * size})
    assert refused.value.data["setting"] == "max_request_bytes"
    seen.append("oversized refused")
    return seen


@pytest.mark.parametrize("size", [100_000, 5_000_000])
@pytest.mark.parametrize("kind", ["AsyncClient", "LoopClient"])
async def test_refused_requests_leave_nothing_pending(short_dir: str, kind: str,
                                                      size: int) -> None:
    """After an encode failure (NaN in params) and a request over max_request_bytes, the
    client's pending map is empty, the connection goes on serving, and the loop has
    nothing to report (no "Future exception was never retrieved")."""
    errors = record_loop_errors()
    async with running_daemon(daemon_config(short_dir, max_request_bytes=50_000)) as d:
        client: AsyncClient | LoopClient
        if kind == "AsyncClient":
            client = AsyncClient(d.socket)
            await client.connect()
        else:
            client = LoopClient(d.socket)
        await client.create_session("s1")
        assert await refused_calls(client.update_memory, size) == ["nan refused",
                                                             "oversized refused"]
        conn = client._conn
        assert conn is not None and conn.replies.pending == {}
        assert (await client.update_memory("s1", {"x": 1})).memory == {"x": 1}
        assert conn.replies.pending == {} and client._conn is conn
        await client.aclose()
        gc.collect()  # a forgotten future reports itself when collected
        await anyio.sleep(0)  # and the report is a callback of the loop
    assert errors == []


@pytest.mark.slow_on_postgresql
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_a_subscriber_that_does_not_read_stops_reading_the_socket(
        daemon: Daemon, anyio_backend: str) -> None:
    """Lines a subscriber has not taken are bounded: past MAX_QUEUED_LINE_BYTES the client
    stops reading its socket (the daemon, whose store is the buffer, waits for it), and
    resumes as they are taken, so nothing is lost or reordered."""
    from sessiond._connection import MAX_QUEUED_LINE_BYTES

    async with AsyncClient(daemon.socket) as client:
        sid = (await client.create_session()).session_id
        async with client.subscribe(sid, from_version=1) as sub:
            first = await sub.__anext__()  # subscribed, the connection open
            assert sub._transport is not None
            replies = sub._transport.replies
            text = "x" * 4000
            for _ in range(30):  # ~12 MB of notifications, three times the bound
                await client.append_messages(sid, [{"role": "user", "content": text}] * 100)
            queued = await eventually(lambda: replies.queued >= MAX_QUEUED_LINE_BYTES,
                                      "the unread lines reaching the bound")
            assert queued
            versions = [first.version]
            async for event in sub:
                assert replies.queued <= MAX_QUEUED_LINE_BYTES + (1 << 20)
                versions.append(event.version)
                if event.version == 3001:
                    break
    assert versions == list(range(1, 3002))
