"""One memory budget on every face, and no stalled client that shuts a face (issue 45, §1
and §5): request bytes being received (an unfinished socket line, an HTTP body) and
reads reserved by their items' stored size count in max_reply_buffer_total whatever the
face; past it the heaviest connection is closed; a head, a body and a socket line each
have a deadline that fires without another byte; one peer cannot take every HTTP
connection from the owner."""

from __future__ import annotations

import contextlib
import encodings.idna  # noqa: F401  (the forked child, another uid, cannot import it)
import json
import os
import pwd
import select
import socket
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import version
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from conftest import PATIENCE_S, Daemon, daemon_config, eventually
from test_http import free_port
from test_memory import call, rpc_line
from test_security import peer_user

from sessiond import AsyncClient
from sessiond_daemon.serve import lifecycle

pytestmark = pytest.mark.anyio
BUDGET = 16 << 20
PAGE = 4 << 20  # what daemon.stats itself reserves while it runs (an estimate, not held)


def closed_by_daemon(sock: socket.socket, patience: float = PATIENCE_S) -> bytes:
    """Wait, sending nothing, until the daemon closes `sock`; return what it sent before.
    Fails if it is still open after `patience` seconds."""
    sock.setblocking(False)
    data = b""
    deadline = time.monotonic() + patience
    while time.monotonic() < deadline:
        ready, _, _ = select.select([sock], [], [], 0.5)
        if not ready:
            continue
        try:
            chunk = sock.recv(1 << 16)
        except (ConnectionResetError, BrokenPipeError):
            return data
        if not chunk:
            return data
        data += chunk
    raise AssertionError(f"the daemon kept the connection open {patience} s")


def http_socket(daemon: Daemon) -> str:
    return next(a for a in daemon.config.http_listen if "/" in a)


def unix(path: str, rcvbuf: int = 0) -> socket.socket:
    s = socket.socket(socket.AF_UNIX)
    if rcvbuf:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, rcvbuf)
    s.connect(path)
    return s


def post_head(path: str, length: int, content_type: str = "application/json") -> bytes:
    return (f"POST {path} HTTP/1.1\r\nhost: localhost\r\ncontent-type: {content_type}\r\n"
            f"content-length: {length}\r\n\r\n").encode()


async def stats(client: AsyncClient) -> Any:
    return await client.stats()


class TestDeadlines:
    @pytest.fixture
    def daemon_overrides(self, short_dir: str) -> dict[str, object]:
        return {"http_listen": [os.path.join(short_dir, "h.sock")],
                "http_head_timeout_s": 1.0, "http_body_timeout_s": 1.0,
                "http_idle_timeout_s": 30.0, "request_timeout_s": 1.0}

    async def test_half_a_head_is_cut_without_another_byte(self, daemon: Daemon) -> None:
        """Half a request head, then nothing: the connection is closed at the head's
        deadline (uvicorn's own idle timer stops at the first byte)."""
        with unix(http_socket(daemon)) as s:
            s.sendall(b"GET /v1/stream/x HTTP/1.1\r\nhost: loc")
            await anyio.to_thread.run_sync(closed_by_daemon, s)

    async def test_a_request_line_that_never_ends_is_cut(self, daemon: Daemon) -> None:
        with unix(http_socket(daemon)) as s:
            s.sendall(b"GET /" + b"a" * 1000)
            await anyio.to_thread.run_sync(closed_by_daemon, s)

    async def test_a_chunked_body_that_never_ends_is_cut(self, daemon: Daemon) -> None:
        """A chunked body whose last chunk never comes: closed at the body's deadline,
        counted from its head, without another byte."""
        with unix(http_socket(daemon)) as s:
            s.sendall(b"POST /v1/stream/x HTTP/1.1\r\nhost: localhost\r\ncontent-type:"
                      b" text/plain\r\ntransfer-encoding: chunked\r\n\r\n5\r\nhello\r\n")
            await anyio.to_thread.run_sync(closed_by_daemon, s)

    async def test_a_body_short_of_its_length_is_cut(self, daemon: Daemon) -> None:
        with unix(http_socket(daemon)) as s:
            s.sendall(post_head("/rpc", 1000) + b"{" * 999)
            await anyio.to_thread.run_sync(closed_by_daemon, s)

    async def test_a_socket_line_that_never_ends_is_answered_and_cut(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """A request line begun on the RPC socket and never ended: -32600 naming
        request_timeout_s, then the connection is closed; others are served meanwhile."""
        with unix(daemon.socket) as s:
            s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"')
            answer = await anyio.to_thread.run_sync(closed_by_daemon, s)
        reply = json.loads(answer)
        assert reply["error"]["code"] == -32600
        assert reply["error"]["data"]["setting"] == "request_timeout_s"
        assert (await client.ping()).pong

    async def test_a_request_that_completes_in_time_is_served(self, daemon: Daemon) -> None:
        """The deadlines do not touch a request that comes whole, nor a kept-alive
        connection between requests."""
        transport = httpx.AsyncHTTPTransport(uds=http_socket(daemon))
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as h:
            for _ in range(3):
                assert (await h.get("/v1/stream/none")).status_code == 404
                await anyio.sleep(0.6)  # a pause between requests, under the deadlines


class OtherUser:
    """Connections held open by another uid, in a forked child that became that user."""

    def __init__(self, user: pwd.struct_passwd) -> None:
        self.user = user

    @asynccontextmanager
    async def holding(self, connect: Any, count: int, first: bytes) -> AsyncIterator[int]:
        """The child opens `count` connections with `connect()`, sends `first` on each,
        and holds them until the block ends. Yields how many the daemon left open."""
        ready_r, ready_w = os.pipe()
        done_r, done_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: another uid, holding connections until told
            try:
                os.close(ready_r)
                os.close(done_w)
                os.setgroups([])
                os.setgid(self.user.pw_gid)
                os.setuid(self.user.pw_uid)
                socks = []
                for _ in range(count):
                    try:
                        s = connect()
                        s.sendall(first)
                        socks.append(s)
                    except OSError:
                        pass
                time.sleep(1.0)  # the daemon drops those over the cap as they come
                open_ = sum(1 for s in socks if _open(s))
                os.write(ready_w, str(open_).encode())
                os.close(ready_w)
                os.read(done_r, 1)
            finally:
                os._exit(0)
        os.close(ready_w)
        os.close(done_r)
        try:
            with os.fdopen(ready_r, "rb") as r:  # the daemon's loop runs meanwhile
                yield int(await anyio.to_thread.run_sync(r.read) or b"0")
        finally:
            os.close(done_w)
            await anyio.to_thread.run_sync(os.waitpid, pid, 0)


def _open(s: socket.socket) -> bool:
    s.setblocking(False)
    try:
        return s.recv(1, socket.MSG_PEEK) != b""
    except BlockingIOError:
        return True
    except OSError:
        return False


class TestConnectionsPerPeer:
    @pytest.fixture
    def daemon_overrides(self, short_dir: str) -> dict[str, object]:
        self.port = free_port()
        self.metrics_port = free_port()
        os.chmod(short_dir, 0o755)  # the other user reaches the sockets (socket_mode 0666)
        return {"http_listen": [os.path.join(short_dir, "h.sock"), f"127.0.0.1:{self.port}"],
                "socket_mode": 0o666,
                "metrics_listen": f"127.0.0.1:{self.metrics_port}",
                "allowed_uids": [peer_user().pw_uid],
                "http_max_connections": 40, "http_head_timeout_s": 600.0,
                "http_idle_timeout_s": 600.0}

    @pytest.mark.sqlite_only("the HTTP face's connections; the store plays no part")
    async def test_another_uid_cannot_take_the_owners_connections(
            self, daemon: Daemon) -> None:
        """Another local user opens every connection the HTTP face allows, each with half a
        head, on the Unix socket and on TCP (no token): the daemon keeps at most a quarter
        of them for that uid, on both together, and the owner's requests are served."""
        other = OtherUser(peer_user())
        path = http_socket(daemon)
        async with other.holding(lambda: unix(path), 40, b"GET / HTTP/1.1\r\n") as kept_unix, \
                other.holding(lambda: socket.create_connection(("127.0.0.1", self.port)),
                              40, b"GET / HTTP/1.1\r\n") as kept_tcp:
            # One uid, however it connects (TCP: found in the kernel's socket table).
            assert 1 <= kept_unix + kept_tcp <= 10, (kept_unix, kept_tcp)
            transport = httpx.AsyncHTTPTransport(uds=path)
            async with httpx.AsyncClient(transport=transport, base_url="http://localhost") as h:
                for _ in range(5):
                    assert (await h.get("/v1/stream/none")).status_code == 404
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{self.port}") as h:
                assert (await h.get("/v1/stream/none")).status_code == 401  # served: no token

    @pytest.mark.sqlite_only("the metrics listener's connections; the store plays no part")
    async def test_another_uid_cannot_shut_the_metrics_listener(self, daemon: Daemon) -> None:
        """32 half heads from another uid on --metrics-listen: the owner still scrapes."""
        other = OtherUser(peer_user())
        port = self.metrics_port
        async with other.holding(lambda: socket.create_connection(("127.0.0.1", port)), 32,
                           b"GET /metrics HTTP/1.1\r\n") as kept:
            assert 1 <= kept <= 8, kept
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as h:
                for _ in range(5):
                    assert (await h.get("/metrics")).status_code in (200, 404)


class TestBudgetOnEveryFace:
    @pytest.fixture
    def daemon_overrides(self, short_dir: str) -> dict[str, object]:
        return {"http_listen": [os.path.join(short_dir, "h.sock")],
                "max_reply_buffer_total": BUDGET, "http_body_timeout_s": 600.0,
                "request_timeout_s": 600.0, "http_send_timeout_s": 600.0}

    async def test_http_bodies_being_received_count_and_the_heaviest_is_closed(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """Bodies sent all but their last byte, on HTTP: their bytes count in the budget,
        and past it the connection holding the most is closed."""
        size = 6 << 20
        await _unfinished(client, http_socket(daemon),
                          post_head("/rpc", size) + b" " * (size - 1))

    async def test_socket_lines_being_received_count_and_the_heaviest_is_closed(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """Lines sent without their newline, on the RPC socket: the same."""
        await _unfinished(client, daemon.socket, b'{"a":"' + b"x" * (6 << 20))

    async def test_http_answers_count_and_the_heaviest_is_closed(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """HTTP clients POST /rpc events.read of a 3 MB event and never read: their answers
        count in the same budget, and past it the heaviest are closed."""
        sid = (await client.create_session()).session_id
        await client.append_messages(sid, [{"role": "user", "content": "x" * (3 << 20)}])
        body = json.dumps(call(1, "events.read", session_id=sid, from_version=2,
                               limit=1)).encode()
        socks = []
        try:
            for _ in range(12):
                s = unix(http_socket(daemon), rcvbuf=4096)
                s.sendall(post_head("/rpc", len(body)) + body)
                socks.append(s)

            async def closed() -> bool:
                return bool((await stats(client)).connections_closed_by_budget)

            await eventually(closed, "the budget to close an HTTP client that does not read")
            assert (await stats(client)).reply_bytes_held <= BUDGET + PAGE
        finally:
            for s in socks:
                s.close()
        await eventually(_all_released(client), "every answer to be given back")

    @pytest.mark.sqlite_only("a daemon of its own, reloaded to a smaller budget")
    async def test_a_read_reserves_its_items_stored_size(self, short_dir: str) -> None:
        """events.read of an event larger than the whole budget (written under a larger
        one) is refused before its answer is built, -32008 naming the budget, on the socket
        and on HTTP; a smaller item is served."""
        config = daemon_config(short_dir, http_listen=[os.path.join(short_dir, "h.sock")],
                               max_reply_buffer_total=64 << 20)
        daemon = lifecycle.Daemon(config)
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            sock = await tg.start(daemon.run, shutdown)
            async with AsyncClient(sock) as client:
                sid = (await client.create_session()).session_id
                await client.append_messages(sid, [{"role": "user",
                                                    "content": "x" * (10 << 20)}])
                daemon.reload(msgspec.structs.replace(config, max_reply_buffer_total=8 << 20))
                line = rpc_line(call(1, "events.read", session_id=sid, from_version=2,
                                     limit=1))
                with unix(sock) as s:
                    s.sendall(line)
                    reply = json.loads(await anyio.to_thread.run_sync(_line, s))
                assert reply["error"]["code"] == -32008, reply
                assert reply["error"]["data"]["setting"] == "max_reply_buffer_total"
                transport = httpx.AsyncHTTPTransport(uds=config.http_listen[0])
                async with httpx.AsyncClient(transport=transport,
                                             base_url="http://localhost") as h:
                    answer = (await h.post("/rpc", content=line, headers={
                        "content-type": "application/json"})).json()
                    assert answer["error"]["code"] == -32008, answer
                    small = (await h.post("/rpc", json=call(2, "events.read", session_id=sid,
                                                            limit=1))).json()
                    assert small["result"]["events"][0]["type"] == "session.created"
                assert (await client.stats()).reply_bytes_held <= 4 << 20
            shutdown.set()


async def _unfinished(client: AsyncClient, path: str, data: bytes) -> None:
    """Four connections to `path` each send `data` (a request not finished): past the
    budget the heaviest is closed, the total stays within it, and all is given back once
    they are gone."""
    socks = []
    try:
        for _ in range(4):
            s = unix(path)
            socks.append(s)
            await anyio.to_thread.run_sync(_send_quietly, s, data)
        s = await stats(client)
        assert s.connections_closed_by_budget >= 1
        assert s.reply_bytes_held <= BUDGET + PAGE
    finally:
        for s in socks:
            s.close()
    await eventually(_all_released(client), "every unfinished request to be given back")


class TestLongResponses:
    @pytest.fixture
    def daemon_overrides(self, short_dir: str) -> dict[str, object]:
        return {"http_listen": [os.path.join(short_dir, "h.sock")],
                "max_reply_buffer_total": BUDGET}

    async def test_an_sse_tail_reads_more_than_the_budget(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """One SSE response that delivers, page by page, twice the budget: what each page
        reserved is given back once it is sent, so the tail is never closed for what it
        has already delivered."""
        transport = httpx.AsyncHTTPTransport(uds=http_socket(daemon))
        text = {"content-type": "text/plain"}
        part = b"x" * (1 << 20)
        async with httpx.AsyncClient(transport=transport, base_url="http://localhost",
                                     timeout=PATIENCE_S) as h:
            assert (await h.put("/v1/stream/big", headers=text)).status_code == 201
            for _ in range(2 * BUDGET // len(part)):
                assert (await h.post("/v1/stream/big", content=part,
                                     headers=text)).status_code == 204
            seen = 0
            async with h.stream("GET", "/v1/stream/big",
                                params={"offset": "-1", "live": "sse"}) as r:
                async for chunk in r.aiter_bytes():
                    seen += chunk.count(b"x")
                    if seen >= 2 * BUDGET:
                        break
        assert seen >= 2 * BUDGET
        assert (await stats(client)).connections_closed_by_budget == 0


def _line(s: socket.socket) -> bytes:
    data = b""
    while not data.endswith(b"\n"):
        chunk = s.recv(1 << 20)
        assert chunk, "closed"
        data += chunk
    return data


def _send_quietly(s: socket.socket, data: bytes) -> None:
    """Send all of `data`, or until the daemon closes the connection."""
    s.settimeout(PATIENCE_S)
    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
        s.sendall(data)
    time.sleep(0.2)  # the daemon takes the last bytes sent


def _all_released(client: AsyncClient) -> Any:
    async def released() -> bool:
        s = await stats(client)
        return bool(s.reply_bytes_held is not None and s.reply_bytes_held <= 4 << 20)
    return released


def test_uvicorn_is_in_the_tested_range() -> None:
    """listen.py reads uvicorn's request cycle (no public hook gives a head's or a body's
    end): these are the attributes it needs, and the versions it was tested with."""
    from uvicorn.protocols.http.h11_impl import H11Protocol, RequestResponseCycle

    major, minor = (int(p) for p in version("uvicorn").split(".")[:2])
    assert (0, 30) <= (major, minor) < (0, 56), version("uvicorn")
    for name in ("connection_made", "connection_lost", "data_received",
                 "on_response_complete", "timeout_keep_alive_handler", "pause_writing",
                 "resume_writing"):
        assert callable(getattr(H11Protocol, name)), name
    cycle_fields = RequestResponseCycle.__init__.__code__.co_names
    for name in ("more_body", "response_complete", "disconnected", "body"):
        assert name in cycle_fields, name
    protocol_fields = H11Protocol.__init__.__code__.co_names
    for name in ("cycle", "limit_concurrency", "connections", "timeout_keep_alive_task",
                 "client"):
        assert name in protocol_fields, name


def test_asyncio_flow_control_is_where_it_was_tested() -> None:
    """server.py's _Link subclasses asyncio's FlowControlMixin (its drain) and gives
    StreamWriter its close waiter: both private to asyncio."""
    import asyncio.streams

    assert callable(asyncio.streams.FlowControlMixin._drain_helper)
    assert callable(asyncio.streams.FlowControlMixin._get_close_waiter)
