"""Stream-TTL and Stream-Expires-At over HTTP (docs/http.md): a stream past its time is
404 at once, reads and writes restart a TTL (a HEAD does not), the name is free again,
and the session keeps the TTL as its idle TTL (the daemon's expiry sweep, retention)."""

from __future__ import annotations

from collections.abc import AsyncIterator
from datetime import UTC, datetime, timedelta

import anyio
import httpx
import pytest
from conftest import PATIENCE_S, Daemon
from test_http import base, free_port, token

from sessiond import AsyncClient

# Waits on real TTLs of seconds: the PostgreSQL variants run in the fleet run.
pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
TEXT = {"content-type": "text/plain"}


@pytest.fixture
def daemon_overrides() -> dict[str, object]:
    return {"http_listen": [f"127.0.0.1:{free_port()}"]}


@pytest.fixture
async def http(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the daemon's TCP listener, the owner's token in a header."""
    async with httpx.AsyncClient(base_url=base(daemon), timeout=60, headers={
            "authorization": f"Bearer {token(daemon)}"}) as c:
        yield c


async def until_gone(http: httpx.AsyncClient, url: str) -> None:
    """Wait (polling HEAD, which restarts nothing) until the stream answers 404."""
    with anyio.fail_after(PATIENCE_S):
        while (await http.head(url)).status_code != 404:
            await anyio.sleep(0.1)


class TestExpiry:
    async def test_a_stream_past_its_ttl_is_gone_and_its_name_free(
            self, http: httpx.AsyncClient, client: AsyncClient) -> None:
        made = await http.put("/v1/stream/ttl-1", headers={**TEXT, "stream-ttl": "1"},
                              content=b"old")
        assert made.status_code == 201 and made.headers["stream-ttl"] == "1"
        state = await client.get_session("ttl-1")
        assert state.ttl_s == 1 and state.expires_at is not None  # the session's idle TTL
        await until_gone(http, "/v1/stream/ttl-1")
        assert (await http.get("/v1/stream/ttl-1?offset=-1")).status_code == 404
        assert (await http.post("/v1/stream/ttl-1", headers=TEXT,
                                content=b"late")).status_code == 404
        again = await http.put("/v1/stream/ttl-1", headers=TEXT, content=b"new")
        assert again.status_code == 201
        body = await http.get("/v1/stream/ttl-1?offset=-1")
        assert body.status_code == 200 and body.content == b"new"

    @pytest.mark.fleet
    async def test_reads_keep_a_stream_alive_past_its_ttl(
            self, http: httpx.AsyncClient, client: AsyncClient) -> None:
        """A TTL of 5 s, read every second for 8 s: never gone; the session was given its
        TTL again, so the daemon's sweep would not end it either."""
        await http.put("/v1/stream/ttl-read", headers={**TEXT, "stream-ttl": "5"},
                       content=b"x")
        first = (await client.get_session("ttl-read")).expires_at
        for _ in range(8):
            assert (await http.get("/v1/stream/ttl-read?offset=-1")).status_code == 200
            await anyio.sleep(1)  # the pace of the reads: each gap is far below the TTL
        assert (await http.head("/v1/stream/ttl-read")).status_code == 200
        later = (await client.get_session("ttl-read")).expires_at
        assert first is not None and later is not None and later > first

    async def test_head_does_not_keep_it_alive(self, http: httpx.AsyncClient) -> None:
        await http.put("/v1/stream/ttl-head", headers={**TEXT, "stream-ttl": "1"})
        await until_gone(http, "/v1/stream/ttl-head")  # HEADs alone: it still goes

    async def test_expires_at_is_not_moved_by_reads_or_writes(
            self, http: httpx.AsyncClient) -> None:
        at = (datetime.now(UTC) + timedelta(seconds=2)).isoformat().replace("+00:00", "Z")
        made = await http.put("/v1/stream/ttl-at", headers={**TEXT, "stream-expires-at": at})
        assert made.status_code == 201
        with anyio.fail_after(PATIENCE_S):
            while True:  # write and read all the while: it goes at its time regardless
                post = await http.post("/v1/stream/ttl-at", headers=TEXT, content=b".")
                if post.status_code == 404:
                    break
                assert post.status_code == 204
                await anyio.sleep(0.2)
        assert (await http.get("/v1/stream/ttl-at?offset=-1")).status_code == 404
