"""Access that outlives its grant (docs/security.md): a reload that no longer lets a peer
in ends its connections and subscriptions, saying why; and an idempotency key answers
only the uid that used it. Through real daemons and, as root, a real other uid."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Iterator
from typing import Any

import anyio
import msgspec
import pytest
from conftest import as_user, daemon_config
from test_security import peer_user, req

from sessiond import AsyncClient
from sessiond_daemon import lifecycle

pytestmark = pytest.mark.anyio


def connect_as(user: Any, path: str) -> socket.socket:
    """A connection to `path` made by a process of `user` (SO_PEERCRED says its uid),
    handed back to this process (SCM_RIGHTS) to be driven from here."""
    here, there = socket.socketpair()

    def job() -> bytes:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        socket.send_fds(there, [b"x"], [s.fileno()])
        return b"ok"

    try:
        assert as_user(user, job) == b"ok"
        _, fds, _, _ = socket.recv_fds(here, 1, 1)
    finally:
        here.close()
        there.close()
    s = socket.socket(fileno=fds[0])
    s.settimeout(60)  # a guard: a read the daemon never answers fails, not hangs
    return s


def lines(sock: socket.socket) -> Iterator[dict[str, Any]]:
    """The JSON lines the daemon sends on `sock`, until it closes it."""
    f = sock.makefile("rb")
    while line := f.readline():
        yield json.loads(line)


def until(stream: Iterator[dict[str, Any]], wanted: Any) -> list[dict[str, Any]]:
    """Read lines until one for which `wanted(line)` is true; return them all."""
    seen = []
    for line in stream:
        seen.append(line)
        if wanted(line):
            return seen
    raise AssertionError(f"the connection ended first: {seen}")


@pytest.fixture
def shared_dir() -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sd-") as d:
        os.chmod(d, 0o755)
        yield d


class TestRevokedOnReload:
    async def test_reload_ends_the_peers_connections_and_subscriptions(
            self, shared_dir: str) -> None:
        """A peer subscribed (and another of its connections idle) while allowed; the
        reload drops it from allowed_uids: its subscription ends with subscription.dropped
        (reason "access revoked: ..."), each connection gets -32006 and is closed, and
        nothing the owner writes afterwards reaches it. The owner's connection goes on."""
        user = peer_user()
        config = daemon_config(shared_dir, socket_mode=0o666, allowed_uids=[user.pw_uid])
        daemon = lifecycle.Daemon(config)
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            sock = await tg.start(daemon.run, shutdown)
            async with AsyncClient(sock) as owner:
                await owner.create_session("s")
                sub = connect_as(user, sock)
                idle = connect_as(user, sock)
                with sub, idle:
                    sub.sendall(json.dumps(req(1, "events.subscribe", session_id="s"))
                                .encode() + b"\n")
                    stream = lines(sub)
                    await anyio.to_thread.run_sync(until, stream, lambda m: m.get(
                        "method") == "subscription.caught_up")
                    await owner.append_message("s", role="user", content="while allowed")
                    seen = await anyio.to_thread.run_sync(until, stream, lambda m: m.get(
                        "method") == "subscription.event")
                    assert seen[-1]["params"]["event"]["type"] == "message.appended"
                    idle.sendall(json.dumps(req(2, "daemon.ping")).encode() + b"\n")
                    idle_stream = lines(idle)
                    assert "result" in await anyio.to_thread.run_sync(next, idle_stream)

                    changed = daemon.reload(msgspec.structs.replace(config, allowed_uids=[]))
                    assert "allowed_uids" in changed
                    await owner.append_message("s", role="user", content="after the reload")
                    rest = await anyio.to_thread.run_sync(lambda: list(stream))
                    assert [m.get("method") for m in rest] == ["subscription.dropped", None]
                    dropped, refused = rest
                    assert dropped["params"]["reason"].startswith("access revoked")
                    assert str(user.pw_uid) in dropped["params"]["reason"]
                    assert refused["id"] is None and refused["error"]["code"] == -32006
                    assert refused["error"]["data"] == {"uid": user.pw_uid,
                                                        "reason": "access revoked"}
                    idle_rest = await anyio.to_thread.run_sync(lambda: list(idle_stream))
                    assert [m["error"]["code"] for m in idle_rest] == [-32006]
                assert (await owner.get_session("s")).message_count == 2
                assert (await owner.ping()).pong
                stats = await owner.stats()
                assert stats.connections == 1 and stats.subscriptions == 0
            shutdown.set()
