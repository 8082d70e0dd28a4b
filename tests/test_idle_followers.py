"""Followers of one session are not woken by commits to another (issue 31, B8).

Subscriptions of a session and HTTP live tails (long polls, SSE) wait at the end of their
session; a commit to another session must cost them nothing: no task of theirs is woken.
The count is of the event loop's task wake-ups (every callback the loop runs for a task),
taken over the same appends with and without the idle followers: the difference is what
the followers cost. Then they still get their own session's events.
"""

from __future__ import annotations

import asyncio
import json
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import anyio.abc
import httpx
import pytest
from conftest import Daemon, eventually
from test_http import base, free_port, token

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio

SUBSCRIPTIONS = 48  # on 2 connections
TAILS = 16  # 8 long polls and 8 SSE responses
APPENDS = 12


@pytest.fixture
def daemon_overrides(short_dir: str) -> dict[str, Any]:
    return {"http_listen": [f"127.0.0.1:{free_port()}", os.path.join(short_dir, "h.sock")],
            "http_long_poll_s": 60.0}


@contextmanager
def task_wakeups() -> Iterator[list[int]]:
    """Count the loop's callbacks that wake or step a task, while in the block."""
    count = [0]
    run = asyncio.events.Handle._run

    def counted(handle: asyncio.events.Handle) -> None:
        if isinstance(getattr(handle._callback, "__self__", None), asyncio.Task):
            count[0] += 1
        run(handle)

    asyncio.events.Handle._run = counted  # type: ignore[method-assign]
    try:
        yield count
    finally:
        asyncio.events.Handle._run = run  # type: ignore[method-assign]


async def appends(client: AsyncClient, session_id: str) -> int:
    """Task wake-ups in the whole process over APPENDS sequential appends (one commit each)."""
    with task_wakeups() as count:
        for i in range(APPENDS):
            await client.append_message(session_id, "user", f"busy {i}")
    return count[0]


async def test_idle_followers_of_another_session_are_not_woken(
        daemon: Daemon, client: AsyncClient) -> None:
    await client.create_session(session_id="idle")
    await client.create_session(session_id="busy")
    await client.append_message("busy", "user", "warm up")  # the writer's paths warmed
    bare = min([await appends(client, "busy") for _ in range(2)])

    got: dict[str, list[str]] = {"subscriptions": [], "polls": [], "sse": []}
    caught_up = [0]
    async with (await anyio.connect_unix(daemon.socket) as one,
                await anyio.connect_unix(daemon.socket) as two,
                httpx.AsyncClient(base_url=base(daemon), timeout=90, headers={
                    "authorization": f"Bearer {token(daemon)}"}) as http,
                anyio.create_task_group() as tg):
        made = await http.get("/v1/stream/idle")
        at = made.headers["stream-next-offset"]

        async def subscribe(conn: anyio.abc.SocketStream, n: int) -> None:
            """n subscriptions of 'idle' on one connection; their notifications noted."""
            await conn.send(b"".join(json.dumps({
                "jsonrpc": "2.0", "id": i, "method": "events.subscribe",
                "params": {"session_id": "idle"}}).encode() + b"\n" for i in range(n)))
            buffer = b""
            while True:
                buffer += await conn.receive()
                *lines, buffer = buffer.split(b"\n")
                for line in lines:
                    msg = json.loads(line)
                    if msg.get("method") == "subscription.caught_up":
                        caught_up[0] += 1
                    elif msg.get("method") == "subscription.event":
                        got["subscriptions"].append(msg["params"]["event"]["session_id"])
                    elif "id" not in msg or "error" in msg:
                        got["subscriptions"].append(line.decode())  # not expected

        async def poll() -> None:
            r = await http.get("/v1/stream/idle", params={"offset": at, "live": "long-poll"})
            got["polls"].append(r.text)

        async def sse() -> None:
            async with http.stream("GET", "/v1/stream/idle",
                                   params={"offset": at, "live": "sse"}) as r:
                async for text in r.aiter_text():
                    if "data:" in text and "idle news" in text:
                        got["sse"].append(text)
                        return

        tg.start_soon(subscribe, one, SUBSCRIPTIONS // 2)
        tg.start_soon(subscribe, two, SUBSCRIPTIONS // 2)
        for _ in range(TAILS // 2):
            tg.start_soon(poll)
            tg.start_soon(sse)

        async def all_waiting() -> bool:
            return (caught_up[0] == SUBSCRIPTIONS
                    and (await client.stats()).subscriptions == SUBSCRIPTIONS + TAILS)

        await eventually(all_waiting, "every follower waiting at the end of 'idle'")
        followed = min([await appends(client, "busy") for _ in range(2)])
        # Old: each commit woke every follower's task (64 per append, 768 here).
        assert followed - bare < SUBSCRIPTIONS + TAILS, (bare, followed)
        assert got == {"subscriptions": [], "polls": [], "sse": []}

        # ...and they are live: an append to their own session reaches every one.
        await client.append_message("idle", "user", "idle news")

        async def all_woken() -> bool:
            return (len(got["subscriptions"]) == SUBSCRIPTIONS
                    and len(got["polls"]) == len(got["sse"]) == TAILS // 2)

        await eventually(all_woken, "every follower of 'idle' given its event")
        tg.cancel_scope.cancel()
    assert set(got["subscriptions"]) == {"idle"}
    assert all("idle news" in text for text in got["polls"])
