"""A daemon process whose PostgreSQL goes away and comes back, through a TCP proxy the test
controls (the real server behind it; no restart of the shared server): it waits for the
database at start, saying so in STATUS=; a write during the outage fails with a retryable
-32012; once the database is back it serves again without a restart, a retry under the
same idempotency key is stored once, and nothing acknowledged before is lost."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from collections.abc import Iterator
from urllib.parse import urlsplit

import anyio
import pg
import pytest
from anyio.abc import SocketStream, TaskStatus
from conftest import eventually

from sessiond import AsyncClient
from sessiond_schemas.errors import StorageError

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


class Notify:
    """systemd's side of sd_notify: a datagram socket; the STATUS= lines received."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        name = f"sessiond-test-{uuid.uuid4().hex}"
        self.sock.bind("\0" + name)
        self.sock.setblocking(False)
        self.address = "@" + name
        self.lines: list[str] = []

    def seen(self, text: str, after: int = 0) -> bool:
        while True:
            try:
                data = self.sock.recv(4096)
            except BlockingIOError:
                break
            self.lines += data.decode().splitlines()
        return any(text in line for line in self.lines[after:])


class Proxy:
    """Forwards TCP connections on `port` to the PostgreSQL server; `down` cuts every
    connection and stops accepting, `serve` (again) accepts on the same port."""

    def __init__(self, port: int, target: tuple[str, int]) -> None:
        self.port, self.target = port, target
        self.accepting = anyio.CancelScope()
        self.connections: set[anyio.CancelScope] = set()

    async def serve(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        listener = await anyio.create_tcp_listener(local_host="127.0.0.1",
                                                   local_port=self.port, reuse_port=True)
        task_status.started()
        async with listener:
            with self.accepting:
                await listener.serve(self._forward)

    def down(self) -> None:
        self.accepting.cancel()
        for scope in list(self.connections):
            scope.cancel()
        self.accepting = anyio.CancelScope()

    async def _forward(self, client: SocketStream) -> None:
        with anyio.CancelScope() as scope:
            self.connections.add(scope)
            try:
                async with (client, await anyio.connect_tcp(*self.target) as server,
                            anyio.create_task_group() as tg):
                    tg.start_soon(_pump, client, server, tg.cancel_scope)
                    tg.start_soon(_pump, server, client, tg.cancel_scope)
            except OSError:
                pass
            finally:
                self.connections.discard(scope)


async def _pump(src: SocketStream, dst: SocketStream, scope: anyio.CancelScope) -> None:
    try:
        async for chunk in src:
            await dst.send(chunk)
    except (OSError, anyio.BrokenResourceError, anyio.ClosedResourceError):
        pass
    scope.cancel()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_a_database_outage_is_waited_out(pg_url: str, short_dir: str) -> None:
    real = urlsplit(pg_url)
    port = _free_port()
    via_proxy = real._replace(netloc=f"{real.username}@127.0.0.1:{port}").geturl()
    sock = os.path.join(short_dir, "d.sock")
    notify = Notify()
    proc = subprocess.Popen(
        [sys.executable, "-m", "sessiond_daemon", "--socket", sock, "--db", via_proxy,
         "--log-level", "error"], env=dict(os.environ, NOTIFY_SOCKET=notify.address))
    proxy = Proxy(port, (real.hostname or "127.0.0.1", real.port or 5432))
    try:
        # Nothing listens yet: the daemon waits, and says why.
        await eventually(lambda: notify.seen("STATUS=waiting for the database"),
                         "STATUS= waiting for the database")
        assert proc.poll() is None
        async with anyio.create_task_group() as tg:
            await tg.start(proxy.serve)
            await eventually(lambda: notify.seen("READY=1"), "READY=1")
            async with AsyncClient(sock) as c:
                s = await c.create_session()
                before = await c.append_message(s.session_id, "user", "before",
                                                idempotency_key="k0")
                mark = len(notify.lines)
                proxy.down()
                # In the outage a write fails, retryable, and nothing is half-written.
                with pytest.raises(StorageError) as failed:
                    await c.append_message(s.session_id, "user", "during",
                                           idempotency_key="k1")
                assert failed.value.data.get("retryable") is True
                await eventually(lambda: notify.seen("STATUS=waiting for the database",
                                                     after=mark),
                                 "STATUS= waiting for the database after the outage")
                await tg.start(proxy.serve)

                async def retried() -> object:
                    try:
                        return await c.append_message(s.session_id, "user", "during",
                                                      idempotency_key="k1")
                    except StorageError:
                        return None

                during = await eventually(retried, "a write once the database is back")
                again = await c.append_message(s.session_id, "user", "during",
                                               idempotency_key="k1")
                assert again == during
                events = (await c.read_events(s.session_id)).events
                assert [(e.version, e.meta.idempotency_key) for e in events] == [
                    (1, None), (2, "k0"), (3, "k1")]
                assert before.version == 2
            assert proc.poll() is None  # served again without a restart
            tg.cancel_scope.cancel()
    finally:
        proc.terminate()
        proc.wait()
        notify.sock.close()
