"""The client library itself: the blocking Client, and AsyncClient under trio."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from pathlib import Path

import anyio
import pytest
from conftest import Daemon

from sessiond import (
    AsyncClient,
    Client,
    ConnectionLostError,
    InvalidTransitionError,
    SessionNotFoundError,
    SessionState,
)

pytestmark = pytest.mark.anyio


async def in_thread(fn: object) -> object:
    return await anyio.to_thread.run_sync(fn)  # type: ignore[arg-type]


class TestBlockingClient:
    async def test_same_methods_blocking(self, daemon: Daemon) -> None:
        """Client has AsyncClient's methods, answering at once with typed results."""
        def run() -> None:
            with Client(daemon.socket) as c:
                assert c.ping().pong
                s = c.create_session(task="sync")
                assert isinstance(s, SessionState)
                r = c.append_message(s.session_id, "user", "hello")
                assert r.sequence == 0
                assert c.resolve(s.session_id[:8]) == s.session_id
                assert c.list_checkpoints(s.session_id) == []
                c.link_plan(s.session_id, "p1")
                c.record_result(s.session_id, success=True, output={"a": 1})
                state = c.get_session(s.session_id)
                assert state.linked_plan_ids == ["p1"] and state.result.output == {"a": 1}
                with pytest.raises(InvalidTransitionError):
                    c.transition(s.session_id, "pending")
                with pytest.raises(SessionNotFoundError):
                    c.get_session("nope")
                assert c.delete_session(s.session_id) is True
        await in_thread(run)

    async def test_connects_lazily_and_is_thread_safe(self, daemon: Daemon) -> None:
        """The first call connects; threads sharing one Client each get their own answers."""
        def run() -> None:
            c = Client(daemon.socket)
            c.create_session("shared")
            errors: list[BaseException] = []

            def worker(n: int) -> None:
                try:
                    for i in range(25):
                        assert c.append_message("shared", "user", f"{n}-{i}").session_id == "shared"
                except BaseException as exc:  # pragma: no cover - reported below
                    errors.append(exc)

            threads = [threading.Thread(target=worker, args=(n,)) for n in range(8)]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            assert not errors
            assert c.get_session("shared").message_count == 200
            c.close()
        await in_thread(run)

    async def test_no_daemon(self, short_dir: str) -> None:
        """Connecting where no daemon listens raises OSError; a dead connection is reported."""
        def run() -> None:
            with pytest.raises(OSError):
                Client(os.path.join(short_dir, "none.sock")).ping()
        await in_thread(run)


async def test_async_client_under_trio(daemon: Daemon) -> None:
    """AsyncClient works on trio too (through anyio's streams)."""
    script = (
        "import anyio, sys\n"
        "from sessiond import AsyncClient\n"
        "async def main():\n"
        "    async with AsyncClient(sys.argv[1]) as c:\n"
        "        s = await c.create_session(task='trio')\n"
        "        async with anyio.create_task_group() as tg:\n"
        "            for i in range(20):\n"
        "                tg.start_soon(c.append_message, s.session_id, 'user', f'm{i}')\n"
        "        print((await c.get_session(s.session_id)).message_count)\n"
        "anyio.run(main, backend='trio')\n"
    )
    result = await anyio.run_process([sys.executable, "-c", script, daemon.socket])
    assert result.stdout.strip() == b"20"


async def test_async_client_reports_a_lost_daemon(short_dir: str) -> None:
    """Once the daemon stops, calls fail with ConnectionLostError (-32010 while it drains)."""
    from conftest import daemon_config

    from sessiond import ShuttingDownError
    from sessiond_daemon.serve import lifecycle

    config = daemon_config(short_dir)
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(lifecycle.run, config, stop)
        async with AsyncClient(config.socket) as client:
            await client.ping()
            stop.set()
            with pytest.raises(ConnectionLostError), anyio.fail_after(10):
                while True:
                    with contextlib.suppress(ShuttingDownError):
                        await client.ping()
                    await anyio.sleep(0.01)


def test_plain_import_pulls_in_no_sdk() -> None:
    """`import sessiond` (and its integrations package) imports none of the SDKs."""
    code = ("import sys, sessiond, sessiond.integrations; "
            "print([m for m in ('agents', 'langgraph', 'google.adk', 'claude_agent_sdk')"
            " if m in sys.modules])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, env={**os.environ, "PYTHONPATH": os.pathsep.join(
                             ["client", "daemon", "schemas"])}, cwd=Path(__file__).parent.parent)
    assert out.stdout.strip() == "[]"
