"""Issue 45's memory workloads against a daemon process with a 128 MiB budget, on every
face: each keeps the peak RSS within 1.25 times the budget above the idle baseline, and
RSS comes back within 10% of the baseline once its clients are gone. Marked fleet (a
few GB go through the sockets); each prints its figures (docs/reliability.md quotes
them):

- 128 socket clients each asking for one 16 MB event and never reading;
- 128 HTTP clients POSTing /rpc events.read of that event and never reading;
- 16 HTTP clients each sending a 120 MB body but its last byte;
- 16 socket clients each sending 120 MB of one line without its newline.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import anyio
import pytest
from conftest import eventually, wait_for_daemon
from test_memory import call, rpc_line, stop, vm

from sessiond import AsyncClient

pytestmark = [pytest.mark.anyio, pytest.mark.fleet]
BUDGET = 128 << 20
EVENT = 16_000_000  # the 16 MB event
BODY = 120_000_000  # the 120 MB bodies and lines
HOLD_S = 6.0  # how long the clients hold on before they go (under http_send_timeout_s)


@contextmanager
def daemon_process() -> Iterator[tuple[subprocess.Popen[bytes], str, str]]:
    with tempfile.TemporaryDirectory(prefix="sd-") as directory:
        path, http = os.path.join(directory, "s.sock"), os.path.join(directory, "h.sock")
        proc = subprocess.Popen([
            sys.executable, "-m", "sessiond_daemon", "--socket", path,
            "--db", os.path.join(directory, "m.db"), "--log-level", "error",
            "--max-reply-buffer-total", str(BUDGET), "--http-listen", http])
        try:
            wait_for_daemon(path, proc)
            yield proc, path, http
        finally:
            stop(proc)


def connect(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(path)
    return s


def send_quietly(s: socket.socket, data: bytes | memoryview) -> None:
    with contextlib.suppress(OSError):  # closed by the daemon's budget: what is tested
        s.sendall(data)


def http_post(path: str, length: int) -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: application/json\r\n"
            f"content-length: {length}\r\n\r\n").encode()


async def measure(proc: subprocess.Popen[bytes], client: AsyncClient, what: str,
                  clients: Callable[[list[socket.socket]], None]) -> None:
    """Run `clients` (it opens its sockets into the list) for HOLD_S, then close them;
    check and print the peak above the baseline and where RSS comes back to."""
    await anyio.sleep(2)  # what setting up freed is trimmed
    baseline = vm(proc.pid, "VmRSS")
    with open(f"/proc/{proc.pid}/clear_refs", "w") as f:
        f.write("5")  # VmHWM from here on
    socks: list[socket.socket] = []
    worker = threading.Thread(target=clients, args=(socks,), daemon=True)
    started = time.monotonic()
    worker.start()
    try:
        while worker.is_alive() or time.monotonic() - started < HOLD_S:
            assert (await client.ping()).pong  # the daemon answers meanwhile
            await anyio.sleep(0.5)
        stats = await client.stats()
    finally:
        for s in socks:
            s.close()
    peak = vm(proc.pid, "VmHWM") - baseline
    with contextlib.suppress(AssertionError):
        await eventually(lambda: vm(proc.pid, "VmRSS") <= baseline * 1.1,
                         f"RSS back within 10% of its baseline after {what}", patience=30)
    after = vm(proc.pid, "VmRSS")
    print(f"\n{what}: baseline {baseline >> 20} MiB, peak +{peak >> 20} MiB"
          f" ({peak / BUDGET:.2f}x the budget), after {after >> 20} MiB"
          f" ({after / baseline:.2f}x); closed by the budget:"
          f" {stats.connections_closed_by_budget}")
    assert peak <= 1.25 * BUDGET, f"{what}: peak +{peak >> 20} MiB"
    assert after <= baseline * 1.1, f"{what}: {after >> 20} MiB after, {baseline >> 20} before"
    assert proc.poll() is None


async def big_event(client: AsyncClient) -> str:
    sid = (await client.create_session()).session_id
    await client.append_messages(sid, [{"role": "user", "content": "x" * EVENT}])
    return str(sid)


async def test_128_socket_clients_on_a_16mb_event() -> None:
    with daemon_process() as (proc, path, _):
        async with AsyncClient(path) as client:
            line = rpc_line(call(1, "events.read", session_id=await big_event(client),
                                 from_version=2, limit=1))

            def clients(socks: list[socket.socket]) -> None:
                for _ in range(128):
                    s = connect(path)
                    socks.append(s)
                    send_quietly(s, line)

            await measure(proc, client, "128 socket clients, 16 MB event, never read",
                          clients)


async def test_128_http_clients_on_a_16mb_event() -> None:
    with daemon_process() as (proc, path, http):
        async with AsyncClient(path) as client:
            body = json.dumps(call(1, "events.read", session_id=await big_event(client),
                                   from_version=2, limit=1)).encode()

            def clients(socks: list[socket.socket]) -> None:
                for _ in range(128):
                    s = connect(http)
                    socks.append(s)
                    send_quietly(s, http_post("/rpc", len(body)) + body)

            await measure(proc, client, "128 HTTP clients, /rpc 16 MB event, never read",
                          clients)


def _senders(path: str, head: bytes, count: int) -> Callable[[list[socket.socket]], None]:
    """`count` clients at once, each sending `head` then BODY - 1 bytes."""
    chunk = memoryview(b"x" * (1 << 20))

    def one(s: socket.socket) -> None:
        send_quietly(s, head)
        left = BODY - 1
        while left > 0:
            n = min(left, len(chunk))
            try:
                s.sendall(chunk[:n])
            except OSError:
                return
            left -= n

    def clients(socks: list[socket.socket]) -> None:
        threads = []
        for _ in range(count):
            s = socket.socket(socket.AF_UNIX)
            s.connect(path)
            socks.append(s)
            threads.append(threading.Thread(target=one, args=(s,), daemon=True))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    return clients


async def test_16_http_bodies_short_of_their_last_byte() -> None:
    with daemon_process() as (proc, path, http):
        async with AsyncClient(path) as client:
            await measure(proc, client, "16 HTTP bodies of 120 MB but the last byte",
                          _senders(http, http_post("/v1/stream/big", BODY), 16))


async def test_16_socket_lines_short_of_their_newline() -> None:
    with daemon_process() as (proc, path, _):
        async with AsyncClient(path) as client:
            await measure(proc, client, "16 socket lines of 120 MB without their newline",
                          _senders(path, b'{"jsonrpc":"2.0","id":1,"method":"x","params":"',
                                   16))
