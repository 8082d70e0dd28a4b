"""The socket's serving path: lines cut where they are received, and a connection that has
no room for another line is not read (its input waits in the socket, not in the daemon)."""

from __future__ import annotations

import asyncio
import json
import socket
from typing import Any

import anyio
import pytest
from conftest import Daemon

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio

PING = b'{"jsonrpc":"2.0","id":"p","method":"daemon.ping"}\n'
REQUEST_TASK = "Server._serve_link.<locals>.run"  # the coroutine of a request's task


def read_lines(sock: socket.socket, count: int) -> list[Any]:
    """`count` lines from a blocking socket, decoded."""
    got, buffer = [], b""
    while len(got) < count:
        data = sock.recv(1 << 16)
        assert data, f"the daemon closed the connection after {len(got)} of {count} lines"
        buffer += data
        *lines, buffer = buffer.split(b"\n")
        got += [json.loads(line) for line in lines]
    return got


class TestBackPressure:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_reply_buffer": 64 << 10, "max_inflight": 16}

    @pytest.mark.slow_on_postgresql
    async def test_a_connection_without_room_is_not_read(self, daemon: Daemon) -> None:
        """A client that pipelines pings and reads nothing: once its unsent answers pass
        max_reply_buffer the daemon stops reading it, so what it sends next stays in the
        socket (the kernel's buffers, a few hundred KiB) and not in the daemon's memory
        (the old stream reader took up to twice max_request_bytes, 256 MiB). Once the
        client reads, every ping is answered on the same connection."""
        burst = PING * ((1 << 16) // len(PING))
        offered = 64 << 20

        def send() -> tuple[socket.socket, int]:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(daemon.socket)
            # Pacing, not a bound under test: a send that waits this long means the daemon
            # stopped reading. However slow the machine, the new daemon never takes more.
            sock.settimeout(2)
            sent = 0
            try:
                while sent < offered:
                    sent += sock.send(burst)
            except TimeoutError:
                pass
            return sock, sent

        sock, sent = await anyio.to_thread.run_sync(send)
        try:
            assert sent < 8 << 20, f"the daemon read {sent} bytes of a client that reads nothing"
            async with AsyncClient(daemon.socket) as other:  # everyone else is served
                assert (await other.ping()).pong
            whole = sent // len(PING)  # pings sent whole; the rest of a line never ends
            sock.settimeout(60)
            replies = await anyio.to_thread.run_sync(read_lines, sock, whole)
            assert all(r["id"] == "p" and r["result"]["pong"] for r in replies)
        finally:
            sock.close()


    @pytest.mark.fleet  # 4 s: the long suites' run
    async def test_a_writer_without_room_is_not_read(self, daemon: Daemon) -> None:
        """As above with appends, which the write lane answers without a task of their
        own: a client that reads none of its answers stops being read, and once it reads,
        every whole append it sent is answered and stored, in the order of its lines."""
        async with AsyncClient(daemon.socket) as c:
            sid = (await c.create_session()).session_id

        def append(i: int) -> bytes:
            return json.dumps({"jsonrpc": "2.0", "id": i, "method": "message.append",
                               "params": {"session_id": sid, "role": "user",
                                          "content": f"m{i}"}}).encode() + b"\n"

        def send() -> tuple[socket.socket, bytes]:
            sock = socket.socket(socket.AF_UNIX)
            sock.connect(daemon.socket)
            sock.settimeout(2)  # pacing, as above
            data = b"".join(append(i) for i in range(200_000))
            sent = 0
            try:
                while sent < len(data):
                    sent += sock.send(data[sent:sent + (1 << 16)])
            except TimeoutError:
                pass
            return sock, data[:sent]

        sock, sent = await anyio.to_thread.run_sync(send)
        try:
            assert len(sent) < 8 << 20, f"the daemon read {len(sent)} bytes of a client" \
                " that reads nothing"
            whole = sent.count(b"\n")
            sock.settimeout(60)
            replies = await anyio.to_thread.run_sync(read_lines, sock, whole)
            assert sorted(r["id"] for r in replies) == list(range(whole))
            assert all(r["result"]["sequence"] == r["id"] for r in replies)
        finally:
            sock.close()
        async with AsyncClient(daemon.socket) as c:
            assert (await c.get_session(sid)).message_count == whole


class TestWriteLane:
    async def test_appends_are_answered_without_a_task(self, daemon: Daemon,
                                                       client: AsyncClient) -> None:
        """message.append and events.append are queued on the writer where their line is
        read and answered from its decision: no request task; a read gets one."""
        sid = (await client.create_session()).session_id
        loop = asyncio.get_running_loop()
        factory = loop.get_task_factory()
        made: list[str] = []

        def counting(loop: asyncio.AbstractEventLoop, coro: Any, **kw: Any) -> Any:
            made.append(getattr(coro, "__qualname__", "?"))
            return factory(loop, coro, **kw) if factory else asyncio.Task(coro, loop=loop, **kw)

        loop.set_task_factory(counting)
        try:
            await client.append_message(sid, "user", "hi")
            await client.call("events.append", Any, session_id=sid, events=[
                {"type": "metadata.updated", "data": {"patch": {"k": 1}}}])
            appends = made.count(REQUEST_TASK)
            await client.get_session(sid)
            reads = made.count(REQUEST_TASK) - appends
        finally:
            loop.set_task_factory(factory)
        assert (appends, reads) == (0, 1), made
        events = (await client.read_events(sid)).events
        assert [e.type for e in events[-2:]] == ["message.appended", "metadata.updated"]


class TestLines:
    async def test_a_request_one_byte_at_a_time(self, daemon: Daemon) -> None:
        """A request that comes a byte a receive, then another in the same piece as the end
        of the first: both answered."""
        first = b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"}\n'

        def run() -> list[Any]:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(daemon.socket)
                sock.settimeout(60)
                for i in range(len(first) - 1):
                    sock.sendall(first[i:i + 1])
                sock.sendall(first[-1:] + PING)
                return read_lines(sock, 2)

        replies = await anyio.to_thread.run_sync(run)
        assert sorted(str(r["id"]) for r in replies) == ["1", "p"]

    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_request_bytes": 1024}

    async def test_a_line_too_long_that_the_input_ends_in(self, daemon: Daemon) -> None:
        """A line over max_request_bytes in many pieces, and the client's end of input
        before its newline: answered -32600 under its id, with what it sent; the requests
        before it answered too."""
        head = b'{"jsonrpc":"2.0","id":5,"method":"daemon.ping","params":{"x":"'

        def run() -> list[Any]:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(daemon.socket)
                sock.settimeout(60)
                sock.sendall(PING + head)
                for _ in range(20):
                    sock.sendall(b"a" * 500)
                sock.shutdown(socket.SHUT_WR)
                replies = read_lines(sock, 2)
                assert sock.recv(1) == b""  # then the daemon closes
                return replies

        replies = await anyio.to_thread.run_sync(run)
        by_id = {r["id"]: r for r in replies}
        assert by_id["p"]["result"]["pong"]
        assert by_id[5]["error"]["code"] == -32600
        assert by_id[5]["error"]["data"]["size"] == len(head) + 20 * 500

    async def test_requests_before_the_end_of_input_are_answered(self, daemon: Daemon) -> None:
        """Pipelined writes, then the client shuts its sending side: each is answered
        and stored before the connection closes."""
        async with AsyncClient(daemon.socket) as c:
            sid = (await c.create_session()).session_id
        lines = b"".join(
            json.dumps({"jsonrpc": "2.0", "id": i, "method": "message.append",
                        "params": {"session_id": sid, "role": "user",
                                   "content": f"m{i}"}}).encode() + b"\n"
            for i in range(50))

        def run() -> list[Any]:
            with socket.socket(socket.AF_UNIX) as sock:
                sock.connect(daemon.socket)
                sock.settimeout(60)
                sock.sendall(lines)
                sock.shutdown(socket.SHUT_WR)
                replies = read_lines(sock, 50)
                assert sock.recv(1) == b""
                return replies

        replies = await anyio.to_thread.run_sync(run)
        assert sorted(r["id"] for r in replies) == list(range(50))
        assert all("result" in r for r in replies)
        async with AsyncClient(daemon.socket) as c:
            assert (await c.get_session(sid)).message_count == 50
