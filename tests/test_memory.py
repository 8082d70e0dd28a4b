"""Memory from a single line: batch limits, max_inflight, unsent replies and pages by bytes."""

from __future__ import annotations

import array
import fcntl
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import termios
from collections.abc import AsyncIterator, Iterator
from typing import Any

import anyio
import pytest
from conftest import Daemon, daemon_config, eventually, wait_for_daemon

from sessiond import AsyncClient
from sessiond_daemon.serve import lifecycle

pytestmark = pytest.mark.anyio
MESSAGE = 60_000  # the 60 KB messages


def rpc_line(requests: list[dict[str, Any]] | dict[str, Any]) -> bytes:
    return json.dumps(requests, separators=(",", ":")).encode() + b"\n"


def call(i: int, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": i, "method": method, "params": params}


def exchange(path: str, line: bytes) -> Any:
    """Send one line, read one answer line."""
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(path)
        s.sendall(line)
        answer = b""
        while not answer.endswith(b"\n"):
            chunk = s.recv(1 << 20)
            assert chunk, "the daemon closed the connection"
            answer += chunk
    return json.loads(answer)


async def session_of(client: AsyncClient, count: int, size: int) -> str:
    sid = (await client.create_session()).session_id
    for start in range(0, count, 20):
        await client.append_messages(sid, [{"role": "user", "content": f"{i:06d}" + "x" * size}
                                           for i in range(start, min(count, start + 20))])
    return str(sid)


class TestBatchLimits:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_batch_requests": 4, "max_page_bytes": 20_000}

    async def test_batch_over_the_limit_is_refused_whole(self, daemon: Daemon) -> None:
        """A batch of more than max_batch_requests gets one -32600 naming the limit."""
        reply = await anyio.to_thread.run_sync(exchange, daemon.socket, rpc_line(
            [call(i, "daemon.ping") for i in range(5)]))
        assert isinstance(reply, dict) and reply["id"] is None
        assert reply["error"]["code"] == -32600
        assert "limit 4" in reply["error"]["message"]
        assert reply["error"]["data"]["limit"] == 4 and reply["error"]["data"]["size"] == 5
        at_limit = await anyio.to_thread.run_sync(exchange, daemon.socket, rpc_line(
            [call(i, "daemon.ping") for i in range(4)]))
        assert sorted(r["id"] for r in at_limit) == [0, 1, 2, 3]

    async def test_batch_items_share_one_page_budget(self, daemon: Daemon,
                                                     client: AsyncClient) -> None:
        """Each of n batch items gets max_page_bytes / n: the batch's answer stays one page."""
        sid = await session_of(client, 12, 2_000)
        single = await client.list_messages(sid)
        assert single.truncated_by_bytes and 8 <= len(single.messages) < 12
        reply = await anyio.to_thread.run_sync(exchange, daemon.socket, rpc_line(
            [call(i, "message.list", session_id=sid) for i in range(4)]))
        for item in reply:
            assert item["result"]["truncated_by_bytes"] is True
            assert 1 <= len(item["result"]["messages"]) <= 3


class TestPagesByBytes:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_page_bytes": 10_000}

    async def test_message_list_pages_by_bytes(self, client: AsyncClient) -> None:
        """A page ends at the budget and says so; paging on gets every message once."""
        sid = await session_of(client, 10, 3_000)
        seen: list[int] = []
        after = None
        while True:
            page = await client.list_messages(sid, after_sequence=after)
            seen += [m.sequence for m in page.messages]
            if not page.truncated_by_bytes:
                break
            assert len(page.messages) <= 3
            after = page.messages[-1].sequence
        assert seen == list(range(10))
        newest = await client.list_messages(sid, order="desc")
        assert newest.truncated_by_bytes and newest.messages[0].sequence == 9

    async def test_one_item_larger_than_the_budget_comes_alone(self,
                                                               client: AsyncClient) -> None:
        """A message over the whole budget is still returned, alone."""
        sid = await session_of(client, 2, 30_000)
        page = await client.list_messages(sid)
        assert len(page.messages) == 1 and page.truncated_by_bytes
        page = await client.list_messages(sid, after_sequence=0)
        assert len(page.messages) == 1 and not page.truncated_by_bytes

    async def test_events_read_sets_next_at_the_budget(self, client: AsyncClient) -> None:
        """events.read ends at the budget with `next` set, per session and globally."""
        sid = await session_of(client, 10, 3_000)
        versions: list[int] = []
        start: int | None = 1
        while start is not None:
            page = await client.read_events(sid, from_version=start)
            versions += [e.version for e in page.events]
            start = page.next
        assert versions == list(range(1, 12))  # created + 10 messages
        first = await client.read_events(None, limit=1000)
        assert first.truncated_by_bytes and first.next == first.events[-1].position

    async def test_session_list_and_states_page_by_bytes(self, client: AsyncClient) -> None:
        """session.list and session.states end at the budget with their cursor set."""
        for _ in range(8):
            await client.create_session(namespace="big", metadata={"pad": "p" * 2_000})
        states, cursor = [], None
        while True:
            page = await client.call("session.states", namespace="big", cursor=cursor)
            states += page["states"]
            if page["next"] is None:
                break
            assert page["truncated_by_bytes"] is True
            cursor = page["next"]
        assert len(states) == 8
        listed = await client.list_sessions(namespace="big", limit=100)
        assert len(listed.sessions) == 8 and not listed.truncated_by_bytes  # summaries are small
        for _ in range(6):
            await client.create_session(namespace="long", task="t" * 3_000)
        ids, cursor = [], None
        while True:
            summaries = await client.list_sessions(namespace="long", limit=100, cursor=cursor)
            ids += [s.session_id for s in summaries.sessions]
            if summaries.next_cursor is None:
                break
            assert summaries.truncated_by_bytes and len(summaries.sessions) <= 3
            cursor = summaries.next_cursor
        assert len(set(ids)) == 6


class TestCheckpointPages:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_page_bytes": 500}

    async def test_checkpoint_list_pages_by_bytes(self, client: AsyncClient) -> None:
        """checkpoint.list ends at the budget; `next` is the after_version to go on from."""
        sid = (await client.create_session()).session_id
        for i in range(12):
            await client.save_checkpoint(sid, {"i": i}, checkpoint_id=f"cp-{i:02d}-" + "n" * 40)
        ids, after = [], 0
        while True:
            page = await client.call("checkpoint.list", session_id=sid, after_version=after)
            ids += [cp["checkpoint_id"][:5] for cp in page["checkpoints"]]
            if page["next"] is None:
                break
            assert page["truncated_by_bytes"] is True
            after = page["next"]
        assert ids == [f"cp-{i:02d}" for i in range(12)]
        listed = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                          client.socket_path, "--json", "checkpoints", sid])
        assert len(json.loads(listed.stdout)) == 12  # sessionctl reads every page

    async def test_sessionctl_messages_says_the_page_was_cut(self, daemon: Daemon,
                                                             client: AsyncClient) -> None:
        """The human table of a page cut by bytes says how to ask for more."""
        sid = await session_of(client, 3, 300)
        shown = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                         daemon.socket, "messages", sid])
        assert "byte budget; more: --after " in shown.stdout.decode()


class TestUnreadReplies:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_reply_buffer": 64 << 10, "max_page_bytes": 4 << 20}

    async def test_a_client_that_does_not_read_is_not_read(self, daemon: Daemon,
                                                           client: AsyncClient) -> None:
        """Past max_reply_buffer unsent bytes the daemon reads no more of that client's
        requests; once the client reads, they run and are answered."""
        sid = await session_of(client, 12, 100_000)
        with socket.socket(socket.AF_UNIX) as idle:
            idle.connect(daemon.socket)
            idle.sendall(rpc_line(call(1, "message.list", session_id=sid, limit=1000)))
            # The answer is on its way: most of it still unsent.
            await eventually(lambda: unread(idle), "the first bytes of the answer")
            idle.sendall(rpc_line(call(2, "message.append", session_id=sid, role="user",
                                       content="after the big read")))
            for _ in range(3):  # round trips through the daemon and its writer meanwhile
                await client.ping()
                await client.create_session()
            assert (await client.get_session(sid)).message_count == 12  # not read yet
            answers = await anyio.to_thread.run_sync(read_lines, idle, 2)
        assert {a["id"] for a in answers} == {1, 2}
        assert (await client.get_session(sid)).message_count == 13


class TestInflight:
    async def test_batch_items_count_against_max_inflight(self, short_dir: str) -> None:
        """With max_inflight=2 a batch of 6 runs at most 2 items at once, and finishes."""
        config = daemon_config(short_dir, max_inflight=2)
        shutdown = anyio.Event()
        d = lifecycle.Daemon(config)
        running = {"now": 0, "most": 0}
        async with anyio.create_task_group() as tg:
            await tg.start(d.run, shutdown)
            assert d.server is not None
            ping = d.server._handlers["daemon.ping"]

            async def counted(p: Any, meta: Any) -> Any:
                running["now"] += 1
                running["most"] = max(running["most"], running["now"])
                for _ in range(5):  # let every other ready task run meanwhile
                    await anyio.sleep(0)
                running["now"] -= 1
                return await ping(p, meta)

            d.server._handlers["daemon.ping"] = counted
            reply = await anyio.to_thread.run_sync(exchange, config.socket, rpc_line(
                [call(i, "daemon.ping") for i in range(6)]))
            assert sorted(r["id"] for r in reply) == list(range(6))
            assert running["most"] == 2
            shutdown.set()


# --- the case, on a daemon in its own process --------------------------------


def vm(pid: int, field: str) -> int:
    """A /proc/<pid>/status figure (VmRSS, VmHWM) in bytes."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no {field} for {pid}")


def read_lines(sock: socket.socket, count: int) -> list[Any]:
    data = b""
    while data.count(b"\n") < count:
        chunk = sock.recv(1 << 20)
        assert chunk, "the daemon closed the connection"
        data += chunk
    return [json.loads(line) for line in data.splitlines()]


def unread(sock: socket.socket) -> int:
    buf = array.array("i", [0])
    fcntl.ioctl(sock.fileno(), termios.FIONREAD, buf)
    return buf[0]


@pytest.fixture
def daemon_flags() -> list[str]:
    """Override in a test class to start the process daemon with other settings."""
    return []


@pytest.fixture
def process_daemon(daemon_flags: list[str]) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    with tempfile.TemporaryDirectory(prefix="sd-") as directory:
        path = os.path.join(directory, "s.sock")
        proc = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", path,
                                 "--db", os.path.join(directory, "m.db"), "--log-level", "error",
                                 *daemon_flags])
        try:
            yield proc, path
        finally:
            stop(proc)


def stop(proc: subprocess.Popen[bytes]) -> None:
    """Stop a daemon process: SIGTERM, then SIGKILL if it has not exited within a minute."""
    proc.send_signal(signal.SIGTERM)
    try:
        proc.wait(timeout=60)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()


@pytest.fixture
async def process_client(process_daemon: tuple[subprocess.Popen[bytes], str]
                         ) -> AsyncIterator[AsyncClient]:
    proc, path = process_daemon
    await anyio.to_thread.run_sync(wait_for_daemon, path, proc)
    async with AsyncClient(path) as c:
        yield c


class TestOneLine:
    async def test_batch_of_message_lists_from_a_client_that_never_reads(
            self, process_daemon: tuple[subprocess.Popen[bytes], str],
            process_client: AsyncClient) -> None:
        """The issue's line: 40 message.list of 60 KB messages, never read. The daemon's
        peak RSS grows by far less than the replies would weigh whole (40 x 24 MB), and it
        still answers ping on another connection."""
        proc, path = process_daemon
        sid = await session_of(process_client, 400, MESSAGE)
        before = vm(proc.pid, "VmRSS")
        line = rpc_line([call(i, "message.list", session_id=sid, limit=1000)
                         for i in range(40)])
        assert len(line) < 5 << 10  # about the 4 KB
        with socket.socket(socket.AF_UNIX) as idle:
            idle.connect(path)
            idle.sendall(line)
            for _ in range(3):  # and more of it, on the same connection
                idle.sendall(rpc_line(call(99, "message.list", session_id=sid, limit=1000)))
            # A guard, not a measure: 40 pages of 24 MB take a while on a slow machine.
            await eventually(lambda: unread(idle), "answers to begin to arrive", patience=300)
            assert (await process_client.ping()).pong  # while this client reads nothing
            answers = await anyio.to_thread.run_sync(read_lines, idle, 4)
        peak = vm(proc.pid, "VmHWM")  # the high-water mark: the never-read phase included
        assert peak - before < 300 << 20, f"RSS grew by {(peak - before) >> 20} MB"
        batch = next(a for a in answers if isinstance(a, list))
        assert len(batch) == 40 and all(r["result"]["truncated_by_bytes"] for r in batch)
        assert proc.poll() is None


class TestManyLines:
    @pytest.fixture
    def daemon_flags(self) -> list[str]:
        # Small buffers, so that what the bound allows is small beside what the lines ask
        # for (250 answers of at least 64 x 60 KB: one item of a page always comes whole).
        return ["--max-reply-buffer", str(1 << 20), "--max-inflight", "16"]

    async def test_many_batch_lines_from_a_client_that_never_reads(
            self, process_daemon: tuple[subprocess.Popen[bytes], str],
            process_client: AsyncClient) -> None:
        """Line after line of 64-item batches, never read. The daemon stops reading the
        client past max_reply_buffer unsent bytes; answers already being built are kept up
        to twice that, then the client is closed. Memory stays about max_inflight pages,
        however many lines it sent."""
        proc, path = process_daemon
        sid = await session_of(process_client, 150, MESSAGE)
        before = vm(proc.pid, "VmRSS")
        line = rpc_line([call(i, "message.list", session_id=sid, limit=1000)
                         for i in range(64)])
        with socket.socket(socket.AF_UNIX) as idle:
            idle.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
            idle.connect(path)
            idle.setblocking(False)
            sent = 0
            with anyio.fail_after(120):  # a guard: the daemon stops reading us at some point
                while sent < 250:
                    try:
                        idle.send(line)
                        sent += 1
                    except BlockingIOError:  # it has stopped reading this client
                        break
            # What it did read is answered until the answers pile past twice the buffer:
            # then it closes this client, leaving only process_client connected.
            async def closed() -> bool:
                return (await process_client.stats()).connections == 1

            await eventually(closed, "the daemon to close the client that never reads")
            assert (await process_client.ping()).pong
            peak = vm(proc.pid, "VmHWM")
            with pytest.raises((BrokenPipeError, ConnectionResetError)):  # it was closed
                idle.send(line)
        assert peak - before < 60 << 20, f"RSS grew by {(peak - before) >> 20} MB"
        assert proc.poll() is None


class TestOutputPages:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_page_bytes": 2_000}

    async def test_session_output_pages_by_bytes(self, daemon: Daemon,
                                                 client: AsyncClient) -> None:
        """session.output ends at the budget with `next`; sessionctl output reads every page."""
        script = "for i in range(40): print(f'{i:03d} ' + 'o' * 100, flush=True)"
        state = await client.spawn([sys.executable, "-c", script], cwd="/", session_id="out")
        async def ended() -> bool:
            return (await client.get_session(state.session_id)).status != "active"

        await eventually(ended, "the script to end")
        lines: list[str] = []
        after = 0
        while True:
            page = await client.call("session.output", session_id="out", after_position=after)
            lines += page["lines"]
            if page["next"] is None:
                break
            assert page["truncated_by_bytes"] is True and len(page["lines"]) < 40
            after = page["next"]
        assert [line[:3] for line in lines] == [f"{i:03d}" for i in range(40)]
        done = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                        daemon.socket, "output", "out"])
        assert done.stdout.decode().splitlines() == lines


class TestGraphPages:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"max_page_bytes": 3_000}

    async def test_graph_list_pages_by_bytes(self, client: AsyncClient) -> None:
        """graph.list ends at the budget with `next`; following it as `cursor` (with
        `limit` less what came) gives every checkpoint once, newest first, across threads."""
        big = {"type": "json", "data": b"v" * 600}
        for thread in ("g1", "g2"):  # the same checkpoint ids in two threads: ties to page
            for i in range(6):
                await client.call("graph.put", session_id=thread, thread_id=thread,
                                  checkpoint_id=f"{i:04d}", checkpoint=big,
                                  channel_versions={"ch": str(i)}, blobs={"ch": big})
        seen: list[tuple[str, str]] = []
        cursor, limit = None, 11
        while True:
            page = await client.call("graph.list", cursor=cursor, limit=limit)
            seen += [(t["checkpoint_id"], t["session_id"]) for t in page["tuples"]]
            if page["next"] is None:
                break
            assert page["truncated_by_bytes"] is True and len(page["tuples"]) < limit
            cursor, limit = page["next"], limit - len(page["tuples"])
        expected = sorted(((f"{i:04d}", t) for i in range(6) for t in ("g1", "g2")),
                          key=lambda x: (-int(x[0]), x[1]))[:11]
        assert seen == expected
        bad = await anyio.to_thread.run_sync(exchange, client_socket(client), rpc_line(
            call(1, "graph.list", cursor="not-a-cursor")))
        assert bad["error"]["code"] == -32602 and bad["error"]["data"]["path"] == "$.cursor"


def client_socket(client: AsyncClient) -> str:
    return str(client.socket_path)
