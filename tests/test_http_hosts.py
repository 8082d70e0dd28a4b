"""Host and Origin on every HTTP listener (issue 45 §4; docs/security.md, "DNS rebinding"):
a rebinding page's requests, straight or through a proxy in front of the Unix socket, are
refused with 403; a write from another origin too, a no-cors text/plain POST included."""

from __future__ import annotations

import os
import threading
from collections.abc import AsyncIterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from conftest import Daemon, daemon_config
from test_http import base, free_port, http, token
from test_web import browser

from sessiond import AsyncClient
from sessiond_daemon.serve import lifecycle
from sessiond_daemon.serve.config import ConfigError

pytestmark = pytest.mark.anyio
__all__ = ["browser", "http"]  # fixtures: chromium; the owner's token, on TCP
REBIND = "rebind.attacker.example"
TEXT = {"content-type": "text/plain"}


@pytest.fixture
def daemon_overrides(short_dir: str) -> dict[str, Any]:
    return {"http_listen": [f"127.0.0.1:{free_port()}", os.path.join(short_dir, "h.sock")],
            "metrics_listen": f"127.0.0.1:{free_port()}",
            "http_cors_origins": ["http://localhost:5173"],
            "http_allowed_hosts": ["sessiond.proxy.example"]}


@pytest.fixture
async def unix(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    """What a local proxy in front of the Unix HTTP socket does: it connects as its own
    uid (the owner's here) and passes on the browser's Host and Origin."""
    transport = httpx.AsyncHTTPTransport(uds=daemon.config.http_listen[1])
    async with httpx.AsyncClient(transport=transport, base_url="http://localhost",
                                 timeout=60) as c:
        yield c


def port_of(daemon: Daemon) -> str:
    return daemon.config.http_listen[0].rsplit(":", 1)[1]


def spawn_rpc() -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": 1, "method": "session.create", "params": {}}


class TestHost:
    async def test_a_rebinding_host_is_refused_on_tcp(self, daemon: Daemon,
                                                      http: httpx.AsyncClient,
                                                      client: AsyncClient) -> None:
        """With the owner's token even: the page got it no other way than a leak, but a
        rebinding page must not reach the face at all (the token is not the only guard)."""
        before = len((await client.list_sessions()).sessions)
        host = {"host": f"{REBIND}:{port_of(daemon)}"}
        for method, path, kwargs in [
                ("POST", "/rpc", {"json": spawn_rpc()}),
                ("PUT", "/v1/stream/s", {"headers": TEXT, "content": b"x"}),
                ("GET", "/v1/stream/s?offset=-1", {}),
                ("GET", "/ui/", {}),
                ("GET", "/metrics", {}),
                ("OPTIONS", "/v1/stream/s", {})]:
            refused = await http.request(method, path, **{
                **kwargs, "headers": {**kwargs.get("headers", {}), **host}})
            assert refused.status_code == 403, (method, path, refused.text)
            assert "http_allowed_hosts" in refused.json()["error"]["message"]
        assert len((await client.list_sessions()).sessions) == before

    async def test_loopback_names_and_the_listeners_address_pass(
            self, daemon: Daemon, http: httpx.AsyncClient) -> None:
        port = port_of(daemon)
        for host in [f"127.0.0.1:{port}", f"localhost:{port}", "localhost", "LOCALHOST.",
                     f"app.localhost:{port}", f"127.0.0.2:{port}", "[::1]:80",
                     f"sessiond.proxy.example:{port}"]:
            answer = await http.put(f"/v1/stream/h{abs(hash(host))}", headers={
                **TEXT, "host": host}, content=b"x")
            assert answer.status_code == 201, (host, answer.text)
        for host in [REBIND, f"{REBIND}:{port}", "localhost.attacker.example",
                     "127.0.0.1.attacker.example", "[::1", "localhost:http", "[::1]x",
                     "proxy.example"]:
            answer = await http.get("/v1/stream/x?offset=-1", headers={"host": host})
            assert answer.status_code == 403, host

    async def test_a_rebinding_host_through_a_proxy_on_the_unix_socket(
            self, daemon: Daemon, unix: httpx.AsyncClient, client: AsyncClient) -> None:
        """The issue's run: a proxy passes the rebinding page's Host and Origin to the
        Unix socket, where its uid is allowed; /rpc and the streams refuse it."""
        before = len((await client.list_sessions()).sessions)
        rebound = {"host": REBIND, "origin": f"http://{REBIND}"}
        refused = await unix.post("/rpc", json=spawn_rpc(), headers=rebound)
        assert refused.status_code == 403
        refused = await unix.get("/v1/stream/x?offset=-1", headers={"host": REBIND})
        assert refused.status_code == 403
        assert len((await client.list_sessions()).sessions) == before
        # Its own names pass: the loopback ones, and those configured for a proxy.
        for host in ["localhost", "sessiond.proxy.example"]:
            ok = await unix.post("/rpc", json=spawn_rpc(), headers={"host": host})
            assert ok.status_code == 200 and "result" in ok.json(), ok.text
        assert len((await client.list_sessions()).sessions) == before + 2

    async def test_the_metrics_listener_refuses_a_rebinding_host(self, daemon: Daemon
                                                                 ) -> None:
        assert daemon.config.metrics_listen is not None
        async with httpx.AsyncClient(base_url=f"http://{daemon.config.metrics_listen}",
                                     timeout=60) as scrape:
            refused = await scrape.get("/metrics", headers={"host": REBIND})
            assert refused.status_code == 403
            ok = await scrape.get("/metrics")
            assert ok.status_code != 403


class TestOrigin:
    async def test_a_no_cors_text_post_from_another_origin_is_refused(
            self, daemon: Daemon, http: httpx.AsyncClient, unix: httpx.AsyncClient) -> None:
        """What chromium sends for a page's `fetch(url, {method: "POST", mode: "no-cors",
        body: "..."})`: a simple request, no preflight, its Origin the page's."""
        assert (await http.put("/v1/stream/t", headers=TEXT, content=b"a")).status_code == 201
        for c in (http, unix):
            for origin in [f"http://{REBIND}", "null", f"http://{REBIND}:{port_of(daemon)}"]:
                refused = await c.post("/v1/stream/t", headers={**TEXT, "origin": origin},
                                       content=b"planted")
                assert refused.status_code == 403, (origin, refused.text)
                assert "http_cors_origins" in refused.json()["error"]["message"]
            for method in ("PUT", "DELETE"):
                refused = await c.request(method, "/v1/stream/t", headers={
                    **TEXT, "origin": f"http://{REBIND}"})
                assert refused.status_code == 403
        assert (await http.get("/v1/stream/t?offset=-1")).content == b"a"

    async def test_the_faces_own_origin_and_the_cors_origins_may_write(
            self, daemon: Daemon, http: httpx.AsyncClient, unix: httpx.AsyncClient) -> None:
        assert (await http.put("/v1/stream/o", headers=TEXT, content=b"a")).status_code == 201
        own = f"http://{daemon.config.http_listen[0]}"
        for origin in [own, "http://localhost:5173"]:
            ok = await http.post("/v1/stream/o", headers={**TEXT, "origin": origin},
                                content=b"b")
            assert ok.status_code == 204, (origin, ok.text)
        # Behind a TLS proxy the scheme differs; the host and port are the Host's.
        ok = await unix.post("/v1/stream/o", headers={
            **TEXT, "host": "sessiond.proxy.example", "origin": "https://sessiond.proxy.example"},
                             content=b"c")
        assert ok.status_code == 204, ok.text
        # A read from another origin is answered (without CORS headers, a browser hides it).
        read = await http.get("/v1/stream/o?offset=-1", headers={"origin": f"http://{REBIND}"})
        assert read.status_code == 200 and read.content == b"abbc"
        assert "access-control-allow-origin" not in read.headers


class TestInABrowser:
    @pytest.mark.slow_on_postgresql
    async def test_a_page_of_another_origin_cannot_append_with_a_no_cors_post(
            self, daemon: Daemon, http: httpx.AsyncClient, browser: Any) -> None:
        """chromium, on a page of another origin (localhost, another port), sends the
        issue's simple `no-cors` text/plain POST to a stream (the URL holds the token, as
        a capability URL that leaked would): it is refused; the page's own origin's
        fetch is not."""
        assert (await http.put("/v1/stream/b", headers=TEXT, content=b"a")).status_code == 201
        target = f"http://{daemon.config.http_listen[0]}/t/{token(daemon)}/v1/stream/b"
        post = ("(url) => fetch(url, {method: 'POST', mode: 'no-cors', body: 'planted',"
                " headers: {'content-type': 'text/plain'}}).then(() => 'sent',"
                " (e) => String(e))")
        with _Page(b"<!doctype html><title>elsewhere</title>") as elsewhere:
            page = await browser.new_page()
            await page.goto(elsewhere)
            # The answer is hidden from it either way (Cross-Origin-Resource-Policy: the
            # fetch fails); what counts is whether the daemon wrote.
            await page.evaluate(post, target)
            assert (await http.get("/v1/stream/b?offset=-1")).content == b"a"
            # From the face's own origin (its web view's), the same request appends.
            await page.goto(f"http://{daemon.config.http_listen[0]}/t/{token(daemon)}/ui/")
            assert await page.evaluate(post, target) == "sent"
            await page.close()
        assert (await http.get("/v1/stream/b?offset=-1")).content == b"aplanted"


class _Page:
    """A page served on another loopback port: another origin."""

    def __init__(self, body: bytes) -> None:
        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                self.send_response(200)
                self.send_header("content-type", "text/html")
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)

    def __enter__(self) -> str:
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return f"http://localhost:{self.server.server_address[1]}/"

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()


class TestConfig:
    async def test_allowed_hosts_are_reloaded(self, short_dir: str) -> None:
        """SIGHUP's reload applies http_allowed_hosts to the next request."""
        config = daemon_config(short_dir, http_listen=[f"127.0.0.1:{free_port()}"])
        daemon = lifecycle.Daemon(config)
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run, shutdown)
            d = Daemon(config, shutdown)
            async with httpx.AsyncClient(base_url=base(d), timeout=60, headers={
                    "authorization": f"Bearer {token(d)}", "host": "named.example"}) as c:
                assert (await c.head("/v1/stream/x")).status_code == 403
                changed = daemon.reload(msgspec.structs.replace(
                    config, http_allowed_hosts=["Named.Example"]))
                assert "http_allowed_hosts" in changed
                assert (await c.head("/v1/stream/x")).status_code == 404  # let in: no stream
            shutdown.set()

    def test_an_empty_name_is_refused(self, short_dir: str) -> None:
        with pytest.raises(ConfigError, match="http_allowed_hosts"):
            daemon_config(short_dir, http_allowed_hosts=[""])
