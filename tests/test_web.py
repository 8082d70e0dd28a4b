"""The web view (docs/web.md) in a real browser: Debian's chromium driven by Playwright,
against a real daemon's HTTP face. Each page is saved as a screenshot under
$SESSIOND_SCREENSHOTS (.ci/run sets it and prints where), or a temporary folder."""

from __future__ import annotations

import json
import os
import shutil
import socket
import sys
import tempfile
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any
from urllib.parse import unquote

import anyio
import httpx
import pytest
from conftest import Daemon

from sessiond import AsyncClient
from sessiond_schemas.paths import http_token_path

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]

CHROMIUM = "/usr/bin/chromium"
# Without these, chromium reaches for Google's hosts, which this machine's network refuses.
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync"]
WAIT_MS = 30_000  # generous: each wait ends as soon as the page shows what it waits for
# What the pages may call without a button being pressed: reads only.
READS = {"session.list", "session.search", "session.get", "events.read", "progress.list",
         "session.forks", "session.trajectory", "session.output", "daemon.stats"}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    return {"http_listen": [f"127.0.0.1:{free_port()}"]}


def token(daemon: Daemon, *, peer: bool = False) -> str:
    return Path(http_token_path(daemon.socket, peer=peer)).read_text().strip()


def page_url(daemon: Daemon, *, peer: bool = False) -> str:
    return f"http://{daemon.config.http_listen[0]}/t/{token(daemon, peer=peer)}/ui/"


@pytest.fixture(scope="module")
def shots() -> Path:
    folder = os.environ.get("SESSIOND_SCREENSHOTS") or tempfile.mkdtemp(prefix="sd-shots-")
    path = Path(folder)
    path.mkdir(parents=True, exist_ok=True)
    print(f"web view screenshots: {path}")
    return path


@pytest.fixture
async def browser() -> AsyncIterator[Any]:
    try:
        from playwright.async_api import async_playwright
    except ImportError:
        if os.environ.get("SESSIOND_REQUIRE_BROWSER"):
            pytest.fail("playwright is missing and SESSIOND_REQUIRE_BROWSER is set")
        pytest.skip("playwright is not installed (pip install -e '.[test]')")
    if shutil.which(CHROMIUM) is None:
        if os.environ.get("SESSIOND_REQUIRE_BROWSER"):
            pytest.fail(f"{CHROMIUM} is missing and SESSIOND_REQUIRE_BROWSER is set")
        pytest.skip(f"{CHROMIUM} is not installed (apt-get install chromium)")
    async with async_playwright() as p:
        b = await p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            await b.close()


async def new_page(browser: Any, width: int = 1280, height: int = 800) -> tuple[Any, list[str]]:
    """A page of its own, and the list of /rpc methods it calls (read off each request)."""
    context = await browser.new_context(viewport={"width": width, "height": height})
    page = await context.new_page()
    calls: list[str] = []
    page.on("request", lambda r: calls.append(json.loads(r.post_data)["method"])
            if r.url.endswith("/rpc") else None)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.errors = errors
    return page, calls


async def load(c: AsyncClient) -> None:
    await c.create_session("web-1", task="fix the flaky login test", actor_name="team/alice",
                           namespace="prod")
    await c.append_message("web-1", "user", "please look at the needle in test_login")
    await c.append_message("web-1", "assistant", "running the test",
                           metadata={"tool_calls": [{"id": "call-1", "name": "pytest"}]})
    await c.append_message("web-1", "tool", "1 failed: test_login", tool_call_id="call-1")
    await c.record_tokens("web-1", input_tokens=1200, output_tokens=310, estimated_cost=0.004)
    for node in ("plan", "code", "code", "test"):
        await c.record_progress("web-1", node, latency_ms=12)
    await c.save_checkpoint("web-1", {"step": 3}, node_id="code")
    await c.create_session("web-2", task="write the docs", actor_name="team/bob",
                           namespace="dev")
    await c.append_message("web-2", "user", "nothing to see here")


class TestTour:
    async def test_list_search_session_live_fork_host(
            self, daemon: Daemon, client: AsyncClient, browser: Any, shots: Path,
            store_kind: str) -> None:
        """The list, a search, a session whose new message shows up live, a fork of it,
        and the host's figures, which are daemon.stats'."""
        await load(client)
        page, calls = await new_page(browser)
        await page.goto(page_url(daemon))
        rows = page.locator("#sessions tbody tr")
        await rows.first.wait_for(timeout=WAIT_MS)
        assert await rows.count() == 2
        assert "team/alice" in await page.locator("#sessions").inner_text()
        await page.screenshot(path=str(shots / f"list-{store_kind}.png"))

        if store_kind == "sqlite":  # full-text search is SQLite's (docs/protocol.md)
            await page.fill("input[name=q]", "needle")
            await page.press("input[name=q]", "Enter")
            marked = page.locator("#search-results mark")
            await marked.first.wait_for(timeout=WAIT_MS)
            assert await marked.first.inner_text() == "needle"
            assert await page.locator("#search-results > li").count() == 1
            await page.screenshot(path=str(shots / "search.png"))
            await page.click("#search-results a.id")
        else:
            await page.click("text=web-1")
        timeline = page.locator("#timeline")
        await page.locator("#timeline [data-type='checkpoint.saved']").wait_for(timeout=WAIT_MS)
        text = await timeline.inner_text()
        assert "please look at the needle" in text and "+1200 in" in text
        # The tool's result sits under the call it answers.
        result = page.locator("#timeline [data-result-of='call-1']")
        assert "1 failed: test_login" in await result.inner_text()
        assert await page.locator("#timeline li[data-type='message.appended']").count() == 2
        await page.locator("#visits").wait_for(timeout=WAIT_MS)  # drawn after the timeline
        assert await page.locator("#path .node").count() == 3  # plan → code ×2 → test
        assert "×2" in await page.locator("#path").inner_text()

        await client.append_message("web-1", "assistant", "fixed it, live")
        await page.locator("#timeline >> text=fixed it, live").wait_for(timeout=WAIT_MS)
        await page.locator("[data-stat=messages] >> text=4").wait_for(timeout=WAIT_MS)
        await page.screenshot(path=str(shots / f"session-{store_kind}.png"), full_page=True)

        await page.click("#fork")
        with anyio.fail_after(WAIT_MS / 1000):
            while "web-1" in page.url:  # the page goes to the fork's own
                await anyio.sleep(0.05)
        fork_id = unquote(page.url.split("#/s/")[1])
        await page.locator(f"h1 >> text={fork_id}").wait_for(timeout=WAIT_MS)
        await page.locator("#fork-tree >> text=(this session)").wait_for(timeout=WAIT_MS)
        tree = await page.locator("#fork-tree").inner_text()
        assert "web-1" in tree
        forked = await client.get_session(fork_id)
        assert forked.forked_from is not None and forked.forked_from.session_id == "web-1"
        await page.screenshot(path=str(shots / f"fork-{store_kind}.png"))

        await page.click("nav >> text=Host")
        await page.locator("[data-actor='team/alice']").wait_for(timeout=WAIT_MS)
        stats = await client.stats()
        shown = {k: await page.locator(f"[data-stat={k}]").inner_text()
                 for k in ("sessions", "events")}
        assert shown == {"sessions": str(stats.sessions), "events": str(stats.events)}
        alice = (await page.locator("[data-actor='team/alice']").inner_text()).split()
        assert alice == ["team/alice", "1510", "$0.0040", "1510", "$0.0040"]
        await page.screenshot(path=str(shots / f"host-{store_kind}.png"))

        assert set(calls) - {"session.fork"} <= READS, calls  # one button, one write
        assert calls.count("session.fork") == 1
        assert page.errors == []

    async def test_a_phone_and_the_keyboard(self, daemon: Daemon, client: AsyncClient,
                                            browser: Any, shots: Path) -> None:
        """390 px wide: nothing runs off the side; Tab and Enter open a session."""
        await load(client)
        page, _ = await new_page(browser, 390, 844)
        await page.goto(page_url(daemon))
        await page.locator("#sessions tbody tr").first.wait_for(timeout=WAIT_MS)
        width = await page.evaluate("document.documentElement.scrollWidth")
        assert width <= 390
        await page.screenshot(path=str(shots / "list-phone.png"), full_page=True)
        for _ in range(30):  # Tab until a session link has the focus
            await page.keyboard.press("Tab")
            if await page.evaluate("document.activeElement.classList.contains('id')"):
                break
        await page.keyboard.press("Enter")
        await page.locator("#timeline li").first.wait_for(timeout=WAIT_MS)
        assert await page.evaluate("document.documentElement.scrollWidth") <= 390
        await page.screenshot(path=str(shots / "session-phone.png"), full_page=True)


class TestTimeTravelAndStreams:
    async def test_the_state_at_a_version(self, daemon: Daemon, client: AsyncClient,
                                          browser: Any) -> None:
        """?v=3: the figures and the timeline as they were at version 3, no live tail."""
        await load(client)
        page, _ = await new_page(browser)
        await page.goto(page_url(daemon) + "#/s/web-1")
        await page.locator("#timeline li").first.wait_for(timeout=WAIT_MS)
        await page.fill("input[name=v]", "3")
        await page.press("input[name=v]", "Enter")
        await page.locator("text=Showing the state as it was at version 3").wait_for(
            timeout=WAIT_MS)
        await page.locator("#timeline > li[data-version='3']").wait_for(timeout=WAIT_MS)
        assert await page.locator("[data-stat=version]").inner_text() == "3"
        assert await page.locator("[data-stat=messages]").inner_text() == "2"
        assert [await li.get_attribute("data-version")
                for li in await page.locator("#timeline > li").all()] == ["1", "2", "3"]
        assert await page.locator("#delete").count() == 0  # nothing to delete in the past

    async def test_a_generic_stream_follows_its_chunks(
            self, daemon: Daemon, client: AsyncClient, browser: Any) -> None:
        """A stream of text made over HTTP shows its chunks, and new ones as they come."""
        url = f"http://{daemon.config.http_listen[0]}/t/{token(daemon)}/v1/stream/tokens-1"
        async with httpx.AsyncClient(timeout=30) as http:
            made = await http.put(url, headers={"content-type": "text/plain"})
            assert made.status_code in (200, 201), made.text
            await http.post(url, content=b"Hello, ", headers={"content-type": "text/plain"})
            page, _ = await new_page(browser)
            await page.goto(page_url(daemon) + "#/s/tokens-1")
            await page.locator("#timeline >> text=Hello,").wait_for(timeout=WAIT_MS)
            await http.post(url, content=b"world", headers={"content-type": "text/plain"})
            await page.locator("#timeline >> text=world").wait_for(timeout=WAIT_MS)


class TestSmallPages:
    """A daemon whose pages are small (max_page_bytes): the timeline and the export read
    every page, not the first."""

    @pytest.fixture
    def daemon_overrides(self) -> dict[str, Any]:
        return {"http_listen": [f"127.0.0.1:{free_port()}"], "max_page_bytes": 4096}

    async def test_timeline_and_export_read_every_page(
            self, daemon: Daemon, client: AsyncClient, browser: Any, tmp_path: Path) -> None:
        await client.create_session("big-1", task="pages")
        for i in range(12):
            await client.append_message("big-1", "user", f"message {i} " + "x" * 1500)
        page, calls = await new_page(browser)
        await page.goto(page_url(daemon) + "#/s/big-1")
        await page.locator("#timeline >> text=message 11").wait_for(timeout=WAIT_MS)
        assert await page.locator("#timeline > li").count() == 13  # created + 12
        assert calls.count("events.read") > 1  # the byte budget cut it into pages
        async with page.expect_download() as download:
            await page.click("#export")
        saved = tmp_path / "export.json"
        await (await download.value).save_as(saved)
        got = json.loads(saved.read_text())
        want = await client.export_session("big-1")
        same = ("format", "format_version", "events", "checkpoints", "session")
        assert {k: got[k] for k in same} == {k: want[k] for k in same}
        assert len(got["events"]) == 13  # ~20 KB of events: pages of 4 KiB, put together
        # The document is whole: its checksum verifies, and it imports.
        assert (await client.import_session(got, on_conflict="replace")).version == 13


class TestWrites:
    async def test_delete_asks_and_a_no_deletes_nothing(
            self, daemon: Daemon, client: AsyncClient, browser: Any) -> None:
        await load(client)
        page, calls = await new_page(browser)
        await page.goto(page_url(daemon) + "#/s/web-2")
        await page.locator("#timeline li").first.wait_for(timeout=WAIT_MS)
        page.once("dialog", lambda d: d.dismiss())
        await page.click("#delete")
        await anyio.sleep(0.5)  # proving that nothing happens: the call would be made at once
        assert "session.delete" not in calls
        assert (await client.get_session("web-2")).session_id == "web-2"
        page.once("dialog", lambda d: d.accept())
        await page.click("#delete")
        await page.locator("#sessions").wait_for(timeout=WAIT_MS)
        assert [s.session_id for s in (await client.list_sessions()).sessions] == ["web-1"]

    async def test_the_buttons_pass_the_grants(self, daemon: Daemon, client: AsyncClient,
                                               browser: Any) -> None:
        """With the peer token, delete is not granted (docs/security.md): the page says so."""
        await load(client)
        page, _ = await new_page(browser)
        await page.goto(page_url(daemon, peer=True) + "#/s/web-2")
        await page.locator("#timeline li").first.wait_for(timeout=WAIT_MS)
        page.once("dialog", lambda d: d.accept())
        await page.click("#delete")
        await page.locator("[role=alert]").wait_for(timeout=WAIT_MS)
        said = await page.locator("[role=alert]").inner_text()
        assert "not granted" in said
        assert "the HTTP peer token may not call session.delete" in said  # not "uid -1"
        assert (await client.get_session("web-2")).session_id == "web-2"


class TestRpcOverHttp:
    """POST /rpc: the socket's contract, one request at a time."""

    async def test_errors_are_json_rpc_and_http(self, daemon: Daemon,
                                                client: AsyncClient) -> None:
        await client.create_session("rpc-1")
        base = f"http://{daemon.config.http_listen[0]}/t/{token(daemon)}"
        async with httpx.AsyncClient(base_url=base, timeout=30) as http:
            ok = await http.post("/rpc", json={"jsonrpc": "2.0", "id": 7,
                                               "method": "session.get",
                                               "params": {"session_id": "rpc-1"}})
            assert ok.status_code == 200 and ok.json()["result"]["session_id"] == "rpc-1"
            assert ok.json()["id"] == 7
            gone = await http.post("/rpc", json={"jsonrpc": "2.0", "id": 1,
                                                 "method": "session.get",
                                                 "params": {"session_id": "nope"}})
            assert gone.json()["error"]["code"] == -32001
            bad = await http.post("/rpc", json={"jsonrpc": "2.0", "id": 2,
                                                "method": "session.get", "params": {"x": 1}})
            assert bad.json()["error"]["code"] == -32602
            sub = await http.post("/rpc", json={"jsonrpc": "2.0", "id": 3,
                                                "method": "events.subscribe", "params": {}})
            assert sub.json()["error"]["code"] == -32601
            assert "SSE" in sub.json()["error"]["message"]
            nul = await http.post("/rpc", json={"jsonrpc": "2.0", "id": 4,
                                                "method": "message.append", "params": {
                                                    "session_id": "rpc-1", "role": "user",
                                                    "content": "a\u0000b"}})
            assert nul.json()["error"]["code"] == -32602  # the text rule, as on the socket
            assert nul.json()["error"]["data"]["path"] == "$.content"
            junk = await http.post("/rpc", content=b"{not json",
                                   headers={"content-type": "application/json"})
            assert junk.json()["error"]["code"] == -32700
            form = await http.post("/rpc", content=b"x=1",
                                   headers={"content-type": "application/x-www-form-urlencoded"})
            assert form.status_code == 415  # no cross-site form can post here
            get = await http.get("/rpc")
            assert get.status_code == 405
            page = await http.get("/ui/")
            assert page.status_code == 200
            assert "script-src 'self'" in page.headers["content-security-policy"]
            assert (await http.get("/ui/nothing.js")).status_code == 404
        peer = f"http://{daemon.config.http_listen[0]}/t/{token(daemon, peer=True)}"
        async with httpx.AsyncClient(base_url=peer, timeout=30) as http:
            taken = await http.post("/rpc", json={"jsonrpc": "2.0", "id": 5,
                                                  "method": "memory.update", "params": {
                                                      "session_id": "rpc-1",
                                                      "patch": {"k": None}}})
            assert taken.json()["error"]["code"] == -32006  # a removing form: not granted
        assert (await client.get_session("rpc-1")).message_count == 0
        async with httpx.AsyncClient(timeout=30) as http:  # no token, no page
            refused = await http.get(f"http://{daemon.config.http_listen[0]}/ui/")
            assert refused.status_code == 401


class TestSessionctlWeb:
    async def test_it_prints_a_url_that_opens_the_page(self, daemon: Daemon) -> None:
        done = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                        daemon.socket, "web", "--print"])
        url = done.stdout.decode().strip()
        assert url == page_url(daemon)
        async with httpx.AsyncClient(timeout=30) as http:
            page = await http.get(url)
        assert page.status_code == 200 and b'src="app.js"' in page.content

    async def test_without_the_http_face_it_says_how_to_start_it(
            self, short_dir: str) -> None:
        from conftest import daemon_config, running_daemon

        async with running_daemon(daemon_config(short_dir)) as plain:
            done = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "--socket",
                                            plain.socket, "web"], check=False)
        assert done.returncode == 1 and b"--http-listen" in done.stderr


class TestTwoDaemonsOneFolder:
    async def test_each_keeps_its_own_token_and_listen_file(self, short_dir: str) -> None:
        """Sockets a.sock and b.sock in one folder: b's start leaves a's tokens alone, and
        `sessionctl web` on each socket opens its own daemon's page."""
        from conftest import daemon_config, running_daemon

        def config(name: str) -> Any:
            return daemon_config(short_dir, socket=os.path.join(short_dir, f"{name}.sock"),
                                 db=os.path.join(short_dir, f"{name}.db"),
                                 http_listen=[f"127.0.0.1:{free_port()}"])

        async with running_daemon(config("a")) as a:
            before = (token(a), token(a, peer=True))
            async with running_daemon(config("b")) as b:
                assert (token(a), token(a, peer=True)) == before
                assert token(b) != token(a)
                names = sorted(p.name for p in Path(short_dir).iterdir() if ".http-" in p.name)
                assert names == ["a.http-listen", "a.http-peer-token", "a.http-token",
                                 "b.http-listen", "b.http-peer-token", "b.http-token"]
                for d in (a, b):
                    done = await anyio.run_process([sys.executable, "-m", "sessiond.cli",
                                                    "--socket", d.socket, "web", "--print"])
                    url = done.stdout.decode().strip()
                    assert url == page_url(d) and d.config.http_listen[0] in url
                    async with httpx.AsyncClient(timeout=30) as http:
                        assert (await http.get(url)).status_code == 200
            async with httpx.AsyncClient(timeout=30) as http:  # b is gone; a still opens
                assert (await http.get(page_url(a))).status_code == 200

    async def test_an_earlier_releases_files_are_read(self, short_dir: str) -> None:
        """A daemon of an earlier release wrote sessiond.http-* whatever its socket's name:
        `sessionctl web` and `http-token` read them when the socket's own are not there."""
        from conftest import daemon_config, running_daemon

        sock = os.path.join(short_dir, "old.sock")
        Path(short_dir, "sessiond.http-listen").write_text('["127.0.0.1:4999"]\n')
        Path(short_dir, "sessiond.http-token").write_text("old-token\n")
        async with running_daemon(daemon_config(short_dir, socket=sock)):
            for args, want in ((["web", "--print"], "http://127.0.0.1:4999/t/old-token/ui/"),
                               (["http-token"], "old-token")):
                done = await anyio.run_process([sys.executable, "-m", "sessiond.cli",
                                                "--socket", sock, *args], check=False)
                assert done.stdout.decode().strip() == want, done.stderr


class TestFavicon:
    async def test_favicon_is_no_401(self, daemon: Daemon) -> None:
        """A browser asks /favicon.ico of the host, without the token: 204, no refusal
        (the page names an inline icon too, so it need not ask)."""
        async with httpx.AsyncClient(timeout=30) as http:
            got = await http.get(f"http://{daemon.config.http_listen[0]}/favicon.ico")
            assert got.status_code == 204 and got.content == b""
            other = await http.get(f"http://{daemon.config.http_listen[0]}/other.ico")
            assert other.status_code == 401  # nothing else is served without the token
            page = await http.get(page_url(daemon))
        assert b'<link rel="icon" href="data:,">' in page.content
