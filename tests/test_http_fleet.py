"""An SSE tail through one fleet daemon while another writes, across a kill -9 of the
reader's daemon (issue 29's acceptance): every event once, in order."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import httpx
import pg
import pytest
from conftest import daemon_config, running_daemon, wait_for_daemon

from sessiond import AsyncClient
from sessiond_schemas.paths import http_token_path

pytestmark = [pytest.mark.anyio, pytest.mark.fleet]


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class Reader:
    """Host "beta": a daemon process with the HTTP face, the one that is killed."""

    def __init__(self, directory: str, pg_url: str) -> None:
        os.makedirs(directory, exist_ok=True)
        self.socket = os.path.join(directory, "s.sock")
        self.port = free_port()
        self.argv = [sys.executable, "-m", "sessiond_daemon", "--socket", self.socket,
                     "--db", pg_url, "--host-name", "beta", "--log-level", "warning",
                     "--http-listen", f"127.0.0.1:{self.port}"]
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(self.argv)
        wait_for_daemon(self.socket, self.proc)

    def kill(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(timeout=60)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=60)

    def url(self, sid: str) -> str:
        token = Path(http_token_path(self.socket)).read_text().strip()  # new at each start
        return f"http://127.0.0.1:{self.port}/t/{token}/v1/stream/{sid}"


async def tail(url: str, offset: str, seen: list[int], until: int,
               marks: list[str] | None = None) -> str:
    """Read SSE from `offset`, adding each event's version to `seen` (and each control's
    offset to `marks`), until `until` events are seen or the connection breaks; return the
    last control's offset."""
    marks = [] if marks is None else marks
    last = offset
    buffer = ""
    try:
        async with (httpx.AsyncClient(timeout=httpx.Timeout(60, read=120)) as http,
                    http.stream("GET", url, params={"offset": offset, "live": "sse"}) as r):
            assert r.status_code == 200
            async for text in r.aiter_text():
                buffer += text
                while "\n\n" in buffer:
                    block, buffer = buffer.split("\n\n", 1)
                    kind = data = ""
                    for line in block.split("\n"):
                        if line.startswith("event:"):
                            kind = line[6:].strip()
                        elif line.startswith("data:"):
                            data += line[5:]
                    if kind == "data":
                        seen.extend(e["version"] for e in json.loads(data))
                    elif kind == "control":
                        last = json.loads(data)["streamNextOffset"]
                        marks.append(last)
                        if len(seen) >= until:
                            return last
    except (httpx.ReadError, httpx.RemoteProtocolError):
        pass  # the reader's daemon died under the tail
    return last


async def test_sse_across_a_kill_of_the_readers_daemon(pg_url: str, short_dir: str) -> None:
    """alpha writes 60 messages (20 before the kill, 20 while beta is down, 20 after it is
    back); the tail through beta reconnects from its last control event's offset and sees
    versions 1..61 each once, in order."""
    alpha_dir = os.path.join(short_dir, "alpha")
    os.makedirs(alpha_dir)
    alpha = daemon_config(alpha_dir, db=pg_url, host_name="alpha")
    beta = Reader(os.path.join(short_dir, "beta"), pg_url)
    seen: list[int] = []
    async with running_daemon(alpha) as a, AsyncClient(a.socket) as on_a:
        sid = (await on_a.create_session(task="tailed across hosts")).session_id
        beta.start()
        try:
            for i in range(20):
                await on_a.append_message(sid, "user", f"before {i}")
            offset = await tail(beta.url(sid), "-1", seen, until=21)
            assert seen == list(range(1, 22))
            marks: list[str] = []
            async with anyio.create_task_group() as tg:
                # The tail stays open while beta is killed under it.
                tg.start_soon(tail, beta.url(sid), offset, seen, 10**9, marks)
                for i in range(5):
                    await on_a.append_message(sid, "user", f"live {i}")
                while len(seen) < 26:
                    await anyio.sleep(0.05)  # paces the check; the tail is under test
                beta.kill()
            offset = marks[-1]  # the last control event before the kill
            for i in range(15):
                await on_a.append_message(sid, "user", f"while down {i}")
            beta.start()
            tail_done = anyio.Event()

            async def resume() -> None:
                await tail(beta.url(sid), offset, seen, until=61)
                tail_done.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(resume)
                for i in range(20):
                    await on_a.append_message(sid, "user", f"after {i}")
                with anyio.fail_after(120):
                    await tail_done.wait()
        finally:
            beta.stop()
    assert seen == list(range(1, 62))
