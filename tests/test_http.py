"""The HTTP face (docs/http.md): Durable Streams on sessions, over real HTTP to a real daemon."""

from __future__ import annotations

import json
import os
import pwd
import re
import shutil
import signal
import socket
import subprocess
import sys
from collections.abc import AsyncIterator
from functools import partial
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from conftest import (
    PATIENCE_S,
    Daemon,
    as_user,
    daemon_config,
    eventually,
    running_daemon,
    wait_for_daemon,
)
from faulty_store import FaultyStore, faulty, touches

from sessiond import AsyncClient
from sessiond_schemas.paths import http_token_path

pytestmark = pytest.mark.anyio
ROOT = Path(__file__).resolve().parent.parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture
def daemon_overrides(short_dir: str) -> dict[str, Any]:
    return {"http_listen": [f"127.0.0.1:{free_port()}", os.path.join(short_dir, "h.sock")],
            "http_long_poll_s": 30.0}


def token(daemon: Daemon, *, peer: bool = False) -> str:
    return Path(http_token_path(daemon.socket, peer=peer)).read_text().strip()


def base(daemon: Daemon) -> str:
    return f"http://{daemon.config.http_listen[0]}"


@pytest.fixture
async def http(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    """An HTTP client on the daemon's TCP listener, the owner's token in a header."""
    async with httpx.AsyncClient(base_url=base(daemon), timeout=60, headers={
            "authorization": f"Bearer {token(daemon)}"}) as c:
        yield c


def unix_client(daemon: Daemon) -> httpx.AsyncClient:
    transport = httpx.AsyncHTTPTransport(uds=daemon.config.http_listen[1])
    return httpx.AsyncClient(transport=transport, base_url="http://localhost", timeout=60)


def sse_events(text: str) -> list[tuple[str, str]]:
    """(event, data) of each complete SSE event in `text` (data lines joined by newlines)."""
    out = []
    for block in text.split("\n\n")[:-1]:
        name, data = "message", []
        for line in block.split("\n"):
            if line.startswith("event:"):
                name = line[6:].strip()
            elif line.startswith("data:"):
                data.append(line[5:])
        if data:
            out.append((name, "\n".join(data)))
    return out


class TestStreams:
    async def test_create_append_read(self, http: httpx.AsyncClient) -> None:
        """A generic text stream: PUT, POST, GET from the start and from an offset, HEAD."""
        made = await http.put("/v1/stream/t1", content=b"hello ",
                              headers={"content-type": "text/plain"})
        assert made.status_code == 201, made.text
        first = made.headers["stream-next-offset"]
        added = await http.post("/v1/stream/t1", content=b"world",
                                headers={"content-type": "text/plain"})
        assert added.status_code == 204
        assert added.headers["stream-next-offset"] > first
        whole = await http.get("/v1/stream/t1", params={"offset": "-1"})
        assert whole.text == "hello world" and whole.headers["stream-up-to-date"] == "true"
        rest = await http.get("/v1/stream/t1", params={"offset": first})
        assert rest.text == "world"
        head = await http.head("/v1/stream/t1")
        assert head.headers["stream-next-offset"] == added.headers["stream-next-offset"]
        assert head.headers["cache-control"] == "no-store"
        again = await http.put("/v1/stream/t1", headers={"content-type": "text/plain"})
        assert again.status_code == 200
        other = await http.put("/v1/stream/t1", headers={"content-type": "application/json"})
        assert other.status_code == 409
        assert (await http.get("/v1/stream/missing")).status_code == 404
        assert (await http.put("/v1/stream/t2", headers={"content-type": "html"})
                ).status_code == 400
        assert "sandbox" in head.headers["content-security-policy"]
        assert (await http.get("/v1/stream/t1", params={"offset": "x"})).status_code == 400
        # A newline after the digits is not an offset ($ matched before it: found by the
        # conformance suite's property test), nor after a stream's name.
        for bad in (f"{first}\n", "0\n", "1\r\n", f" {first}"):
            got = await http.get("/v1/stream/t1", params={"offset": bad})
            assert got.status_code == 400, (bad, got.status_code)
        assert (await http.put("/v1/stream/t3%0A", headers={
            "content-type": "text/plain"})).status_code == 400

    async def test_json_stream_is_a_session(self, http: httpx.AsyncClient,
                                            client: AsyncClient) -> None:
        """A JSON stream's messages are stream.chunk events the socket API reads too."""
        assert (await http.put("/v1/stream/j1", headers={"content-type": "application/json"},
                               content=b'[{"a": 1}, [1, 2]]')).status_code == 201
        r = await http.post("/v1/stream/j1", content=b'{"b": "\\u00e9"}',
                            headers={"content-type": "application/json"})
        assert r.status_code == 204
        assert (await http.get("/v1/stream/j1")).json() == [{"a": 1}, [1, 2], {"b": "é"}]
        page = await client.read_events("j1")
        assert [e.type for e in page.events] == ["session.created"] + ["stream.chunk"] * 3
        assert (await client.get_session("j1")).source == "durable-streams"
        bad = await http.post("/v1/stream/j1", content=b"{nope",
                              headers={"content-type": "application/json"})
        assert bad.status_code == 400
        empty = await http.post("/v1/stream/j1", content=b"[]",
                                headers={"content-type": "application/json"})
        assert empty.status_code == 400

    async def test_binary_stream(self, http: httpx.AsyncClient) -> None:
        data = bytes(range(256))
        await http.put("/v1/stream/b1", headers={"content-type": "application/octet-stream"})
        await http.post("/v1/stream/b1", content=data,
                        headers={"content-type": "application/octet-stream"})
        assert (await http.get("/v1/stream/b1")).content == data

    async def test_typed_session(self, http: httpx.AsyncClient, client: AsyncClient) -> None:
        """A session made over the socket reads as JSON events; a POST of typed events
        appends through events.append (its checks included)."""
        sid = (await client.create_session(task="typed")).session_id
        r = await http.post(f"/v1/stream/{sid}", headers={"content-type": "application/json"},
                            json={"type": "plan.linked", "data": {"plan_id": "p1"}})
        assert r.status_code == 204, r.text
        assert (await client.get_session(sid)).linked_plan_ids == ["p1"]
        events = (await http.get(f"/v1/stream/{sid}")).json()
        assert [e["type"] for e in events] == ["session.created", "plan.linked"]
        assert events[1]["version"] == 2
        refused = await http.post(f"/v1/stream/{sid}", json={"type": "session.created"},
                                  headers={"content-type": "application/json"})
        assert refused.status_code == 400
        assert refused.json()["error"]["code"] == -32602

    async def test_close(self, http: httpx.AsyncClient, client: AsyncClient) -> None:
        """Closure is the session's end; appends after it are 409 with Stream-Closed."""
        await http.put("/v1/stream/c1", headers={"content-type": "text/plain"})
        r = await http.post("/v1/stream/c1", content=b"last", headers={
            "content-type": "text/plain", "stream-closed": "true"})
        assert r.status_code == 204 and r.headers["stream-closed"] == "true"
        assert (await client.get_session("c1")).status == "completed"
        late = await http.post("/v1/stream/c1", content=b"x",
                               headers={"content-type": "text/plain"})
        assert late.status_code == 409 and late.headers["stream-closed"] == "true"
        again = await http.post("/v1/stream/c1", headers={"stream-closed": "true"})
        assert again.status_code == 204
        end = await http.get("/v1/stream/c1", params={"offset": r.headers["stream-next-offset"]})
        assert end.text == "" and end.headers["stream-closed"] == "true"

    async def test_producers(self, http: httpx.AsyncClient, client: AsyncClient) -> None:
        """Idempotent producers: a retry is 204 and writes nothing; gaps 409, stale 403."""
        await http.put("/v1/stream/p1", headers={"content-type": "text/plain"})

        async def send(epoch: int, seq: int, body: bytes = b"x") -> httpx.Response:
            return await http.post("/v1/stream/p1", content=body, headers={
                "content-type": "text/plain", "producer-id": "w", "producer-epoch": str(epoch),
                "producer-seq": str(seq)})

        assert (await send(0, 0, b"a")).status_code == 200
        assert (await send(0, 0, b"a")).status_code == 204
        assert (await send(0, 1, b"b")).status_code == 200
        gap = await send(0, 5)
        assert gap.status_code == 409 and gap.headers["producer-expected-seq"] == "2"
        assert (await send(1, 0, b"c")).status_code == 200
        stale = await send(0, 2)
        assert stale.status_code == 403 and stale.headers["producer-epoch"] == "1"
        assert (await http.get("/v1/stream/p1")).text == "abc"
        keys = [e.meta.idempotency_key for e in (await client.read_events("p1")).events]
        assert keys[1].startswith("ds:0:0:") and len(keys) == 4

    async def test_fork(self, http: httpx.AsyncClient, client: AsyncClient) -> None:
        """Stream-Forked-From is session.fork: the fork reads its source up to the offset."""
        made = await http.put("/v1/stream/src", content=b"first",
                              headers={"content-type": "text/plain"})
        await http.post("/v1/stream/src", content=b"second",
                        headers={"content-type": "text/plain"})
        fork = await http.put("/v1/stream/fk", headers={
            "stream-forked-from": "/v1/stream/src",
            "stream-fork-offset": made.headers["stream-next-offset"]})
        assert fork.status_code == 201, fork.text
        await http.post("/v1/stream/fk", content=b"+mine", headers={"content-type": "text/plain"})
        assert (await http.get("/v1/stream/fk")).text == "first+mine"
        assert (await client.get_session("fk")).forked_from is not None

    async def test_long_poll_waits_for_the_append(self, http: httpx.AsyncClient,
                                                  client: AsyncClient) -> None:
        """A long poll at the end waits (counted as a live subscription meanwhile) and
        answers with the append that wakes it."""
        made = await http.put("/v1/stream/lp", headers={"content-type": "text/plain"})
        at = made.headers["stream-next-offset"]
        got: list[httpx.Response] = []

        async def poll() -> None:
            got.append(await http.get("/v1/stream/lp",
                                       params={"offset": at, "live": "long-poll"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(poll)

            async def waiting() -> bool:
                return (await client.stats()).subscriptions == 1

            await eventually(waiting, "the long poll waiting")
            await http.post("/v1/stream/lp", content=b"news",
                            headers={"content-type": "text/plain"})
        assert got[0].status_code == 200 and got[0].text == "news"
        assert "stream-cursor" in got[0].headers

    async def test_sse_follows_then_ends_at_closure(self, http: httpx.AsyncClient,
                                                    client: AsyncClient) -> None:
        await http.put("/v1/stream/ss", content=b"one\n", headers={"content-type": "text/plain"})
        seen = ""
        async with http.stream("GET", "/v1/stream/ss",
                               params={"offset": "-1", "live": "sse"}) as r:
            assert r.headers["content-type"].startswith("text/event-stream")
            async for text in r.aiter_text():
                seen += text
                if seen.count("event: control") == 1 and "two" not in seen:
                    await http.post("/v1/stream/ss", content=b"two", headers={
                        "content-type": "text/plain", "stream-closed": "true"})
        assert (await client.stats()).subscriptions == 0
        events = sse_events(seen)
        data = [d for e, d in events if e == "data"]
        assert "".join(data) == "one\ntwo"
        assert json.loads(events[-1][1])["streamClosed"] is True

    async def test_http_and_socket_appends_at_once_then_verify(
            self, http: httpx.AsyncClient, client: AsyncClient) -> None:
        """Writers on both faces of one session at once: every write lands once, in some
        order, and daemon.verify holds."""
        sid = (await client.create_session(task="both")).session_id

        async def over_http(i: int) -> None:
            r = await http.post(f"/v1/stream/{sid}", headers={"content-type": "application/json"},
                                json={"type": "decision.recorded", "data": {"http": i}})
            assert r.status_code in (204, 409), r.text  # 409: another write came between

        async def over_socket(i: int) -> None:
            await client.append_message(sid, "user", f"socket {i}")

        async with anyio.create_task_group() as tg:
            for i in range(20):
                tg.start_soon(over_http, i)
                tg.start_soon(over_socket, i)
        state = await client.get_session(sid)
        assert state.message_count == 20
        report = await client.verify()
        assert report.ok, report.problems


class TestLandedNotAnswered:
    """A commit's events are readable a moment before the writer has its answer (a slow
    checkpoint after COMMIT, a slow network answer); a view read may be answered after
    a later commit. A response's offset is never past what the next one accepts, and a
    live tail misses nothing its view did not hold."""

    async def test_reads_stop_at_the_view_and_tails_miss_nothing(
            self, short_dir: str, db_url: str) -> None:
        port = free_port()
        config = daemon_config(short_dir, db=db_url, http_listen=[f"127.0.0.1:{port}"],
                               http_long_poll_s=30.0)
        stores: list[FaultyStore] = []
        landed, answer = anyio.Event(), anyio.Event()

        async def hold() -> None:
            landed.set()
            await answer.wait()

        async with running_daemon(config, store_factory=faulty(stores)) as d, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                  headers={"authorization": f"Bearer {token(d)}"}) as h:
            plain = {"content-type": "text/plain"}
            made = await h.put("/v1/stream/la", content=b"a", headers=plain)
            after_a = made.headers["stream-next-offset"]
            count = "SELECT COUNT(*) FROM events WHERE session_id = ?"
            stored = d.sql(count, "la")[0][0]
            stores[0].after_commits(touches("la"), hold)
            got: dict[str, Any] = {}

            async def tail(name: str, params: dict[str, str]) -> None:
                if params.get("live") == "sse":
                    async with h.stream("GET", "/v1/stream/la", params=params) as r:
                        async for text in r.aiter_text():
                            got[name] = got.get(name, "") + text
                            if "event: control" in got[name].partition("two")[2]:
                                return  # "two" and its control event came
                else:
                    got[name] = await h.get("/v1/stream/la", params=params)

            async with anyio.create_task_group() as tg:
                tg.start_soon(partial(h.post, "/v1/stream/la", content=b"b",
                                      headers=plain))
                try:
                    with anyio.fail_after(PATIENCE_S):  # a guard: the hold must run
                        await landed.wait()  # "b" is stored; the writer has not heard yet
                    assert d.sql(count, "la")[0][0] == stored + 1
                    async with AsyncClient(d.socket) as rpc:  # the socket API's view too
                        assert (await rpc.get_session("la")).version == stored + 1
                    read = await h.get("/v1/stream/la", params={"offset": "-1"})
                    at = read.headers["stream-next-offset"]
                    head = await h.head("/v1/stream/la")
                    # While the commit is in flight the view is the store's, which
                    # holds "b" (the writer's cached one does not yet), and the read
                    # and the HEAD agree: the offset is one the next request accepts.
                    assert read.text == "ab" and at != after_a
                    assert at == head.headers["stream-next-offset"]
                    again = await h.get("/v1/stream/la", params={"offset": at})
                    assert again.status_code == 200 and again.text == ""
                    tg.start_soon(tail, "poll", {"offset": after_a, "live": "long-poll"})
                    tg.start_soon(tail, "sse", {"offset": after_a, "live": "sse"})

                    async def settled() -> bool:  # each tail waiting, or given "b"
                        async with AsyncClient(d.socket) as rpc:
                            waiting = (await rpc.stats()).subscriptions
                        return waiting + ("poll" in got) + ("b" in got.get("sse", "")) >= 2

                    await eventually(settled, "the two live tails waiting or answered")
                    answer.set()  # the writer hears: the view holds "b", the bell rings
                    await eventually(lambda: "poll" in got, "the long poll's answer")
                    await h.post("/v1/stream/la", content=b"two", headers=plain)
                finally:
                    answer.set()  # never leave the writer waiting
        assert got["poll"].status_code == 200 and got["poll"].text == "b"
        data = [d for e, d in sse_events(got["sse"]) if e == "data"]
        assert "".join(data) == "btwo"


    async def test_a_tail_marks_the_bell_before_the_view_it_reads_up_to(
            self, short_dir: str, db_url: str) -> None:
        """The view a tail reads up to is answered late, after a commit that rang its bell
        (a view cache of one and a hook after the store's read make it so): the tail
        still gets that commit, at once, from a long poll and from SSE."""
        port = free_port()
        config = daemon_config(short_dir, db=db_url, http_listen=[f"127.0.0.1:{port}"],
                               view_cache_size=1, http_long_poll_s=5.0,
                               http_sse_close_s=30.0)
        stores: list[FaultyStore] = []
        plain = {"content-type": "text/plain"}
        async with running_daemon(config, store_factory=faulty(stores)) as d, \
                httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}", timeout=60,
                                  headers={"authorization": f"Bearer {token(d)}"}) as h, \
                AsyncClient(d.socket) as rpc:
            made = await h.put("/v1/stream/lt", content=b"a", headers=plain)
            other = (await rpc.create_session()).session_id
            hooks: list[tuple[list[int], bytes]] = []

            async def append_once() -> None:  # then the read answers, late
                if hooks:
                    skip, data = hooks[0]
                    if skip[0]:
                        skip[0] -= 1
                    else:
                        hooks.pop()
                        await h.post("/v1/stream/lt", content=data, headers=plain)

            stores[0].after_reads("state_json", append_once)

            async def late_view(data: bytes, skip: int) -> None:
                """The read of the view of "lt" after `skip` more answers after `data` is
                appended: the view a tail takes after its mark (a long poll reads one view
                before: its offset's check; an SSE response two)."""
                await rpc.append_message(other, "user", "evicts lt from the view cache")
                hooks.append(([skip], data))

            await late_view(b"beta", 1)
            poll = await h.get("/v1/stream/lt", params={
                "offset": made.headers["stream-next-offset"], "live": "long-poll"})
            assert not hooks and poll.status_code == 200 and poll.text == "beta"
            await late_view(b"gamma", 2)
            seen = ""
            with anyio.fail_after(PATIENCE_S):  # a guard: "gamma" comes at once, or never
                async with h.stream("GET", "/v1/stream/lt", params={
                        "offset": poll.headers["stream-next-offset"], "live": "sse"}) as r:
                    async for text in r.aiter_text():
                        seen += text
                        if "event: control" in seen.partition("gamma")[2]:
                            break
            assert not hooks
            assert "".join(d for e, d in sse_events(seen) if e == "data") == "gamma"
            for live in ("sse", "long-poll"):  # past the end: refused before any wait
                past = await h.get("/v1/stream/lt", params={"offset": "0" * 17 + "999",
                                                             "live": live})
                assert past.status_code == 400 and "past the stream's end" in past.text

class TestShutdown:
    async def test_tails_end_when_the_daemon_stops(self, short_dir: str) -> None:
        """SIGTERM's drain ends an open SSE tail and a waiting long poll (503: retry), so
        the daemon stops at once instead of waiting for them."""
        port = free_port()
        config = daemon_config(short_dir, http_listen=[f"127.0.0.1:{port}"])
        got: dict[str, Any] = {}
        async with running_daemon(config) as d:
            url = f"http://127.0.0.1:{port}/t/{token(d)}/v1/stream/z"
            async with httpx.AsyncClient(timeout=120) as c:
                await c.put(url)

                async def sse() -> None:
                    async with c.stream("GET", url, params={"offset": "-1",
                                                            "live": "sse"}) as r:
                        got["sse"] = "".join([t async for t in r.aiter_text()])

                async def poll() -> None:
                    got["poll"] = (await c.get(url, params={"offset": "now",
                                                            "live": "long-poll"})).status_code

                async with anyio.create_task_group() as tg:
                    tg.start_soon(sse)
                    tg.start_soon(poll)
                    async with AsyncClient(d.socket) as rpc:
                        async def both() -> bool:
                            return (await rpc.stats()).subscriptions == 2

                        await eventually(both, "two live tails")
                    d.shutdown.set()
        assert got["poll"] == 503
        assert "upToDate" in got["sse"]


class TestAuth:
    async def test_tokens(self, daemon: Daemon) -> None:
        """No token 401, a wrong one 403; the header and the /t/ prefix both work."""
        async with httpx.AsyncClient(base_url=base(daemon)) as c:
            assert (await c.get("/v1/stream/x")).status_code == 401
            assert (await c.get("/v1/stream/x", headers={
                "authorization": "Bearer " + "A" * 43})).status_code == 403
            assert (await c.get(f"/t/{'B' * 43}/v1/stream/x")).status_code == 403
            ok = await c.put(f"/t/{token(daemon)}/v1/stream/x")
            assert ok.status_code == 201
            assert ok.headers["location"] == f"{base(daemon)}/t/{token(daemon)}/v1/stream/x"

    async def test_rotation(self, daemon: Daemon) -> None:
        old = token(daemon)
        out = subprocess.run([sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket,
                              "http-token", "--rotate"], capture_output=True, text=True,
                             check=True)
        new = out.stdout.strip()
        assert new != old and new == token(daemon)
        assert os.stat(http_token_path(daemon.socket)).st_mode & 0o777 == 0o600
        async with httpx.AsyncClient(base_url=base(daemon)) as c:
            assert (await c.put(f"/t/{old}/v1/stream/r")).status_code == 403
            assert (await c.put(f"/t/{new}/v1/stream/r")).status_code == 201

    async def test_peer_token_has_peer_grants(self, daemon: Daemon) -> None:
        """The peer token appends and reads, but may not delete (not granted by default)."""
        async with httpx.AsyncClient(base_url=base(daemon), headers={
                "authorization": f"Bearer {token(daemon, peer=True)}"}) as c:
            assert (await c.put("/v1/stream/pg")).status_code == 201
            refused = await c.delete("/v1/stream/pg")
            assert refused.status_code == 403 and refused.json()["error"]["code"] == -32006
            assert (await c.get("/metrics")).status_code == 403

    async def test_unix_peer(self, daemon: Daemon) -> None:
        """On the Unix socket the peer's uid decides: ours is served with no token; another
        user who is not allowed gets 403 (as on the RPC socket)."""
        async with unix_client(daemon) as c:
            assert (await c.put("/v1/stream/u1")).status_code == 201
        if os.getuid() != 0:
            pytest.skip("needs root to connect as another user")
        nobody = pwd.getpwnam("nobody")
        path = daemon.config.http_listen[1]
        os.chmod(os.path.dirname(path), 0o755)
        os.chmod(path, 0o666)

        def ask() -> bytes:
            with socket.socket(socket.AF_UNIX) as s:
                s.connect(path)
                s.sendall(b"GET /v1/stream/u1 HTTP/1.1\r\nHost: x\r\n\r\n")
                return s.recv(200)

        answer = await anyio.to_thread.run_sync(as_user, nobody, ask)
        assert answer.startswith(b"HTTP/1.1 403 "), answer


class TestConfig:
    def test_off_by_default_and_loopback_only(self, short_dir: str) -> None:
        from sessiond_daemon.serve.config import ConfigError
        from sessiond_daemon.serve.web.face import check_config

        assert daemon_config(short_dir).http_listen == []
        with pytest.raises(ConfigError, match="not a loopback"):
            check_config(daemon_config(short_dir, http_listen=["0.0.0.0:4437"]))
        check_config(daemon_config(short_dir, http_listen=["0.0.0.0:4437"],
                                   http_allow_remote=True))


class TestDurability:
    def test_no_2xx_before_the_fsync(self, short_dir: str) -> None:
        """strace of a daemon serving appends over HTTP: before each 2xx is written to the
        client, the database file (its WAL) has been fsynced since the previous one."""
        if shutil.which("strace") is None:
            if os.environ.get("SESSIOND_REQUIRE_STRACE"):
                pytest.fail("strace is missing and SESSIOND_REQUIRE_STRACE is set")
            pytest.skip("needs strace")
        port, sock = free_port(), os.path.join(short_dir, "s.sock")
        trace = os.path.join(short_dir, "trace")
        proc = subprocess.Popen(
            ["strace", "-f", "-qq", "-yy", "-s", "40", "-o", trace,
             "-e", "trace=fsync,fdatasync,write,writev,sendto,sendmsg",
             sys.executable, "-m", "sessiond_daemon", "--socket", sock, "--db",
             os.path.join(short_dir, "d.db"), "--log-level", "warning",
             "--http-listen", f"127.0.0.1:{port}"])
        try:
            wait_for_daemon(sock, proc)
            tok = Path(http_token_path(sock)).read_text().strip()
            with httpx.Client(base_url=f"http://127.0.0.1:{port}/t/{tok}", timeout=60) as c:
                assert c.put("/v1/stream/d", headers={"content-type": "text/plain"}
                             ).status_code == 201
                for i in range(10):
                    r = c.post("/v1/stream/d", content=f"{i}".encode(),
                               headers={"content-type": "text/plain"})
                    assert r.status_code == 204
        finally:
            # SIGTERM to the daemon itself (strace's child); strace ends with it.
            with open(f"/proc/{proc.pid}/task/{proc.pid}/children") as f:
                for child in f.read().split():
                    os.kill(int(child), signal.SIGTERM)
            proc.wait(timeout=60)
        lines = Path(trace).read_text().splitlines()
        synced, replies = False, 0
        for line in lines:
            if re.search(r"\b(fsync|fdatasync)\(\d+<[^>]*d\.db[^>]*>", line) or (
                    "fsync resumed>" in line or "fdatasync resumed>" in line):
                synced = synced or "unfinished" not in line
            elif re.search(r"HTTP/1\.1 2\d\d", line) and "TCP" in line:
                assert synced, f"a 2xx went out before any fsync since the last: {line}"
                synced, replies = False, replies + 1
        assert replies == 11, replies


class TestDocs:
    @pytest.mark.slow_on_postgresql
    async def test_the_examples_run(self, daemon: Daemon) -> None:
        """Every sh block of docs/http.md runs against this daemon (they are marked
        not-run for the docs-snippet test, whose daemon has no HTTP face)."""
        text = (ROOT / "docs" / "http.md").read_text()
        blocks = re.findall(r"<!-- not run: [^>]*tests/test_http.py[^>]*-->\n```(sh|python)\n"
                            r"(.*?)```", text, re.S)
        assert [kind for kind, _ in blocks] == ["sh", "sh", "sh", "python"]
        env = {**os.environ, "SESSIOND_SOCKET": daemon.socket,
               "PATH": f"{os.path.dirname(sys.executable)}:{os.environ['PATH']}",
               "SESSIOND_HTTP": f"{base(daemon)}/t/{token(daemon)}"}
        outputs = []
        for kind, block in blocks:
            argv = (["bash", "-euo", "pipefail", "-c", block] if kind == "sh"
                    else [sys.executable, "-c", block])
            done = await anyio.run_process(argv, env=env, check=False)
            assert done.returncode == 0, (block, done.stdout, done.stderr)
            outputs.append(done.stdout.decode())
        assert "hello world" in outputs[0]
        assert "session.created\nplan.linked" in outputs[1]
        assert outputs[2].startswith("!")
        assert outputs[3].strip() == "[{'step': 1}, {'step': 2}]"
