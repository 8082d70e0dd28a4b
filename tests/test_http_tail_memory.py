"""Idle tails hold their cursor, not the batches written beside them (issue 45 §2).

One idle SSE tail (the web view's, on every session page), long poll or socket
subscription kept every batch the writer committed while it waited: each bell held its
batch and the next bell. Here a daemon process writes hundreds of MB beside such tails,
and its resident memory (/proc) must grow by far less than what was written."""

from __future__ import annotations

import json
import socket
import tempfile
from collections.abc import Iterator
from typing import Any

import anyio
import httpx
import pytest
from conftest import eventually, wait_for_daemon
from test_http import free_port
from test_memory import process_daemon, read_lines, vm

from sessiond_schemas.paths import http_token_path

pytestmark = [pytest.mark.anyio, pytest.mark.fleet]  # a few hundred MB written: the long suite
__all__ = ["process_daemon"]  # the fixture used here

CHUNK = 4 << 20  # the 4 MB writes
WRITES = 150  # 600 MB beside the tails (the acceptance)
BOUND = 160 << 20  # the acceptance: 1.25x a 128 MiB budget, above the idle baseline
TEXT = {"content-type": "text/plain"}


@pytest.fixture
def daemon_flags() -> Iterator[list[str]]:
    with tempfile.TemporaryDirectory(prefix="sd-") as directory:
        yield ["--http-listen", f"127.0.0.1:{free_port()}", "--http-long-poll-s", "3600",
               "--http-sse-close-s", "3600", "--max-request-bytes", str(16 << 20),
               "--max-message-bytes", str(16 << 20), "--max-event-bytes", str(16 << 20)]
        del directory


def rpc(method: str, **params: Any) -> bytes:
    return json.dumps({"jsonrpc": "2.0", "id": 1, "method": method,
                       "params": params}).encode() + b"\n"


def subscribed(path: str, **params: Any) -> socket.socket:
    """A socket connection with one subscription (its answer read), then left unread."""
    s = socket.socket(socket.AF_UNIX)
    s.connect(path)
    s.sendall(rpc("events.subscribe", **params))
    answer = read_lines(s, 1)[0]
    assert "result" in answer, answer
    return s


async def test_idle_tails_beside_300_mb_of_writes(
        process_daemon: tuple[Any, str], daemon_flags: list[str]) -> None:
    proc, path = process_daemon
    await anyio.to_thread.run_sync(wait_for_daemon, path, proc)
    with open(http_token_path(path)) as f:
        headers = {"authorization": f"Bearer {f.read().strip()}"}
    url = f"http://{daemon_flags[1]}"
    big = b"x" * (CHUNK - 1)
    async with httpx.AsyncClient(base_url=url, headers=headers, timeout=300) as http, \
            httpx.AsyncClient(base_url=url, headers=headers, timeout=3600) as tails:
        for name in ("quiet", "slow", "busy"):
            assert (await http.put(f"/v1/stream/{name}", headers=TEXT)).status_code == 201
        # A history a stalled catch-up cannot send in one go (2,000 events of 1 KB).
        slow_lines = [b"%04d" % i + b"s" * 1024 for i in range(2000)]
        for start in range(0, 2000, 500):
            await http.post("/v1/stream/slow", headers=TEXT,
                            content=b"".join(slow_lines[start:start + 500]))
        for i in range(5):  # the allocator's steady state before the baseline
            await http.post("/v1/stream/busy", headers=TEXT, content=b"%d" % i + big)

        async with anyio.create_task_group() as tg:
            # The web view's tail of a quiet session page (app.js: offset, live=sse).
            sse_seen: list[str] = []

            async def sse() -> None:
                async with tails.stream("GET", "/v1/stream/quiet?offset=now&live=sse") as r:
                    async for line in r.aiter_lines():
                        sse_seen.append(line)

            polled: list[httpx.Response] = []

            async def long_poll() -> None:
                polled.append(await tails.get("/v1/stream/quiet?offset=now&live=long-poll"))

            tg.start_soon(sse)
            tg.start_soon(long_poll)
            live = await anyio.to_thread.run_sync(lambda: subscribed(path, session_id="quiet"))
            # A subscription catching up for a consumer that reads nothing (it waits on
            # the socket's buffer, in the middle of its catch-up).
            stalled = await anyio.to_thread.run_sync(
                lambda: subscribed(path, session_id="slow", from_position=0))
            await eventually(lambda: any("upToDate" in line for line in sse_seen),
                             "the SSE tail to be at the stream's end")
            # The long poll is in its wait once the daemon counts it a live tail.
            # 2 socket subscriptions, the SSE tail, and the long poll once it waits.
            await eventually(lambda: _subscriptions(path) >= 4, "the tails to wait")

            baseline = vm(proc.pid, "VmRSS")
            for i in range(WRITES):
                answer = await http.post("/v1/stream/busy", headers=TEXT,
                                         content=b"%d" % (i % 10) + big)
                assert answer.status_code == 204, answer.text
            grown = vm(proc.pid, "VmRSS") - baseline
            peak = vm(proc.pid, "VmHWM") - baseline
            written = WRITES * CHUNK
            print(f"\nRSS {baseline >> 20} MB before, grown {grown >> 20} MB (peak"
                  f" {peak >> 20} MB) over {written >> 20} MB written beside the idle tails")
            # Held, the batches would weigh what was written (and more: the copies).
            assert grown < written // 5, f"RSS grew {grown >> 20} MB"
            assert peak < BOUND, f"RSS peaked {peak >> 20} MB above the baseline"

            # The tails were live all along: a write to their session reaches each.
            assert (await http.post("/v1/stream/quiet", headers=TEXT,
                                    content=b"hello")).status_code == 204
            await eventually(lambda: polled, "the long poll to answer")
            assert polled[0].status_code == 200 and polled[0].content == b"hello"
            await eventually(lambda: any("hello" in line for line in sse_seen),
                             "the SSE tail to send the append")
            note = await anyio.to_thread.run_sync(read_lines, live, 2)
            assert note[0]["method"] == "subscription.caught_up"
            assert note[1]["params"]["event"]["type"] == "stream.chunk"
            stalled.close()
            live.close()
            tg.cancel_scope.cancel()
        # Nothing was held for them: nothing to give back once they are gone either.
        await eventually(lambda: _subscriptions(path) == 0, "the tails to end")
        after = vm(proc.pid, "VmRSS")
        print(f"RSS {after >> 20} MB once the tails ended")
        assert after - baseline < written // 5
        assert after < baseline * 1.1, f"RSS {after >> 20} MB, {baseline >> 20} MB before"


def _subscriptions(path: str) -> int:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(rpc("daemon.stats"))
        stats = read_lines(s, 1)[0]["result"]
    return int(stats["subscriptions"])
