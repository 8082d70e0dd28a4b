"""The MCP server (docs/mcp.md) through the `mcp` SDK's own clients, against a real daemon
on both stores: `sessionctl mcp` over stdio (mcp.client.stdio, relaying to the daemon's
MCP socket) and `/mcp` on the HTTP face (mcp.client.streamable_http).

Each tool's answer, its size bound (ANSWER_BYTES, with a cursor that goes on), a search
that finds a session imported from a Claude Code transcript, and peers: what a peer's
agent may do is what the peer may (its grants, its uid recorded), and a uid the daemon
does not let in is refused.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx
import httpx2
import msgspec
import pytest
from conftest import Daemon, as_user, daemon_config, eventually, wait_for_daemon
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from test_security import as_peer, peer_user, shared_dir

from sessiond import AsyncClient
from sessiond_daemon.core.access import DEFAULT_PEER_METHODS, Grants
from sessiond_daemon.serve import lifecycle
from sessiond_daemon.serve.mcp_tools import ANSWER_BYTES, CONTENT_CHARS
from sessiond_daemon.serve.web.auth import PEER_UID
from sessiond_schemas.paths import http_token_path, mcp_socket_path

pytestmark = pytest.mark.anyio
__all__ = ["shared_dir"]  # a fixture of test_security's, used here

CLAUDE_CODE = os.path.join(os.path.dirname(__file__), "fixtures", "transcripts", "claude-code",
                           "projects")
TOOLS = {"search_sessions", "list_sessions", "read_messages", "get_session", "fork_session"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def daemon_overrides(short_dir: str) -> dict[str, Any]:
    return {"http_listen": [f"127.0.0.1:{free_port()}"]}


def token(socket_path: str, *, peer: bool = False) -> str:
    return Path(http_token_path(socket_path, peer=peer)).read_text().strip()


@asynccontextmanager
async def connected(daemon: Daemon, transport: str, *, peer: bool = False
                    ) -> AsyncIterator[ClientSession]:
    """An initialized MCP client session: `sessionctl mcp` spawned by the SDK's stdio
    client, or the SDK's Streamable HTTP client on /mcp (the owner's token in a header,
    or the peer's as the capability prefix /t/<token>)."""
    if transport == "stdio":
        assert not peer
        params = StdioServerParameters(command=sys.executable, args=[
            "-m", "sessiond.cli", "--socket", daemon.socket, "mcp"])
        async with stdio_client(params) as (r, w), ClientSession(r, w) as s:
            await s.initialize()
            yield s
        return
    where = f"http://{daemon.config.http_listen[0]}"
    if peer:
        url, headers = f"{where}/t/{token(daemon.socket, peer=True)}/mcp", {}
    else:
        url, headers = f"{where}/mcp", {"authorization": f"Bearer {token(daemon.socket)}"}
    async with httpx2.AsyncClient(headers=headers, timeout=60) as http, \
            streamable_http_client(url, http_client=http) as (r, w), \
            ClientSession(r, w) as s:
        await s.initialize()
        yield s


async def call(s: ClientSession, tool: str, **arguments: Any) -> dict[str, Any]:
    """A tool's answer, checked to be one JSON text within the documented bound."""
    result = await s.call_tool(tool, arguments)
    assert not result.is_error, result.content
    [content] = result.content
    assert content.type == "text"
    assert len(content.text.encode()) <= ANSWER_BYTES, (tool, len(content.text.encode()))
    answer: dict[str, Any] = json.loads(content.text)
    return answer


async def refused(s: ClientSession, tool: str, **arguments: Any) -> str:
    result = await s.call_tool(tool, arguments)
    assert result.is_error, result.content
    text: str = result.content[0].text  # type: ignore[union-attr]
    return text


async def walk(s: ClientSession, tool: str, key: str, **arguments: Any
               ) -> list[list[dict[str, Any]]]:
    """Every page of a paged tool, following its cursor to the end."""
    pages = []
    cursor = None
    while True:
        answer = await call(s, tool, **arguments, **({"cursor": cursor} if cursor else {}))
        pages.append(answer[key])
        cursor = answer["cursor"]
        if cursor is None:
            return pages
        assert len(pages) < 200, "the cursor never ends"


async def import_claude_code(daemon: Daemon) -> None:
    result = await anyio.run_process(
        [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "import",
         "--format", "claude-code", CLAUDE_CODE, "--json"], check=False)
    assert result.returncode == 0, result.stderr.decode()


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_each_tool(daemon: Daemon, client: AsyncClient, transport: str) -> None:
    """Every tool through the SDK's client: a search finds how an imported Claude Code
    session fixed its bug, read_messages shows its tool calls and results, list_sessions
    pages through every session once, get_session shows the fork tree that fork_session
    made (and the fork is stored)."""
    await import_claude_code(daemon)
    async with connected(daemon, transport) as s:
        listed = (await s.list_tools()).tools
        assert {t.name for t in listed} == TOOLS
        by_name = {t.name: t for t in listed}
        assert by_name["search_sessions"].input_schema["required"] == ["query"]
        assert by_name["read_messages"].input_schema["required"] == ["session_id"]
        for t in listed:  # written for a model: what it finds, when to call it
            assert len(t.description or "") > 200 and "call it" in (t.description or "").lower()
        assert by_name["fork_session"].annotations.read_only_hint is False  # type: ignore
        assert by_name["search_sessions"].annotations.read_only_hint is True  # type: ignore

        # search: the imported transcript's fix, with its snippet and message sequence
        found = await call(s, "search_sessions", query="Decimal")
        [hit_session] = found["sessions"]
        sid = hit_session["session_id"]
        hit = next(h for h in hit_session["hits"] if h.get("sequence") is not None)
        assert "«Decimal»" in hit["snippet"]
        state = await client.get_session(sid)
        assert state.source == "claude-code"
        # filters reach the search: none of these is failed
        assert (await call(s, "search_sessions", query="Decimal", status=["failed"])
                )["sessions"] == []

        # read: the conversation up to the fix, with its tool calls and their results
        read = await call(s, "read_messages", session_id=sid)
        messages = read["messages"]
        assert read["total_messages"] == state.message_count == len(messages)
        assert [m["sequence"] for m in messages] == list(range(len(messages)))
        calls = [c for m in messages for c in m.get("tool_calls", [])]
        results = [m for m in messages if m["role"] == "tool"]
        assert calls and results
        assert {r["tool_call_id"] for r in results} <= {c["id"] for c in calls}
        assert any(c["name"] == "Grep" and c["input"]["pattern"] == "def total"
                   for c in calls)
        assert "Decimal" in messages[hit["sequence"]]["content"]
        tail = await call(s, "read_messages", session_id=sid, from_sequence=hit["sequence"])
        assert tail["messages"][0]["sequence"] == hit["sequence"]

        # list: every session once, a page at a time, filters applied
        everything = (await client.list_sessions(limit=1000)).sessions
        pages = await walk(s, "list_sessions", "sessions", limit=1)
        assert all(len(p) == 1 for p in pages)
        assert sorted(x["session_id"] for p in pages for x in p) == sorted(
            x.session_id for x in everything)
        imported = await call(s, "list_sessions", source="claude-code")
        assert sid in {x["session_id"] for x in imported["sessions"]}
        assert {x.session_id for x in everything if x.status == "failed"} == {
            x["session_id"] for x in (await call(s, "list_sessions", status=["failed"]))[
                "sessions"]}

        # fork (a write) and the fork tree, both ways
        forked = (await call(s, "fork_session", session_id=sid))["session"]
        fid = forked["session_id"]
        assert forked["forked_from"] == {"session_id": sid, "version": state.version}
        stored = await client.get_session(fid)
        assert stored.forked_from is not None and stored.forked_from.session_id == sid
        assert stored.message_count == state.message_count
        again = await call(s, "fork_session", session_id=fid, at_version=1,
                           idempotency_key="k1")
        twice = await call(s, "fork_session", session_id=fid, at_version=1,
                           idempotency_key="k1")
        assert again["session"]["session_id"] == twice["session"]["session_id"]
        gid = again["session"]["session_id"]
        tree = await call(s, "get_session", session_id=gid)
        assert tree["session"]["session_id"] == gid
        assert [a["session_id"] for a in tree["ancestors"]] == [fid, sid]
        root = await call(s, "get_session", session_id=sid)
        assert root["ancestors"] == [] and root["fork_count"] == 1
        assert [f["session_id"] for f in root["forks"]] == [fid]
        assert root["session"]["source"] == "claude-code"
        assert root["session"]["message_count"] == state.message_count

        # a bad argument or a missing session is the tool's error, saying what is wrong
        assert "limit" in await refused(s, "list_sessions", limit=0)
        assert "-32001" in await refused(s, "get_session", session_id="no-such-session")
        assert "cursor" in await refused(s, "list_sessions", cursor="not-a-cursor!")


@pytest.mark.parametrize("transport", ["stdio", "http"])
async def test_size_bounds(daemon: Daemon, client: AsyncClient, transport: str) -> None:
    """Sessions far larger than an answer: every answer stays within ANSWER_BYTES, long
    texts say they were cut, and the cursors give every item exactly once."""
    big = (await client.create_session(task="needle " + "t" * 5000)).session_id
    await client.append_messages(big, [
        {"role": "assistant", "content": f"needle {i} " + "c" * 6000,
         "metadata": {"tool_calls": [{"id": f"call{i}", "name": "Edit",
                                      "input": {"code": "x" * 8000}}]}}
        for i in range(40)])
    await client.append_message(big, "assistant", "w" * 50_000, metadata={"tool_calls": [
        {"id": "i" * 2000, "name": "n" * 2000, "input": {"code": "x" * 20_000}}] * 30})
    await client.update_memory(big, {"notes": "m" * 30_000, "more": ["n" * 100] * 300})
    for i in range(30):
        await client.create_session(task=f"needle haystack {i} " + "h" * 3000)
    async with connected(daemon, transport) as s:
        # read_messages: pages cut to the bound, contents cut saying how long they were
        pages = await walk(s, "read_messages", "messages", session_id=big, limit=50)
        assert len(pages) > 1
        sequences = [m["sequence"] for p in pages for m in p]
        assert sequences == list(range(41))
        widest = (await call(s, "read_messages", session_id=big, from_sequence=40))[
            "messages"]
        assert len(widest[0]["tool_calls"]) == 10 and widest[0]["tool_calls_left_out"] == 20
        first = pages[0][0]
        assert len(first["content"]) < CONTENT_CHARS + 100
        assert first["content"].endswith(f"[cut: {len('needle 0 ') + 6000} characters in all]")
        assert first["tool_calls"][0]["name"] == "Edit"
        assert "[cut:" in first["tool_calls"][0]["input"]

        # search: every matching session once, each answer within the bound
        pages = await walk(s, "search_sessions", "sessions", query="needle", limit=20,
                           hits=5)
        found = [x["session_id"] for p in pages for x in p]
        assert len(found) == len(set(found)) == 31 and big in found

        # list_sessions: the same
        pages = await walk(s, "list_sessions", "sessions", limit=50)
        assert len([x for p in pages for x in p]) == 31

        # get_session: memory past the bound is cut
        state = await call(s, "get_session", session_id=big)
        assert isinstance(state["session"]["memory"], str) and "[cut:" in state["session"][
            "memory"]
        assert state["session"]["message_count"] == 41


async def peer_uid_of(client: AsyncClient, session_id: str) -> int:
    """The uid recorded on a session's first event (the caller it was written for)."""
    read = await client.call("events.read", session_id=session_id, from_version=1, limit=1)
    uid: int = read["events"][0]["meta"]["peer_uid"]
    return uid


async def test_http_peer_token(short_dir: str, db_url: str) -> None:
    """The peer token's agent does what a peer may, recorded as the peer: with the
    default grants it searches and forks (the fork's event carries the peer token's uid);
    where its grants withhold session.fork, fork_session is refused with -32006 naming
    the grant, and nothing is written, while search goes on. A token that is not the
    daemon's gets 403 before any MCP."""
    config = daemon_config(short_dir, db=db_url, http_listen=[f"127.0.0.1:{free_port()}"])
    running = lifecycle.Daemon(config)
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(running.run, shutdown)
        daemon = Daemon(config, shutdown)
        async with AsyncClient(daemon.socket) as client:
            sid = (await client.create_session(task="peer visible")).session_id
            async with connected(daemon, "http", peer=True) as s:
                assert (await call(s, "search_sessions", query="visible"))["sessions"][0][
                    "session_id"] == sid
                fid = (await call(s, "fork_session", session_id=sid))["session"]["session_id"]
                assert await peer_uid_of(client, fid) == PEER_UID
            # A daemon whose peers may not fork (the grants a reload would set).
            assert running.server is not None
            running.server.grants = Grants(DEFAULT_PEER_METHODS - {"session.fork"})
            before = len((await client.list_sessions()).sessions)
            async with connected(daemon, "http", peer=True) as s:
                text = await refused(s, "fork_session", session_id=sid)
                assert "-32006" in text and "session.fork" in text
                assert (await call(s, "search_sessions", query="visible"))["sessions"]
            assert len((await client.list_sessions()).sessions) == before
            async with connected(daemon, "http") as s:  # the owner is never limited
                assert (await call(s, "fork_session", session_id=sid))["session"]
        async with httpx.AsyncClient(timeout=30) as http:
            answer = await http.post(f"http://{config.http_listen[0]}/t/nope/mcp",
                                     json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
            assert answer.status_code == 403
        shutdown.set()


@pytest.mark.sqlite_only("the peer's uid decides: the same on either store")
async def test_socket_peers(shared_dir: str) -> None:
    """On the MCP socket the peer's uid (SO_PEERCRED) decides: a uid the daemon does not
    let in gets -32006 and the connection ends; an allowed one is served as itself (its
    fork recorded with its uid), once a reload lets it in; a reload that takes it out
    ends its open session at the next message."""
    user = peer_user()
    config = daemon_config(shared_dir, socket_mode=0o666)
    daemon = lifecycle.Daemon(config)
    shutdown = anyio.Event()
    async with anyio.create_task_group() as tg:
        sock = await tg.start(daemon.run, shutdown)
        mcp_sock = mcp_socket_path(sock)
        async with AsyncClient(sock) as owner:
            sid = (await owner.create_session(task="peer socket")).session_id
            hello = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
                "protocolVersion": "2025-11-25", "capabilities": {},
                "clientInfo": {"name": "peer", "version": "1"}}}
            fork = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {
                "name": "fork_session", "arguments": {"session_id": sid}}}
            answers = await as_peer(mcp_sock, user, [hello, fork])
            assert answers[None]["error"]["code"] == -32006 and 1 not in answers
            daemon.reload(msgspec.structs.replace(config, allowed_uids=[user.pw_uid]))
            answers = await as_peer(mcp_sock, user, [hello, fork])
            assert answers[1]["result"]["serverInfo"]["name"] == "sessiond"
            forked = json.loads(answers[2]["result"]["content"][0]["text"])["session"]
            assert forked["forked_from"]["session_id"] == sid
            assert await peer_uid_of(owner, forked["session_id"]) == user.pw_uid
            # A reload that takes the uid out ends its open session at its next message.
            lines = await revoked_midway(mcp_sock, user, hello, lambda: daemon.reload(
                msgspec.structs.replace(config, allowed_uids=[])))
            assert lines[0]["result"]["serverInfo"]["name"] == "sessiond"
            assert lines[1]["id"] is None and lines[1]["error"]["code"] == -32006
            assert "access revoked" in lines[1]["error"]["message"]
        shutdown.set()
    assert not os.path.exists(mcp_sock)  # removed at the end, as the RPC socket is


@pytest.mark.sqlite_only("the peer's uid decides: the same on either store")
async def test_socket_bounds_a_peer(shared_dir: str) -> None:
    """A peer holds at most PEER_CONNECTIONS of the MCP socket's connections (the next is
    -32006, the owner's still served), and a message longer than MAX_MESSAGE_BYTES is
    refused (-32600) instead of held: what a peer can make the daemon hold is bounded."""
    from sessiond_daemon.serve.mcp_entry import MAX_MESSAGE_BYTES, PEER_CONNECTIONS
    user = peer_user()
    config = daemon_config(shared_dir, socket_mode=0o666, allowed_uids=[user.pw_uid])
    daemon = lifecycle.Daemon(config)
    shutdown = anyio.Event()
    hello = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": {
        "protocolVersion": "2025-11-25", "capabilities": {},
        "clientInfo": {"name": "peer", "version": "1"}}}).encode() + b"\n"

    def job(mcp_sock: str) -> bytes:
        held = []
        for _ in range(PEER_CONNECTIONS):  # each answered: counted by the daemon
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(30)
            s.connect(mcp_sock)
            s.sendall(hello)
            s.makefile("rb").readline()
            held.append(s)
        extra = socket.socket(socket.AF_UNIX)
        extra.settimeout(30)
        extra.connect(mcp_sock)
        refused = extra.makefile("rb").readline()
        held[0].sendall(b"x" * (MAX_MESSAGE_BYTES + 1))
        too_long = held[0].makefile("rb").readline()
        for s in [*held, extra]:
            s.close()
        return refused + too_long

    async with anyio.create_task_group() as tg:
        sock = await tg.start(daemon.run, shutdown)
        mcp_sock = mcp_socket_path(sock)
        out = await anyio.to_thread.run_sync(as_user, user, lambda: job(mcp_sock))
        refused, too_long = (json.loads(line) for line in out.splitlines())
        assert refused["error"]["code"] == -32006, refused
        assert "connections at most" in refused["error"]["message"]
        assert too_long["error"]["code"] == -32600, too_long
        # The owner is served meanwhile: its own connections are not counted as a peer's.
        from types import SimpleNamespace
        async with connected(SimpleNamespace(socket=sock), "stdio") as session:  # type: ignore[arg-type]
            assert (await session.list_tools()).tools
        shutdown.set()


async def revoked_midway(mcp_sock: str, user: Any, hello: dict[str, Any],
                         reload: Any) -> list[dict[str, Any]]:
    """As `user`: open an MCP session (initialize), wait while `reload` runs here, then send
    one more message; the lines the daemon answered."""
    with tempfile.TemporaryDirectory(prefix="sd-") as flags:
        os.chmod(flags, 0o777)
        ready, go = os.path.join(flags, "ready"), os.path.join(flags, "go")

        def job() -> bytes:
            s = socket.socket(socket.AF_UNIX)
            s.settimeout(30)
            s.connect(mcp_sock)
            f = s.makefile("rb")
            s.sendall(json.dumps(hello).encode() + b"\n")
            first = f.readline()
            open(ready, "w").close()
            while not os.path.exists(go):
                time.sleep(0.02)
            s.sendall(b'{"jsonrpc": "2.0", "id": 3, "method": "tools/list"}\n')
            return first + f.readline()

        async with anyio.create_task_group() as tg:
            out: list[bytes] = []

            async def peer() -> None:
                out.append(await anyio.to_thread.run_sync(as_user, user, job))

            tg.start_soon(peer)
            await eventually(lambda: os.path.exists(ready), "the peer's session")
            reload()
            open(go, "w").close()
        return [json.loads(line) for line in out[0].splitlines()]


async def test_sessionctl_mcp_without_daemon(short_dir: str) -> None:
    """`sessionctl mcp` with no daemon says where it looked, in one line, exit 2."""
    result = subprocess.run([sys.executable, "-m", "sessiond.cli", "--socket",
                             os.path.join(short_dir, "none.sock"), "mcp"],
                            capture_output=True, input=b"", check=False)
    assert result.returncode == 2
    where = mcp_socket_path(os.path.join(short_dir, "none.sock"))
    assert where.endswith("none.mcp.sock")
    assert where in result.stderr.decode() and b"Traceback" not in result.stderr


@pytest.mark.sqlite_only("what the daemon serves without the SDK: the same on either store")
def test_without_the_sdk(short_dir: str) -> None:
    """`pip install -e . && sessiond` without the extra `mcp`: the daemon serves as
    ever, binds no MCP socket, `/mcp` answers 404 and `sessionctl mcp` exits 2, both
    saying what to install."""
    port, sock = free_port(), os.path.join(short_dir, "s.sock")
    blocked = ("import sys; sys.modules.update(mcp=None, mcp_types=None);"
               " from sessiond_daemon.__main__ import main; main()")
    proc = subprocess.Popen([sys.executable, "-c", blocked, "--socket", sock, "--db",
                             os.path.join(short_dir, "d.db"), "--log-level", "warning",
                             "--http-listen", f"127.0.0.1:{port}"])
    try:
        wait_for_daemon(sock, proc)
        assert not os.path.exists(mcp_socket_path(sock))
        answer = httpx.post(f"http://127.0.0.1:{port}/t/{token(sock)}/mcp", timeout=30,
                            json={"jsonrpc": "2.0", "id": 1, "method": "ping"})
        assert answer.status_code == 404 and "sessiond[mcp]" in answer.text
        relay = subprocess.run([sys.executable, "-m", "sessiond.cli", "--socket", sock, "mcp"],
                               capture_output=True, input=b"", check=False)
        assert relay.returncode == 2 and b"sessiond[mcp]" in relay.stderr, relay.stderr
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    assert proc.returncode == 0
