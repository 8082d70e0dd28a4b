"""The wire itself: NDJSON framing, JSON-RPC 2.0 batches and errors, limits, peer metadata."""

from __future__ import annotations

import json
import os
import socket
from typing import Any

import anyio
import pytest
from conftest import Daemon, as_user, eventually

from sessiond import AsyncClient
from sessiond_daemon.features.service import VERSION
from sessiond_schemas import rpc

pytestmark = pytest.mark.anyio


class RawConnection:
    """A plain socket speaking lines, as `socat` would."""

    def __init__(self, path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.settimeout(10)
        self.file = self.sock.makefile("rb")

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def line(self) -> Any:
        raw = self.file.readline()
        return json.loads(raw) if raw else None

    def close(self) -> None:
        self.file.close()
        self.sock.close()


async def exchange(path: str, data: bytes, replies: int) -> list[Any]:
    def run() -> list[Any]:
        conn = RawConnection(path)
        try:
            conn.send(data)
            return [conn.line() for _ in range(replies)]
        finally:
            conn.close()
    return await anyio.to_thread.run_sync(run)


def req(method: str, id: Any = 1, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": id, "method": method, "params": params}


def line(obj: Any) -> bytes:
    return json.dumps(obj).encode() + b"\n"


class TestFraming:
    async def test_not_json_then_keeps_serving(self, daemon: Daemon) -> None:
        """A line that is not JSON gets -32700 with id null; the next line is served."""
        a, b = await exchange(daemon.socket, b"{not json\n" + line(req("daemon.ping", 7)), 2)
        assert a["error"]["code"] == -32700 and a["id"] is None and "detail" in a["error"]["data"]
        assert b == {"jsonrpc": "2.0", "id": 7, "result": b["result"]} and b["result"]["pong"]

    async def test_invalid_utf8_and_nul(self, daemon: Daemon) -> None:
        """Invalid UTF-8 is a parse error; a NUL byte inside JSON is refused too."""
        a, b = await exchange(daemon.socket, b'{"jsonrpc":"2.0","id":1,"method":"\xff"}\n'
                              b'{"jsonrpc":"2.0","id":2,\x00"method":"daemon.ping"}\n', 2)
        assert a["error"]["code"] == -32700 and b["error"]["code"] == -32700

    async def test_not_a_request(self, daemon: Daemon) -> None:
        """Valid JSON that is not a request object is -32600."""
        replies = await exchange(
            daemon.socket, b'1\n{"jsonrpc":"1.0","id":1,"method":"daemon.ping"}\n'
                           b'{"jsonrpc":"2.0","id":1}\n', 3)
        assert [r["error"]["code"] for r in replies] == [-32600] * 3

    async def test_unknown_method(self, daemon: Daemon) -> None:
        """An unknown method is -32601 naming it, and the daemon's release and protocol."""
        [r] = await exchange(daemon.socket, line(req("no.such", 3)), 1)
        assert r["id"] == 3 and r["error"]["code"] == -32601
        assert r["error"]["data"] == {"method": "no.such", "version": VERSION,
                                      "protocol": rpc.PROTOCOL_VERSION}
        assert f"sessiond {VERSION}, protocol {rpc.PROTOCOL_VERSION}" in r["error"]["message"]

    async def test_positional_params_refused(self, daemon: Daemon) -> None:
        """Params must be an object: an array is -32602."""
        msg = {"jsonrpc": "2.0", "id": 1, "method": "session.get", "params": ["x"]}
        [r] = await exchange(daemon.socket, line(msg), 1)
        assert r["error"]["code"] == -32602 and r["error"]["data"]["path"] == "$"

    async def test_request_too_large_keeps_the_connection(self, daemon_overrides: dict[str, Any],
                                                          short_dir: str) -> None:
        """A line over max_request_bytes is read to its end and discarded, answered
        -32600 'request too large' under its own id (naming the setting), and the
        connection goes on serving the next line."""
        from conftest import daemon_config

        from sessiond_daemon.serve import lifecycle

        config = daemon_config(short_dir, max_request_bytes=1024)
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            await tg.start(lifecycle.run, config, stop)
            assert config.socket

            def run() -> tuple[Any, Any]:
                conn = RawConnection(config.socket or "")
                try:
                    conn.send(b'{"jsonrpc":"2.0","id":7,"method":"daemon.ping","params":{"x":"'
                              + b"a" * 100_000 + b'"}}\n'
                              + b'{"jsonrpc":"2.0","id":8,"method":"daemon.ping"}\n')
                    return conn.line(), conn.line()
                finally:
                    conn.close()

            first, second = await anyio.to_thread.run_sync(run)
            assert first["id"] == 7 and first["error"]["code"] == -32600
            assert first["error"]["message"] == "request too large"
            assert first["error"]["data"]["setting"] == "max_request_bytes"
            assert first["error"]["data"]["size"] > 100_000
            assert second["id"] == 8 and second["result"]["pong"]  # same connection
            async with AsyncClient(config.socket) as c:
                assert (await c.ping()).pong  # and the daemon serves others
            stop.set()

    async def test_blank_lines_are_ignored(self, daemon: Daemon) -> None:
        """Empty lines between requests are skipped, not errors."""
        [r] = await exchange(daemon.socket, b"\n\n" + line(req("daemon.ping", 1)), 1)
        assert r["result"]["pong"]


class TestBatches:
    async def test_mixed_batch(self, daemon: Daemon) -> None:
        """A batch of good, bad and notification requests answers each non-notification."""
        batch = [req("daemon.ping", 1), req("no.such", 2), {"foo": 1},
                 {"jsonrpc": "2.0", "method": "daemon.ping"},
                 req("session.get", 3, session_id="missing")]
        [replies] = await exchange(daemon.socket, line(batch), 1)
        by_id = {r["id"]: r for r in replies if r["id"] is not None}
        assert by_id[1]["result"]["pong"]
        assert by_id[2]["error"]["code"] == -32601
        assert by_id[3]["error"]["code"] == -32001
        assert [r["error"]["code"] for r in replies if r["id"] is None] == [-32600]
        assert len(replies) == 4

    async def test_empty_and_notification_only_batches(self, daemon: Daemon) -> None:
        """[] is one -32600; a batch of notifications gets no reply at all."""
        notes = [{"jsonrpc": "2.0", "method": "daemon.ping"}] * 2
        replies = await exchange(daemon.socket,
                                 b"[]\n" + line(notes) + line(req("daemon.ping", 9)), 2)
        assert replies[0]["error"]["code"] == -32600 and replies[0]["id"] is None
        assert replies[1]["id"] == 9

    async def test_notification_writes_but_is_silent(self, daemon: Daemon,
                                                     client: AsyncClient) -> None:
        """A notification is executed, and nothing is written back for it."""
        await client.create_session("note")
        msg = {"jsonrpc": "2.0", "method": "message.append",
               "params": {"session_id": "note", "role": "user", "content": "silent"}}
        [r] = await exchange(daemon.socket, line(msg) + line(req("daemon.ping", 5)), 1)
        assert r["id"] == 5
        # Pipelined requests may finish in any order: wait for the notification's effect.
        async def appended() -> bool:
            return (await client.get_session("note")).message_count == 1

        await eventually(appended, "the notification's message")

    async def test_string_and_null_ids_are_echoed(self, daemon: Daemon) -> None:
        """String ids and explicit null ids come back as given."""
        a, b = await exchange(daemon.socket, line(req("daemon.ping", "abc"))
                              + line(req("daemon.ping", None)), 2)
        assert {a["id"], b["id"]} == {"abc", None}
        assert all("result" in r for r in (a, b))


class TestPipelining:
    async def test_many_requests_on_one_connection(self, daemon: Daemon,
                                                   client: AsyncClient) -> None:
        """Pipelined requests on one connection all get their own answer."""
        await client.create_session("pipe")
        data = b"".join(line(req("message.append", i, session_id="pipe", role="user",
                                 content=f"m{i}")) for i in range(200))
        replies = await exchange(daemon.socket, data, 200)
        assert sorted(r["id"] for r in replies) == list(range(200))
        assert sorted(r["result"]["sequence"] for r in replies) == list(range(200))

    async def test_events_record_the_peer(self, client: AsyncClient) -> None:
        """Every event's meta holds the peer's uid and pid."""
        await client.create_session("who")
        [event] = (await client.read_events("who")).events
        assert event.meta.peer_uid == os.getuid() and event.meta.peer_pid == os.getpid()


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a client as another uid")
class TestPeerCheck:
    async def _ping_as_nobody(self, socket_path: str) -> dict[str, Any]:
        """Ping from a forked child running as `nobody` (it cannot run our interpreter)."""
        import pwd

        nobody = pwd.getpwnam("nobody")

        def ping() -> bytes:
            s = socket.socket(socket.AF_UNIX)
            s.connect(socket_path)
            s.sendall(b'{"jsonrpc":"2.0","id":1,"method":"daemon.ping"}\n')
            return s.makefile("rb").readline()

        def run() -> dict[str, Any]:
            return json.loads(as_user(nobody, ping))  # type: ignore[no-any-return]

        return await anyio.to_thread.run_sync(run)

    async def test_other_uid_is_refused_then_allowed(self) -> None:
        """Another uid gets -32006 with its uid; listed in allowed_uids it is served."""
        import pwd
        import tempfile

        from conftest import daemon_config, running_daemon

        uid = pwd.getpwnam("nobody").pw_uid
        with tempfile.TemporaryDirectory(prefix="sd-") as d:
            os.chmod(d, 0o755)  # let nobody reach the socket, so the daemon is what says no
            refused = daemon_config(d, socket_mode=0o666)
            async with running_daemon(refused):
                reply = await self._ping_as_nobody(refused.socket or "")
            assert reply["error"]["code"] == -32006 and reply["error"]["data"] == {"uid": uid}
            allowed = daemon_config(d, socket_mode=0o666, allowed_uids=[uid])
            async with running_daemon(allowed):
                reply = await self._ping_as_nobody(allowed.socket or "")
            assert reply["result"]["pong"] is True
