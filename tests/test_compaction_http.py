"""The context read over HTTP (issue 48): `GET /v1/stream/<id>?context` answers the last
compaction's summary and the messages after it in one request, with the offset to tail
from; a real daemon with its HTTP face, a real HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import httpx
import pytest
from conftest import Daemon
from test_http import base, free_port, token

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    return {"http_listen": [f"127.0.0.1:{free_port()}"]}


@pytest.fixture
async def http(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    """The owner's client, by capability URL (the token in the path)."""
    async with httpx.AsyncClient(base_url=f"{base(daemon)}/t/{token(daemon)}",
                                 timeout=60) as c:
        yield c


class TestContextOverHttp:
    async def test_one_request_reads_the_context_then_the_tail_follows(
            self, client: AsyncClient, http: httpx.AsyncClient) -> None:
        await client.create_session("h1")
        await client.append_messages("h1", [{"role": "user", "content": f"m{i}"}
                                            for i in range(8)])
        await client.compact("h1", [{"role": "system", "content": "summary"}],
                             through_sequence=5, by="user")
        r = await http.get("/v1/stream/h1", params={"context": ""})
        assert r.status_code == 200, r.text
        body = r.json()
        assert body["compaction"]["by"] == "user" and body["total"] == 2
        assert [m["content"] for m in body["summary"]] == ["summary"]
        assert [m["content"] for m in body["messages"]] == ["m6", "m7"]
        offset = r.headers["stream-next-offset"]
        assert int(offset) == body["version"] == (await client.get_session("h1")).version
        # The tail from there: only what came after the read.
        await client.append_message("h1", "assistant", "after")
        tail = (await http.get("/v1/stream/h1", params={"offset": offset})).json()
        assert [e["type"] for e in tail] == ["message.appended"]
        assert tail[0]["data"]["content"] == "after"
        page = (await http.get("/v1/stream/h1", params={
            "context": "1", "limit": "1", "after_sequence": "6"})).json()
        assert page["summary"] == [] and [m["content"] for m in page["messages"]] == ["m7"]

    async def test_bad_context_reads_are_refused_with_the_reason(
            self, client: AsyncClient, http: httpx.AsyncClient) -> None:
        await client.create_session("h2")
        assert (await http.get("/v1/stream/nope", params={"context": ""})).status_code == 404
        for params in ({"context": "", "offset": "-1"}, {"context": "", "live": "sse"},
                       {"context": "", "limit": "x"}, {"context": "", "limit": "0"}):
            r = await http.get("/v1/stream/h2", params=params)
            assert r.status_code == 400, (params, r.text)


    async def test_offsets_before_a_trim_are_gone(self, client: AsyncClient,
                                                 http: httpx.AsyncClient) -> None:
        """Retention trimmed the history behind a compaction: a read from an offset before
        where it starts is 410 with the RPC error's code and data; from there on, and the
        context read, are 200."""
        await client.create_session("h3")
        for i in range(12):
            await client.append_message("h3", "user", f"m{i}")
        await client.compact("h3", [{"role": "system", "content": "summary"}],
                             through_sequence=9)
        done = await client.trim("h3", older_than_days=0)
        assert done.starts_at is not None
        r = await http.get("/v1/stream/h3", params={"offset": "-1"})
        assert r.status_code == 410, r.text
        assert r.json()["error"]["code"] == -32015
        assert r.json()["error"]["data"]["starts_at"] == done.starts_at
        offset = f"{done.starts_at - 1:020d}"
        kept = await http.get("/v1/stream/h3", params={"offset": offset})
        assert kept.status_code == 200 and kept.json()[0]["version"] == done.starts_at
        ctx = await http.get("/v1/stream/h3", params={"context": ""})
        assert ctx.status_code == 200 and [m["content"] for m in ctx.json()["messages"]] \
            == ["m10", "m11"]
