"""The HTTP face against what another local user, or a careless client, can send: each
test is a finding of a review (the reproduction, through a real daemon, or for the token
file's writer, through the function both the daemon and sessionctl call), held fixed."""

from __future__ import annotations

import base64
import errno
import json
import os
import stat
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path

import anyio
import httpx
import pytest
from conftest import PATIENCE_S, Daemon
from test_http import base, free_port, token

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio
TEXT = {"content-type": "text/plain"}


@pytest.fixture
def daemon_overrides() -> dict[str, object]:
    return {"http_listen": [f"127.0.0.1:{free_port()}"],
            "http_cors_origins": ["http://localhost:5173"]}


@pytest.fixture
async def owner(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base(daemon), timeout=60, headers={
            "authorization": f"Bearer {token(daemon)}"}) as c:
        yield c


@pytest.fixture
async def peer(daemon: Daemon) -> AsyncIterator[httpx.AsyncClient]:
    async with httpx.AsyncClient(base_url=base(daemon), timeout=60, headers={
            "authorization": f"Bearer {token(daemon, peer=True)}"}) as c:
        yield c


def rpc(method: str, **params: object) -> dict[str, object]:
    return {"jsonrpc": "2.0", "id": 1, "method": method, "params": params}


class TestStreamSettingsAreTheFaces:
    async def test_a_peer_cannot_make_the_owners_stream_expire(
            self, owner: httpx.AsyncClient, peer: httpx.AsyncClient) -> None:
        """A metadata.updated of `stream` is the face's: a peer's is -32006, so it cannot
        set an expiry in the past and have the owner's next PUT delete the history."""
        await owner.put("/v1/stream/owners", headers=TEXT, content=b"the owner's data")
        forged = await peer.post("/rpc", json=rpc("events.append", session_id="owners", events=[
            {"type": "metadata.updated",
             "data": {"patch": {"stream": {"expires_at": "2000-01-01T00:00:00Z"}}}}]))
        error = forged.json()["error"]
        assert error["code"] == -32006 and error["data"]["grant"] == "events.append:stream"
        assert (await owner.put("/v1/stream/owners", headers=TEXT)).status_code == 200
        body = await owner.get("/v1/stream/owners?offset=-1")
        assert body.content == b"the owner's data"

    async def test_a_peer_reads_writes_and_forks_ttl_streams(
            self, owner: httpx.AsyncClient, peer: httpx.AsyncClient,
            client: AsyncClient) -> None:
        """The face renews a TTL and writes a fork's settings as the daemon: a peer without
        the grant of session.set_ttl or of stream settings still reads, writes and forks."""
        await owner.put("/v1/stream/short", headers={**TEXT, "stream-ttl": "5"}, content=b"x")
        # Any read after the create outlasts the session's expiry: the renewal is due.
        assert (await peer.get("/v1/stream/short?offset=-1")).status_code == 200
        assert (await peer.post("/v1/stream/short", headers=TEXT,
                                content=b"y")).status_code == 204
        made = await peer.put("/v1/stream/pfork", headers={
            **TEXT, "stream-ttl": "60", "stream-forked-from": "/v1/stream/short"})
        assert made.status_code == 201, made.text
        fork = await client.get_session("pfork")
        assert fork.ttl_s == 60 and fork.forked_from is not None

    async def test_a_read_keeps_the_daemons_expiry_past_its_window(
            self, owner: httpx.AsyncClient, client: AsyncClient) -> None:
        """After a read, the session's own expiry (the sweep's) is at least the read's time
        plus the TTL: the sweep never ends a stream the face still serves."""
        await owner.put("/v1/stream/win", headers={**TEXT, "stream-ttl": "30"}, content=b"x")
        for _ in range(3):
            read_at = datetime.now(UTC).timestamp()
            assert (await owner.get("/v1/stream/win?offset=-1")).status_code == 200
            due = (await client.get_session("win")).expires_at
            assert due is not None
            assert datetime.fromisoformat(due.replace("Z", "+00:00")).timestamp() \
                >= read_at + 30 - 1  # a second for the times' rounding

    async def test_a_default_ttl_does_not_end_a_stream_without_one(
            self, owner: httpx.AsyncClient, client: AsyncClient, daemon: Daemon) -> None:
        await owner.put("/v1/stream/plain", headers=TEXT, content=b"x")
        assert (await client.get_session("plain")).ttl_s is None


class TestBodies:
    async def test_a_json_array_past_the_append_limit_is_refused_before_it_is_built(
            self, owner: httpx.AsyncClient) -> None:
        await owner.put("/v1/stream/j", headers={"content-type": "application/json"})
        body = b"[" + b",".join([b"0"] * 20_001) + b"]"
        refused = await owner.post("/v1/stream/j", headers={"content-type": "application/json"},
                                   content=body)
        assert refused.status_code == 413 and "10000" in refused.text

    async def test_a_chunk_that_would_not_decode_is_refused(
            self, owner: httpx.AsyncClient, peer: httpx.AsyncClient) -> None:
        """Base64 in whole padded quads only: a stored chunk always reads back."""
        await owner.put("/v1/stream/b", headers={"content-type": "application/octet-stream"},
                        content=b"ok")
        for bad in ("QQ", "QQ=", "Q"):
            refused = await peer.post("/rpc", json=rpc("events.append", session_id="b", events=[
                {"type": "stream.chunk", "data": {"base64": bad}}]))
            assert refused.json()["error"]["code"] == -32602, bad
        good = base64.b64encode(b"A").decode()
        await peer.post("/rpc", json=rpc("events.append", session_id="b", events=[
            {"type": "stream.chunk", "data": {"base64": good}}]))
        read = await owner.get("/v1/stream/b?offset=-1")
        assert read.status_code == 200 and read.content == b"okA"

    async def test_text_with_nul_is_kept_as_bytes(self, owner: httpx.AsyncClient) -> None:
        assert (await owner.put("/v1/stream/n", headers=TEXT)).status_code == 201
        assert (await owner.post("/v1/stream/n", headers=TEXT,
                                 content=b"a\x00b")).status_code == 204
        assert (await owner.get("/v1/stream/n?offset=-1")).content == b"a\x00b"

    @pytest.mark.parametrize("when", ["2026-13-01T00:00:00Z", "2026-02-30T00:00:00Z",
                                      "0000-01-01T00:00:00Z", "2090-01-01T00:00:00Z"])
    async def test_an_expiry_that_is_no_time_is_400(self, owner: httpx.AsyncClient,
                                                    when: str) -> None:
        refused = await owner.put("/v1/stream/e", headers={**TEXT, "stream-expires-at": when})
        assert refused.status_code == 400 and "Stream-Expires-At" in refused.text


class TestBrowsersAndAccess:
    async def test_a_preflight_is_answered_before_the_token(self, daemon: Daemon) -> None:
        """A browser sends no Authorization on a preflight: it must pass to an allowed
        origin, or the Bearer request after it is never sent."""
        async with httpx.AsyncClient(base_url=base(daemon), timeout=30) as anyone:
            pre = await anyone.options("/v1/stream/x", headers={
                "origin": "http://localhost:5173", "access-control-request-method": "POST",
                "access-control-request-headers": "authorization, content-type"})
        assert pre.status_code == 204
        assert pre.headers["access-control-allow-origin"] == "http://localhost:5173"

    async def test_a_rotated_token_ends_the_tails_it_opened(
            self, daemon: Daemon, owner: httpx.AsyncClient) -> None:
        """An SSE tail opened with a token ends when the token is rotated (a reload that
        lets a peer in no more ends tails the same way): reconnecting needs the new one."""
        from sessiond_schemas.paths import http_token_path, write_http_token

        await owner.put("/v1/stream/tail", headers=TEXT, content=b"a")
        with anyio.fail_after(PATIENCE_S):
            async with owner.stream("GET", "/v1/stream/tail?offset=-1&live=sse") as tail:
                lines = tail.aiter_lines()
                async for line in lines:
                    if line.startswith("data:") and "upToDate" in line:
                        break
                write_http_token(http_token_path(daemon.socket))  # sessionctl http-token --rotate
                # The next request reads the file again and ends what the old token opened.
                async with httpx.AsyncClient(base_url=base(daemon), timeout=30) as other:
                    await other.get("/v1/stream/tail", headers={
                        "authorization": f"Bearer {token(daemon)}"})
                async for _ in lines:  # drains to the end: the response was ended
                    pass
        stale = await owner.get("/v1/stream/tail?offset=-1")
        assert stale.status_code == 403
        assert json.loads(stale.text)["error"]


class TestDeepForks:
    @pytest.mark.fleet  # 990 forks to make: a long test, in .ci/run's second run
    async def test_a_fork_deep_in_its_chain_reads_over_http(
            self, owner: httpx.AsyncClient, client: AsyncClient) -> None:
        """A read walks the chain once per page, not by recursion: a fork 990 deep (within
        max_fork_depth; a stack of awaits per link passed Python's recursion limit: 500)
        reads whole."""
        await owner.put("/v1/stream/root", headers=TEXT, content=b"root ")
        sid = "root"
        for i in range(990):
            sid = (await client.fork(sid, new_session_id=f"deep-{i}")).session_id
        await owner.post(f"/v1/stream/{sid}", headers=TEXT, content=b"leaf")
        read = await owner.get(f"/v1/stream/{sid}?offset=-1")
        assert read.status_code == 200 and read.content == b"root leaf"


@pytest.mark.slow_on_postgresql
class TestSlowClients:
    @pytest.fixture
    def daemon_overrides(self) -> dict[str, object]:
        return {"http_listen": [f"127.0.0.1:{free_port()}"], "http_max_connections": 20,
                "http_idle_timeout_s": 1.0}

    @pytest.mark.fleet
    async def test_a_request_head_that_trickles_is_cut(self, daemon: Daemon) -> None:
        """Connections that send a byte every second, with no token, never finish a head:
        each is closed (twice the idle deadline), and the owner gets in."""
        host, port = daemon.config.http_listen[0].rsplit(":", 1)
        streams = [await anyio.connect_tcp(host, int(port)) for _ in range(20)]
        closed = 0
        with anyio.fail_after(PATIENCE_S):
            for s in streams:
                await s.send(b"G")
            while closed < len(streams):  # a byte a second, until each is cut
                await anyio.sleep(0.9)  # the pace of the trickle, not a bound under test
                for s in list(streams):
                    try:
                        await s.send(b"E")
                    except (anyio.BrokenResourceError, OSError):
                        streams.remove(s)
                        closed += 1
        async with httpx.AsyncClient(base_url=base(daemon), timeout=30, headers={
                "authorization": f"Bearer {token(daemon)}"}) as owner:
            assert (await owner.get("/v1/stream/none")).status_code == 404


def test_a_token_write_that_fails_leaves_no_file_behind(tmp_path: Path) -> None:
    """The token is written to a file of its own beside the token's path (O_EXCL), then
    moved into place: a move that fails (here: a directory stands at the token's path)
    removes that file; the next write, once the path is free, succeeds."""
    from sessiond_schemas.paths import write_http_token

    target = tmp_path / "sessiond.http-token"
    (target / "in-the-way").mkdir(parents=True)
    with pytest.raises(OSError):
        write_http_token(str(target))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sessiond.http-token"]
    (target / "in-the-way").rmdir()
    target.rmdir()
    token = write_http_token(str(target))
    assert target.read_text() == token + "\n"
    assert target.stat().st_mode & 0o777 == 0o600


def test_a_token_write_syncs_the_file_then_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rotation is on disk when it returns: the new file's bytes are synced before the
    move, and the directory after it (a power loss would otherwise bring back the old
    directory entry, the rotated-away token). Each synced descriptor is told by fstat."""
    from sessiond_schemas.paths import write_http_token

    real_fsync, synced = os.fsync, []

    target = tmp_path / "sessiond.http-token"

    def fsync(fd: int) -> None:
        st = os.fstat(fd)
        # A directory is synced with the new file in place already (after the move).
        synced.append(("dir", st.st_ino, target.stat().st_ino) if stat.S_ISDIR(st.st_mode)
                      else ("file", st.st_ino))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    write_http_token(str(target))
    new = target.stat().st_ino
    assert synced == [("file", new), ("dir", tmp_path.stat().st_ino, new)]


def test_a_filesystem_that_syncs_no_directory_still_takes_the_token(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync on a directory fails with EINVAL on some filesystems: the token, in place by
    then, is written all the same. Another error of that sync is the write's error."""
    from sessiond_schemas.paths import write_http_token

    real_fsync = os.fsync
    refusal = [errno.EINVAL]

    def fsync(fd: int) -> None:
        if stat.S_ISDIR(os.fstat(fd).st_mode):
            raise OSError(refusal[0], os.strerror(refusal[0]))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    target = tmp_path / "sessiond.http-token"
    token = write_http_token(str(target))
    assert target.read_text() == token + "\n"
    refusal[0] = errno.EIO
    with pytest.raises(OSError) as raised:
        write_http_token(str(target))
    assert raised.value.errno == errno.EIO
