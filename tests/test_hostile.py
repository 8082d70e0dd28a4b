"""Hostile and broken clients: each is answered or cut off, and everyone else is served."""

from __future__ import annotations

import contextlib
import json
import socket
from typing import Any

import anyio
import pytest
from conftest import Daemon, daemon_config, eventually, running_daemon
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio

PING = b'{"jsonrpc":"2.0","id":"ping","method":"daemon.ping"}\n'


class Raw:
    """A blocking line client for hostile traffic (run it in a thread)."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX)
        self.sock.connect(path)
        self.sock.settimeout(20)
        self.file = self.sock.makefile("rb")

    def until_ping(self, data: bytes) -> list[Any]:
        """Send `data` then a ping; return every message that came before the ping's answer."""
        self.sock.sendall(data + b"\n" + PING)
        before = []
        while True:
            line = self.file.readline()
            assert line, "the daemon closed the connection"
            msg = json.loads(line)
            if isinstance(msg, dict) and msg.get("id") == "ping":
                assert msg["result"]["pong"] is True
                return before
            before.append(msg)

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def assert_valid_reply(msg: Any) -> None:
    """A JSON-RPC 2.0 response, batch or notification, and never an internal error."""
    items = msg if isinstance(msg, list) else [msg]
    for item in items:
        assert item["jsonrpc"] == "2.0"
        if "method" in item:  # a subscription notification
            assert item["method"].startswith("subscription.")
            continue
        assert "id" in item and (("result" in item) != ("error" in item))
        if "error" in item:
            assert item["error"]["code"] != -32603, item
            assert isinstance(item["error"]["message"], str)


async def served_ok(daemon: Daemon) -> None:
    async with AsyncClient(daemon.socket) as c:
        assert (await c.ping()).pong


class TestHostileInput:
    async def test_deep_nesting_everywhere(self, daemon: Daemon, client: AsyncClient) -> None:
        """A million brackets, deep params, deep data: errors, not a dead daemon."""
        await client.create_session("deep")
        deep = "[" * 5000 + "]" * 5000
        lines = [
            b"[" * 1_000_000,
            b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping","params":' + deep.encode() + b"}",
            b'{"jsonrpc":"2.0","id":2,"method":"message.append","params":{"session_id":"deep",'
            b'"role":"user","content":"x","metadata":{"a":' + deep.encode() + b"}}}",
            b'[{"jsonrpc":"2.0","id":3,"method":"daemon.ping","params":' + deep.encode() + b"}]",
        ]

        def run() -> list[list[Any]]:
            raw = Raw(daemon.socket)
            try:
                return [raw.until_ping(line) for line in lines]
            finally:
                raw.close()

        replies = await anyio.to_thread.run_sync(run)
        codes = [r[0]["error"]["code"] if isinstance(r[0], dict) else r[0][0]["error"]["code"]
                 for r in replies]
        assert all(code in (-32700, -32600, -32602) for code in codes), codes
        assert (await client.get_session("deep")).message_count == 0
        await served_ok(daemon)

    @pytest.mark.parametrize("daemon_overrides", [{"max_request_bytes": 1 << 20}])
    async def test_huge_line_is_discarded_and_the_connection_goes_on(self, daemon: Daemon) -> None:
        """A 64 MiB line (over max_request_bytes) is read and discarded: -32600 (id null,
        as the line does not begin with one), and the same connection serves the next."""
        def run() -> tuple[Any, Any]:
            raw = Raw(daemon.socket)
            try:
                raw.sock.sendall(b'{"x":"' + b"a" * (64 << 20) + b'"}\n'
                                 + b'{"jsonrpc":"2.0","id":2,"method":"daemon.ping"}\n')
                return json.loads(raw.file.readline()), json.loads(raw.file.readline())
            finally:
                raw.close()

        first, second = await anyio.to_thread.run_sync(run)
        assert first["error"]["code"] == -32600 and first["id"] is None
        assert first["error"]["data"]["size"] == (64 << 20) + 9
        assert second["id"] == 2 and second["result"]["pong"]
        await served_ok(daemon)

    async def test_half_request_then_gone(self, daemon: Daemon) -> None:
        """Half a request and a disconnect leave nothing behind."""
        def run() -> None:
            raw = Raw(daemon.socket)
            raw.sock.sendall(b'{"jsonrpc":"2.0","id":1,"method":"session.cre')
            raw.close()

        await anyio.to_thread.run_sync(run)
        await served_ok(daemon)
        async with AsyncClient(daemon.socket) as c:

            async def alone() -> bool:
                return (await c.stats()).connections == 1

            await eventually(alone, "the half request's connection to be gone")

    async def test_client_that_never_reads(self, daemon: Daemon, client: AsyncClient) -> None:
        """A client that pipelines thousands of requests and reads nothing stalls only itself."""
        await client.create_session("quiet")
        big = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "session.get",
                          "params": {"session_id": "quiet"}}).encode() + b"\n"
        raw = socket.socket(socket.AF_UNIX)
        raw.connect(daemon.socket)
        raw.setblocking(False)
        sent = 0
        try:
            for _ in range(20_000):
                try:
                    sent += raw.send(big)
                except BlockingIOError:
                    break  # the daemon stopped reading us: back-pressure
            assert sent < 20_000 * len(big)
            with anyio.fail_after(10):
                for i in range(20):
                    await client.append_message("quiet", "user", f"still served {i}")
        finally:
            raw.close()
        await served_ok(daemon)


async def test_connection_limit(short_dir: str) -> None:
    """Past max_connections a new connection gets -32008 and is closed; the rest go on."""
    config = daemon_config(short_dir, max_connections=20)
    async with running_daemon(config) as d:
        def run() -> list[Any]:
            socks = []
            try:
                for _ in range(20):
                    s = socket.socket(socket.AF_UNIX)
                    s.connect(d.socket)
                    s.sendall(PING)
                    assert b"pong" in s.makefile("rb").readline()
                    socks.append(s)
                extra = Raw(d.socket)
                reply = json.loads(extra.file.readline())
                extra.close()
                return [reply]
            finally:
                for s in socks:
                    s.close()

        [reply] = await anyio.to_thread.run_sync(run)
        assert reply["error"]["code"] == -32008
        await served_ok(d)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4)
    | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
methods = st.sampled_from(["daemon.ping", "session.create", "session.get", "message.append",
                           "events.append", "events.read", "session.list", "memory.update",
                           "checkpoint.save", "session.transition", "nope", ""])
requests = st.fixed_dictionaries(
    {"jsonrpc": st.sampled_from(["2.0", "1.0", 2])},
    optional={"id": st.none() | st.integers() | st.text(max_size=5),
              "method": methods | st.text(max_size=10), "params": json_values,
              "extra": json_values})
lines = st.one_of(
    st.binary(max_size=200).map(lambda b: b.replace(b"\n", b" ")),
    json_values.map(lambda v: json.dumps(v).encode()),
    requests.map(lambda r: json.dumps(r).encode()),
    st.lists(requests, max_size=4).map(lambda rs: json.dumps(rs).encode()),
)


@pytest.mark.slow_on_postgresql
@settings(max_examples=300, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(line=lines)
async def test_fuzzed_lines_get_valid_answers(daemon: Daemon, line: bytes) -> None:
    """Any line gets well-formed JSON-RPC answers (never -32603) and the daemon goes on."""
    def run() -> list[Any]:
        raw = Raw(daemon.socket)
        try:
            return raw.until_ping(line)
        finally:
            raw.close()

    for msg in await anyio.to_thread.run_sync(run):
        assert_valid_reply(msg)


@pytest.mark.slow_on_postgresql
async def test_thousands_of_connections_at_once(daemon: Daemon) -> None:
    """1,500 connections at once: max_connections are served, the rest get -32008; no harm."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4000:
        pytest.skip(f"needs 4,000 file descriptors, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 4000), hard))
    limit = daemon.config.max_connections

    def flood() -> tuple[int, int]:
        socks = []
        try:
            for _ in range(limit + 476):
                s = socket.socket(socket.AF_UNIX)
                s.connect(daemon.socket)
                s.settimeout(30)
                socks.append(s)
            for s in socks:
                # A refused connection is answered at once and closed a second later
                # (server.py, _linger): on a slow machine it can be closed before its
                # ping is sent. Its answer, -32008, is still there to read.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    s.sendall(PING)
            served = refused = 0
            for s in socks:
                reply = json.loads(s.makefile("rb").readline())
                if "result" in reply:
                    served += 1
                else:
                    assert reply["error"]["code"] == -32008
                    refused += 1
            return served, refused
        finally:
            for s in socks:
                s.close()

    try:
        served, refused = await anyio.to_thread.run_sync(flood)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    assert served == limit and refused == 476
    await served_ok(daemon)
