"""Access that outlives its grant (docs/security.md): a reload that no longer lets a peer
in ends its connections and subscriptions, saying why; and an idempotency key answers
only the uid that used it. Through real daemons and, as root, a real other uid."""

from __future__ import annotations

import json
import os
import socket
import sqlite3
from collections.abc import Iterator, Sequence
from typing import Any

import anyio
import msgspec
import pg
import pytest
from conftest import as_user, daemon_config, running_daemon
from test_security import peer_user, req

from sessiond import AsyncClient
from sessiond_daemon.serve import lifecycle
from sessiond_daemon.stores.postgres import schema as pg_schema
from sessiond_daemon.stores.schema import OWNER_UID
from sessiond_daemon.stores.sqlite import migrations
from sessiond_schemas.errors import SessiondError

pytestmark = pytest.mark.anyio


def connect_as(user: Any, path: str) -> socket.socket:
    """A connection to `path` made by a process of `user` (SO_PEERCRED says its uid),
    handed back to this process (SCM_RIGHTS) to be driven from here."""
    here, there = socket.socketpair()

    def job() -> bytes:
        s = socket.socket(socket.AF_UNIX)
        s.connect(path)
        socket.send_fds(there, [b"x"], [s.fileno()])
        return b"ok"

    try:
        assert as_user(user, job) == b"ok"
        _, fds, _, _ = socket.recv_fds(here, 1, 1)
    finally:
        here.close()
        there.close()
    s = socket.socket(fileno=fds[0])
    s.settimeout(60)  # a guard: a read the daemon never answers fails, not hangs
    return s


def lines(sock: socket.socket) -> Iterator[dict[str, Any]]:
    """The JSON lines the daemon sends on `sock`, until it closes it."""
    f = sock.makefile("rb")
    while line := f.readline():
        yield json.loads(line)


def until(stream: Iterator[dict[str, Any]], wanted: Any) -> list[dict[str, Any]]:
    """Read lines until one for which `wanted(line)` is true; return them all."""
    seen = []
    for line in stream:
        seen.append(line)
        if wanted(line):
            return seen
    raise AssertionError(f"the connection ended first: {seen}")


@pytest.fixture
def shared_dir() -> Iterator[str]:
    import tempfile

    with tempfile.TemporaryDirectory(prefix="sd-") as d:
        os.chmod(d, 0o755)
        yield d


class TestRevokedOnReload:
    async def test_reload_ends_the_peers_connections_and_subscriptions(
            self, shared_dir: str) -> None:
        """A peer subscribed (and another of its connections idle) while allowed; the
        reload drops it from allowed_uids: its subscription ends with subscription.dropped
        (reason "access revoked: ..."), each connection gets -32006 and is closed, and
        nothing the owner writes afterwards reaches it. The owner's connection goes on."""
        user = peer_user()
        config = daemon_config(shared_dir, socket_mode=0o666, allowed_uids=[user.pw_uid])
        daemon = lifecycle.Daemon(config)
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            sock = await tg.start(daemon.run, shutdown)
            async with AsyncClient(sock) as owner:
                await owner.create_session("s")
                sub = connect_as(user, sock)
                idle = connect_as(user, sock)
                with sub, idle:
                    sub.sendall(json.dumps(req(1, "events.subscribe", session_id="s"))
                                .encode() + b"\n")
                    stream = lines(sub)
                    await anyio.to_thread.run_sync(until, stream, lambda m: m.get(
                        "method") == "subscription.caught_up")
                    await owner.append_message("s", role="user", content="while allowed")
                    seen = await anyio.to_thread.run_sync(until, stream, lambda m: m.get(
                        "method") == "subscription.event")
                    assert seen[-1]["params"]["event"]["type"] == "message.appended"
                    idle.sendall(json.dumps(req(2, "daemon.ping")).encode() + b"\n")
                    idle_stream = lines(idle)
                    assert "result" in await anyio.to_thread.run_sync(next, idle_stream)

                    changed = daemon.reload(msgspec.structs.replace(config, allowed_uids=[]))
                    assert "allowed_uids" in changed
                    await owner.append_message("s", role="user", content="after the reload")
                    rest = await anyio.to_thread.run_sync(lambda: list(stream))
                    assert [m.get("method") for m in rest] == ["subscription.dropped", None]
                    dropped, refused = rest
                    assert dropped["params"]["reason"].startswith("access revoked")
                    assert str(user.pw_uid) in dropped["params"]["reason"]
                    assert refused["id"] is None and refused["error"]["code"] == -32006
                    assert refused["error"]["data"] == {"uid": user.pw_uid,
                                                        "reason": "access revoked"}
                    idle_rest = await anyio.to_thread.run_sync(lambda: list(idle_stream))
                    assert [m["error"]["code"] for m in idle_rest] == [-32006]
                assert (await owner.get_session("s")).message_count == 2
                assert (await owner.ping()).pong
                stats = await owner.stats()
                assert stats.connections == 1 and stats.subscriptions == 0
            shutdown.set()


def as_peer_lines(user: Any, path: str, requests: list[dict[str, Any]]) -> dict[Any, Any]:
    """Send `requests` as `user` on one connection; their answers by id."""
    with connect_as(user, path) as s:
        s.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        answers: dict[Any, Any] = {}
        for line in lines(s):
            answers[line.get("id")] = line
            if len(answers) == len(requests):
                return answers
    raise AssertionError(f"the daemon closed the connection: {answers}")


def owners_fork_id(source: str, key: str) -> str:
    """What the owner's keyed fork of `source` is called (docs/protocol.md): a peer can
    work it out too."""
    import base64
    import hashlib

    digest = hashlib.sha256(f"{source}\0{key}".encode()).digest()
    return "fork-" + base64.b32encode(digest).decode()[:26].lower()


class TestKeysScopedToTheCaller:
    async def test_one_uids_key_never_answers_anothers(self, shared_dir: str,
                                                       db_url: str) -> None:
        """A peer and the owner use the same key on the same session: each write is
        made, and each retry gets its own first result. The predictable id of the
        owner's keyed fork, created first by the peer with the same key, makes the
        owner's fork -32004, never the peer's session; the peer's keyed fork of the
        same source and key is a session of its own."""
        user = peer_user()
        config = daemon_config(shared_dir, db=db_url, socket_mode=0o666,
                               allowed_uids=[user.pw_uid])
        daemon = lifecycle.Daemon(config)
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            sock = await tg.start(daemon.run, shutdown)
            async with AsyncClient(sock) as owner:
                await owner.create_session("s")
                theirs = await anyio.to_thread.run_sync(as_peer_lines, user, sock, [
                    req(1, "message.append", session_id="s", role="user", content="peer's",
                        idempotency_key="k")])
                assert theirs[1]["result"]["version"] == 2
                mine = await owner.append_message("s", role="user", content="owner's",
                                                  idempotency_key="k")
                assert mine.version == 3  # made, not answered with the peer's result
                assert (await owner.append_message("s", role="user", content="again",
                                                   idempotency_key="k")).version == 3
                again = await anyio.to_thread.run_sync(as_peer_lines, user, sock, [
                    req(1, "message.append", session_id="s", role="user", content="again",
                        idempotency_key="k")])
                assert again[1]["result"]["version"] == 2
                assert (await owner.get_session("s")).message_count == 2

                # The fork: the peer takes the owner's fork id first, with the same key.
                squatted = owners_fork_id("s", "f")
                taken = await anyio.to_thread.run_sync(as_peer_lines, user, sock, [
                    req(1, "session.create", session_id=squatted, idempotency_key="f")])
                assert "result" in taken[1]
                with pytest.raises(SessiondError) as refused:
                    await owner.fork("s", idempotency_key="f")
                assert refused.value.code == -32004
                assert refused.value.data == {"session_id": squatted}
                peer_fork = await anyio.to_thread.run_sync(as_peer_lines, user, sock, [
                    req(1, "session.fork", session_id="s", idempotency_key="f"),
                    req(2, "session.fork", session_id="s", idempotency_key="f")])
                first, retry = peer_fork[1]["result"], peer_fork[2]["result"]
                assert first["session_id"] == retry["session_id"] != squatted
                assert first["forked_from"]["session_id"] == "s"
                # The owner, with a key nobody took, forks as before; a retry finds it.
                made = await owner.fork("s", idempotency_key="g")
                assert made.session_id == owners_fork_id("s", "g")
                assert (await owner.fork("s", idempotency_key="g")).version \
                    == made.version
            shutdown.set()


def _scoping_migration(steps: Sequence[Sequence[object]]) -> int:
    """The number of the migration that gave stored keys their owner's uid."""
    return next(n for n, migration in enumerate(steps, 1)
                if any(OWNER_UID in str(step) for step in migration))


class TestKeysStoredBeforeTheScope:
    async def test_old_keys_belong_to_the_daemon_owner(self, short_dir: str,
                                                      db_url: str) -> None:
        """A database whose keys were stored unscoped (the schema before the migration
        that scoped them): after the upgrade, the owner's retry under an old key gets
        the stored result and writes nothing."""
        config = daemon_config(short_dir, db=db_url)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await client.create_session("s")
            first = await client.append_message("s", role="user", content="once",
                                                idempotency_key="old")
        # Back to the schema before: keys without their uid, the version before the
        # migration that scoped them (the later ones run again: each may).
        unscope = "UPDATE idempotency SET key = substr(key, length(?) + 1)"
        prefix = f"{os.getuid()}:"
        if db_url.startswith("postgresql"):
            pg.query(db_url, unscope, prefix)
            pg.query(db_url, "UPDATE meta SET value = ? WHERE key = 'schema_version'",
                     str(_scoping_migration(pg_schema.MIGRATIONS) - 1))
        else:
            con = sqlite3.connect(db_url)
            with con:
                con.execute(unscope, (prefix,))
                con.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'",
                            (str(_scoping_migration(migrations.MIGRATIONS) - 1),))
            con.close()
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            assert d.sql("SELECT key FROM idempotency") == [(f"{os.getuid()}:old",)]
            retry = await client.append_message("s", role="user", content="once",
                                                idempotency_key="old")
            assert retry == first
            assert (await client.get_session("s")).message_count == 1
