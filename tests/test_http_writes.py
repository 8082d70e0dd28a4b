"""What is written for the HTTP face, and what the face writes (issue 45 §8): a stream's
settings are checked where written, a revoked peer's token ends, a producer's append
costs the same on a long stream, an expired typed session's history stays, and a message
over max_message_bytes is refused on every path."""

from __future__ import annotations

import os
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import msgspec
import pytest
from conftest import PATIENCE_S, Daemon, daemon_config, running_daemon
from faulty_store import FaultyStore, faulty
from test_http import base, free_port, token

from sessiond import AsyncClient, InvalidParamsError, TooLargeError
from sessiond_daemon.serve import lifecycle
from sessiond_daemon.serve.web import streams
from sessiond_daemon.serve.web.codec import SOURCE

pytestmark = pytest.mark.anyio
TEXT = {"content-type": "text/plain"}


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    return {"http_listen": [f"127.0.0.1:{free_port()}"], "expire_every_s": 0.2,
            "max_message_bytes": 1 << 20}


@pytest.fixture
async def http(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base(daemon), timeout=60, headers={
            "authorization": f"Bearer {token(daemon)}"}) as c:
        yield c


# Each would make the face answer 500 with a traceback, or no reply at all, on main.
PLANTED = [
    {"content_type": "text/plain\r\nx-planted: 1"}, {"content_type": 5},
    {"content_type": "text/plain", "ttl_s": "soon"}, {"content_type": "text/plain", "ttl_s": -1},
    {"content_type": "text/plain", "expires_at": "2026-13-01T00:00:00Z"},
    {"content_type": "text/plain", "expires_at": 1},
    {"content_type": "text/plain", "fork": {"offset": "x"}},
    {"content_type": "text/plain", "fork": 3}, {"content_type": "text/plain", "deleted": "yes"},
    {"content_type": "text/plain", "writers": {"version": "x"}},
    {"content_type": "text/plain", "unknown": 1}, "text/plain", [1],
]


class TestStreamSettings:
    @pytest.mark.parametrize("planted", PLANTED)
    async def test_settings_the_face_cannot_serve_are_refused_where_written(
            self, client: AsyncClient, http: httpx.AsyncClient, planted: Any) -> None:
        with pytest.raises(InvalidParamsError) as refused:
            await client.call("session.create", session_id="planted", source=SOURCE,
                              metadata={"stream": planted})
        assert refused.value.data["path"].startswith("$.metadata.stream")
        assert (await http.get("/v1/stream/planted?offset=-1")).status_code == 404
        # Nor by a patch, on a stream or on any session.
        assert (await http.put("/v1/stream/good", headers=TEXT, content=b"a")).status_code == 201
        with pytest.raises(InvalidParamsError) as patched:
            await client.append_events("good", [{"type": "metadata.updated",
                                                 "data": {"patch": {"stream": planted}}}])
        assert patched.value.data["path"].startswith("$.events[0].data.patch.stream")
        with pytest.raises(InvalidParamsError):
            await client.create_session("typed", events=[{  # type: ignore[call-arg]
                "type": "metadata.updated", "data": {"patch": {"stream": planted}}}])
        read = await http.get("/v1/stream/good?offset=-1")
        assert read.status_code == 200 and read.content == b"a"

    async def test_the_settings_the_face_writes_pass(self, client: AsyncClient,
                                                     http: httpx.AsyncClient) -> None:
        assert (await http.put("/v1/stream/src", headers={**TEXT, "stream-ttl": "3600"},
                               content=b"a")).status_code == 201
        fork = await http.put("/v1/stream/fk", headers={
            **TEXT, "stream-forked-from": "/v1/stream/src", "stream-fork-offset": "1",
            "stream-expires-at": "2030-01-01T00:00:00Z"})
        assert fork.status_code == 201, fork.text  # its fork, offset and expiry written
        assert fork.headers["stream-expires-at"] == "2030-01-01T00:00:00Z"
        await client.append_events("src", [{"type": "metadata.updated", "data": {
            "patch": {"stream": {"ttl_s": None}}}}])  # a patch's null removes a setting
        assert "stream-ttl" not in (await http.head("/v1/stream/src")).headers

    @pytest.mark.parametrize("planted", [p for p in PLANTED if isinstance(p, dict)])
    def test_a_view_stored_before_the_check_reads_as_no_settings(self, planted: Any) -> None:
        """Planted on an earlier release: the face reads the session as a typed one."""
        view = streams.View.of({"session_id": "s", "version": 3, "status": "active",
                                "source": SOURCE, "metadata": {"stream": planted},
                                "forked_from": None})
        assert not view.generic and view.ttl_s is None and view.fork is None
        assert view.headers()["content-type"] == "application/json"


class TestMessageBound:
    async def test_events_append_of_a_message_keeps_max_message_bytes(
            self, client: AsyncClient, http: httpx.AsyncClient) -> None:
        """message.append refused it; events.append (the LangGraph store's put), a
        session.create's events and a POST to a typed session stored it whole."""
        await client.create_session("m")
        big = "x" * ((1 << 20) + 1)
        with pytest.raises(TooLargeError) as refused:
            await client.append_events("m", [{"type": "message.appended",
                                              "data": {"role": "user", "content": big}}])
        assert "max_message_bytes" in refused.value.message
        with pytest.raises(TooLargeError):
            await client.create_session("m2", events=[{  # type: ignore[call-arg]
                "type": "message.appended", "data": {"role": "user", "content": big}}])
        posted = await http.post("/v1/stream/m", headers={"content-type": "application/json"},
                                 content=msgspec.json.encode({"type": "message.appended", "data": {
                                     "role": "user", "content": big}}))
        assert posted.status_code == 413, posted.text
        assert (await client.get_session("m")).message_count == 0
        at_limit = "y" * (1 << 20)
        await client.append_events("m", [{"type": "message.appended",
                                          "data": {"role": "user", "content": at_limit}}])
        assert (await client.get_session("m")).message_count == 1


class TestExpiredTypedSession:
    async def test_a_put_keeps_the_history_of_a_typed_session_its_ttl_ended(
            self, client: AsyncClient, http: httpx.AsyncClient) -> None:
        """The name is not free: retention removes the history, days later; the PUT is
        409. (A generic stream past its Stream-TTL is replaced: test_http_ttl.)"""
        await client.create_session("typed-ttl", ttl_s=1)
        await client.append_message("typed-ttl", role="user", content="keep me")
        with anyio.fail_after(PATIENCE_S):
            while (await client.get_session("typed-ttl")).status != "expired":
                await anyio.sleep(0.1)
        assert (await http.head("/v1/stream/typed-ttl")).status_code == 404
        put = await http.put("/v1/stream/typed-ttl", headers=TEXT, content=b"new")
        assert put.status_code == 409, put.text
        assert "retention" in put.json()["error"]["message"]
        kept = await client.get_session("typed-ttl")
        assert kept.status == "expired" and kept.message_count == 1


class TestProducerState:
    async def test_a_producers_append_reads_a_bounded_part_of_a_long_history(
            self, short_dir: str, db_url: str) -> None:
        """Its state is read from the last snapshot (metadata.stream.writers) and the
        events after it: after a restart, a producer's append on a stream of 6,000
        events reads one page of events, where it read them all."""
        config = daemon_config(short_dir, db=db_url,
                               http_listen=[f"127.0.0.1:{free_port()}"])
        producer = {"producer-id": "p1", "producer-epoch": "0"}
        made: list[FaultyStore] = []

        async def run(seq: int) -> int:
            """Restart (nothing cached), append as the producer; the events.read pages."""
            async with running_daemon(config, store_factory=faulty(made)) as d, \
                    httpx.AsyncClient(base_url=base(d), timeout=120, headers={
                        "authorization": f"Bearer {token(d)}"}) as http:
                pages = 0

                async def count() -> None:
                    nonlocal pages
                    pages += 1

                made[-1].before_reads("read_events", count)
                answer = await http.post("/v1/stream/long", headers={
                    **TEXT, **producer, "producer-seq": str(seq)}, content=b"p")
                assert answer.status_code == 200, answer.text
                assert answer.headers["producer-seq"] == str(seq)
                return pages

        async with running_daemon(config) as d, AsyncClient(d.socket) as c, \
                httpx.AsyncClient(base_url=base(d), timeout=60, headers={
                    "authorization": f"Bearer {token(d)}"}) as http:
            assert (await http.put("/v1/stream/long", headers=TEXT)).status_code == 201
            posted = await http.post("/v1/stream/long", headers={
                **TEXT, **producer, "producer-seq": "0"}, content=b"p")
            assert posted.status_code == 200
            for _ in range(6):  # another writer's 6,000 chunks, on the socket
                await c.append_events("long", [{"type": "stream.chunk", "data": {
                    "text": "c"}} for _ in range(1000)])
        first = await run(1)  # reads the whole history once, and writes a snapshot
        assert first >= 6
        for seq in (2, 3):
            assert await run(seq) <= 2  # the snapshot, and the events since: one page
        async with running_daemon(config) as d, httpx.AsyncClient(
                base_url=base(d), timeout=60, headers={
                    "authorization": f"Bearer {token(d)}"}) as http:
            dup = await http.post("/v1/stream/long", headers={
                **TEXT, **producer, "producer-seq": "3"}, content=b"p")
            assert dup.status_code == 204  # a duplicate, known from the snapshot's state
            gap = await http.post("/v1/stream/long", headers={
                **TEXT, **producer, "producer-seq": "9"}, content=b"p")
            assert gap.status_code == 409
            following = await http.post("/v1/stream/long", headers={
                **TEXT, **producer, "producer-seq": "4"}, content=b"p")
            assert following.status_code == 200
            stale = await http.post("/v1/stream/long", headers={
                **TEXT, "producer-id": "p1", "producer-epoch": "1", "producer-seq": "0"},
                content=b"p")
            assert stale.status_code == 200  # a new epoch
            old_epoch = await http.post("/v1/stream/long", headers={
                **TEXT, **producer, "producer-seq": "5"}, content=b"p")
            assert old_epoch.status_code == 403


class TestPeerToken:
    async def test_revoking_a_peer_replaces_the_peer_token(self, short_dir: str) -> None:
        """A reload that lets a uid in no more replaces the peer token (the revoked peer
        knew it): the old one is 403, the new one works while a peer is allowed."""
        config = daemon_config(short_dir, http_listen=[f"127.0.0.1:{free_port()}"],
                               allowed_uids=[65534, 65533])
        daemon = lifecycle.Daemon(config)
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            await tg.start(daemon.run, shutdown)
            d = Daemon(config, shutdown)
            old = token(d, peer=True)
            async with httpx.AsyncClient(base_url=base(d), timeout=60) as http:
                def as_peer(t: str) -> dict[str, str]:
                    return {**TEXT, "authorization": f"Bearer {t}"}

                assert (await http.put("/v1/stream/p", headers=as_peer(old))).status_code == 201
                daemon.reload(msgspec.structs.replace(config, allowed_uids=[65534]))
                assert (await http.post("/v1/stream/p", headers=as_peer(old),
                                        content=b"x")).status_code == 403
                new = token(d, peer=True)
                assert new != old
                assert (await http.post("/v1/stream/p", headers=as_peer(new),
                                        content=b"x")).status_code == 204
                daemon.reload(msgspec.structs.replace(config, allowed_uids=[]))
                assert (await http.post("/v1/stream/p", headers=as_peer(new),
                                        content=b"x")).status_code == 403
                # Letting peers in does not change it; the owner's token never changes.
                latest = token(d, peer=True)
                daemon.reload(msgspec.structs.replace(config, allowed_uids=[65534]))
                assert token(d, peer=True) == latest
                assert (await http.head("/v1/stream/p", headers={
                    "authorization": f"Bearer {token(d)}"})).status_code == 200
            shutdown.set()
        assert not os.path.exists(config.socket or "")
