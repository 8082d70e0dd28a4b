"""An independent MCP client from npm against sessiond's MCP server: the MCP Inspector's
CLI mode (`@modelcontextprotocol/inspector --cli`), pinned in tests/mcp/package-lock.json
(.ci/run installs it with `npm ci`). It lists the tools and calls search, over Streamable
HTTP (/mcp, the owner's token in a header) and over stdio (spawning `sessionctl mcp`).

Node and npm are needed: without them this skips, unless SESSIOND_REQUIRE_NODE=1 (as
.ci/run sets), where it fails (tests/http_harness.py decides).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import http_harness
import pytest
from conftest import Daemon

from sessiond import AsyncClient
from sessiond_schemas.paths import http_token_path

pytestmark = [pytest.mark.anyio, pytest.mark.sqlite_only(
    "a client's view of the MCP server; test_mcp.py runs the tools on both stores")]

INSPECTOR_DIR = Path(__file__).resolve().parent / "mcp"
CLI = INSPECTOR_DIR / "node_modules" / "@modelcontextprotocol" / "inspector" / "clients" / \
    "launcher" / "build" / "index.js"
PATIENCE_S = 120  # a guard against a hung client, never a bound under test


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def daemon_overrides(short_dir: str) -> dict[str, Any]:
    return {"http_listen": [f"127.0.0.1:{free_port()}"]}


@pytest.fixture(scope="module")
def node() -> str:
    """`node`, with the Inspector's pinned packages installed (`npm ci` when missing or
    older than the lock)."""
    exe = http_harness.node()  # skips, or fails under SESSIOND_REQUIRE_NODE=1, without it
    installed = INSPECTOR_DIR / "node_modules" / ".package-lock.json"
    lock = INSPECTOR_DIR / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        npm = shutil.which("npm")
        assert npm is not None
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=INSPECTOR_DIR, capture_output=True, text=True, check=False)
        assert done.returncode == 0, f"npm ci in {INSPECTOR_DIR}:\n{done.stderr[-4000:]}"
    return exe


async def inspector(node: str, home: str, *args: str) -> Any:
    """Run the Inspector's CLI mode; its JSON answer."""
    with anyio.fail_after(PATIENCE_S):
        done = await anyio.run_process(
            [node, str(CLI), "--cli", *args],
            check=False, env={**os.environ, "HOME": home})
    out, err = done.stdout.decode(), done.stderr.decode()
    assert done.returncode == 0, f"inspector {args}: {done.returncode}\n{out}\n{err}"
    return json.loads(out)


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_inspector_lists_and_searches(daemon: Daemon, client: AsyncClient, node: str,
                                            short_dir: str, transport: str) -> None:
    sid = (await client.create_session(task="flaky checkout test")).session_id
    await client.append_message(sid, "assistant", "the checkout test raced the cart cache")
    if transport == "http":
        tok = Path(http_token_path(daemon.socket)).read_text().strip()
        target = [f"http://{daemon.config.http_listen[0]}/mcp", "--transport", "http",
                  "--header", f"Authorization: Bearer {tok}"]
    else:
        target = [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "mcp"]
    listed = await inspector(node, short_dir, *target, "--method", "tools/list")
    assert {t["name"] for t in listed["tools"]} == {
        "search_sessions", "list_sessions", "read_messages", "get_session", "fork_session"}
    found = await inspector(node, short_dir, *target, "--method", "tools/call",
                            "--tool-name", "search_sessions", "--tool-arg", "query=cache")
    assert not found.get("isError"), found
    answer = json.loads(found["content"][0]["text"])
    [session] = answer["sessions"]
    assert session["session_id"] == sid and "«cache»" in session["hits"][0]["snippet"]
