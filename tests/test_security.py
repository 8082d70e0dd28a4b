"""Trust (docs/security.md): what clients write is never acted on, and peers get only
what they are granted. Through real daemons, real sockets and, as root, a real other uid."""

from __future__ import annotations

import json
import os
import pwd
import socket
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from typing import Any

import anyio
import msgspec
import pytest
from conftest import as_user, daemon_config, eventually, running_daemon, wait_for_daemon

from sessiond import AsyncClient
from sessiond.importers._builder import DocumentBuilder
from sessiond_daemon.core.commands import given
from sessiond_daemon.core.writer import Command, Plan, Writer
from sessiond_daemon.features.executors.processes import boot_id, start_time
from sessiond_daemon.stores import registry
from sessiond_schemas.errors import InvalidParamsError, SessiondError, SessionImportError
from sessiond_schemas.events import EventMeta

pytestmark = pytest.mark.anyio

PEER = "sessiond-peer"
AT = "2026-01-01T00:00:00Z"
RUNNER_ONLY = {
    "process.started": {"pid": 0, "argv": ["x"], "turn": 1},
    "process.output": {"turn": 1, "line": "x"},
    "process.exited": {"pid": 0, "turn": 1},
    "process.detached": {"pid": 0, "turn": 1, "alive": True, "reason": "x"},
}


def peer_user() -> pwd.struct_passwd:
    """A throwaway user to be the other uid (created if missing)."""
    if os.getuid() != 0:
        pytest.skip("needs root to run a peer as another uid")
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    PEER], capture_output=True, check=False)  # exists already: fine
    return pwd.getpwnam(PEER)


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except FileNotFoundError:
        return False


@pytest.fixture
def victims() -> Iterator[list[subprocess.Popen[bytes]]]:
    """Processes that must survive: `sleep`s started here, each leading its own session."""
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for p in procs:
        p.kill()
        p.wait()


def victim(procs: list[subprocess.Popen[bytes]], *, user: pwd.struct_passwd | None = None,
           env: dict[str, str] | None = None) -> int:
    extra: dict[str, Any] = {}
    if user is not None:
        extra = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
    p = subprocess.Popen(["sleep", "300"], start_new_session=True, cwd="/", env=env or {},
                         **extra)
    procs.append(p)
    with open(f"/proc/{p.pid}/stat"):  # it exists before anyone looks at it
        pass
    return p.pid


def forged(sid: str, pid: Any, *, status: str = "active", **started: Any) -> dict[str, Any]:
    """An export document of an executor session whose process.started names `pid`."""
    b = DocumentBuilder(sid, "forged")
    b.add("session.created", {"adapter": "jsonl", "status": "active"}, AT)
    b.add("process.started", {"pid": pid, "argv": ["/bin/sh", "-c", "touch /tmp/pwned"],
                              "turn": 1, **started}, AT)
    if status != "active":
        b.add("process.exited", {"pid": pid, "turn": 1, "exit_code": 0}, AT)
        b.add("session.status_changed", {"from": "active", "to": status}, AT)
    return b.document()


async def daemon_process(sock: str, db: str) -> subprocess.Popen[bytes]:
    """`python -m sessiond_daemon` in its own session: a signal to its group cannot reach
    the tests, and its dying is seen."""
    proc = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", sock,
                             "--db", db, "--log-level", "error", "--kill-grace-s", "0.5"],
                            start_new_session=True)
    await anyio.to_thread.run_sync(wait_for_daemon, sock, proc)
    return proc


def stop(proc: subprocess.Popen[bytes]) -> None:
    proc.terminate()
    assert proc.wait(timeout=30) == 0


class TestRunnerOnlyEvents:
    @pytest.mark.parametrize("kind", sorted(RUNNER_ONLY))
    async def test_clients_cannot_append_them(self, client: AsyncClient, kind: str) -> None:
        """events.append and session.create's events refuse process.* with -32602 naming
        the index and the type; nothing is written."""
        await client.create_session("s")
        events = [{"type": "memory.updated", "data": {"patch": {"a": 1}}},
                  {"type": kind, "data": RUNNER_ONLY[kind]}]
        with pytest.raises(InvalidParamsError) as refused:
            await client.append_events("s", events)
        assert "events[1]" in refused.value.message and kind in refused.value.message
        assert refused.value.data["path"] == "$.events[1].type"
        assert (await client.get_session("s")).version == 1
        with pytest.raises(InvalidParamsError) as refused:
            await client.create_session("t", events=events)
        assert refused.value.data["path"] == "$.events[1].type"
        with pytest.raises(SessiondError):
            await client.get_session("t")


class TestImportedProcesses:
    async def test_imported_pids_are_history_only(
            self, short_dir: str, victims: list[subprocess.Popen[bytes]]) -> None:
        """Imported process.started with pid 0, the daemon's own pid, and a live same-uid
        session leader with its true start time: kill signals none of them, a restart
        starts and leaves them alone, the imported argv is never run. A pid no process can
        have (-1, 2^32) is refused at import, naming the field."""
        sock, db = os.path.join(short_dir, "d.sock"), os.path.join(short_dir, "d.db")
        proc = await daemon_process(sock, db)
        innocent = victim(victims, env={"SESSIOND_SESSION_ID": "innocent", "SESSIOND_TURN": "1"})
        pids = {"zero": 0, "daemon": proc.pid, "innocent": innocent}
        try:
            async with AsyncClient(sock) as c:
                for name, pid in {"minus": -1, "big": 4294967296}.items():
                    with pytest.raises(SessionImportError, match=r"\$\.pid"):
                        await c.import_session(forged(name, pid))
                for name, pid in pids.items():
                    ticks = start_time(pid) if pid > 0 else 0
                    state = await c.import_session(forged(name, pid, start_time=ticks,
                                                          boot_id=boot_id()))
                    assert (state.status, state.pid, state.error) == ("active", pid, None)
                    [mark] = (await c.read_events(name, types=["process.detached"])).events
                    assert mark.data.imported is True and mark.data.alive is False
                await c.import_session(forged("done", 1234, status="completed"))
            stop(proc)
            proc = await daemon_process(sock, db)  # recovery: nothing of that is its
            async with AsyncClient(sock) as c:
                for name in pids:
                    assert (await c.get_session(name)).status == "active"
                    assert (await c.kill(name)).status == "killed"
                    assert proc.poll() is None
                assert alive(innocent)
                with pytest.raises(InvalidParamsError, match="imported executor history"):
                    await c.inject("done", "go on")
                assert not os.path.exists("/tmp/pwned")
                assert (await c.verify()).ok
        finally:
            stop(proc)


def legacy_store_write(db: str, sessions: dict[str, dict[str, Any]]) -> None:
    """Write executor sessions as a daemon before this fix could have stored them (when
    events.append still took process.started): through the daemon's own writer."""
    async def write() -> None:
        store = registry.open_store(db)
        await store.open()
        writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)
        try:
            async with anyio.create_task_group() as tg:
                await tg.start(writer.run)
                for sid, started in sessions.items():
                    events = [(t, given(t, d)) for t, d in (
                        ("session.created", {"adapter": "jsonl", "status": "active"}),
                        ("process.started", {"argv": ["x"], "turn": 1, **started}))]
                    await writer.submit(Command(
                        session_id=sid, meta=EventMeta(),
                        plan=lambda s, events=events: Plan(events, lambda st, ev: st)))
                writer.close()
        finally:
            await store.close()

    anyio.run(write)


class TestRecoveryOfStoredPids:
    async def test_start_never_fails_and_signals_nothing_unproven(
            self, short_dir: str, victims: list[subprocess.Popen[bytes]]) -> None:
        """Stored runner-looking pids a client could have forged: bad numbers, the daemon's
        group, another user's session leader with this session's variables, a same-uid one
        without them, a wrong start time, another boot. The daemon starts, records each
        turn as lost, and every victim lives."""
        sock, db = os.path.join(short_dir, "r.sock"), os.path.join(short_dir, "r.db")
        here = boot_id()
        mine = victim(victims)
        marked = victim(victims, env={"SESSIOND_SESSION_ID": "stale", "SESSIOND_TURN": "1"})
        sessions: dict[str, dict[str, Any]] = {
            "zero": {"pid": 0}, "minus": {"pid": 0}, "big": {"pid": 0}, "huge": {"pid": 0},
            "init": {"pid": 1, "start_time": start_time(1), "boot_id": here},
            "mine": {"pid": mine, "start_time": start_time(mine), "boot_id": here},
            "stale": {"pid": marked, "start_time": (start_time(marked) or 0) + 1,
                      "boot_id": here},
            "reboot": {"pid": marked, "start_time": start_time(marked), "boot_id": "other"},
        }
        if os.getuid() == 0:
            other = victim(victims, user=peer_user(),
                           env={"SESSIOND_SESSION_ID": "other", "SESSIOND_TURN": "1"})
            sessions["other"] = {"pid": other, "start_time": start_time(other),
                                 "boot_id": here}
        await anyio.to_thread.run_sync(legacy_store_write, db, sessions)
        # Pids no process can have: this release's fold refuses them, so they can only be
        # rows changed behind its back. Their sessions are damaged, never acted on.
        out_of_range = {"minus": -1, "big": 4294967296, "huge": (1 << 63) - 1}
        con = sqlite3.connect(db)
        with con:
            for sid, pid in out_of_range.items():
                con.execute("UPDATE events SET data = CAST(json_set(data, '$.pid', ?) AS BLOB)"
                            " WHERE session_id = ? AND type = 'process.started'", (pid, sid))
        con.close()
        proc = await daemon_process(sock, db)
        try:
            async with AsyncClient(sock) as c:
                for sid in sessions.keys() - out_of_range.keys():
                    state = await c.get_session(sid)
                    assert state.status == "failed", sid
                    assert state.error and state.error.startswith(
                        "daemon restarted; executor process lost"), sid
                assert "not signalled" in ((await c.get_session("mine")).error or "")
                assert all(alive(v.pid) for v in victims)
                report = await c.verify()
                assert {p.session_id for p in report.problems} == out_of_range.keys()
            stop(proc)
            proc = await daemon_process(sock, db)  # and again: nothing left to decide
        finally:
            stop(proc)
        assert all(alive(v.pid) for v in victims)


def as_peer(sock: str, user: pwd.struct_passwd, requests: list[Any]) -> dict[Any, Any]:
    """Send `requests` (objects, or lists for batches) from a forked child running as
    `user`; return each answer by id (a batch's answers are spread by their ids)."""
    wanted = set()
    for r in requests:
        wanted |= {i["id"] for i in (r if isinstance(r, list) else [r])}

    def ask() -> bytes:  # as the peer: send, then keep every line until all are answered
        s = socket.socket(socket.AF_UNIX)
        s.settimeout(30)
        s.connect(sock)
        s.sendall(b"".join(json.dumps(r).encode() + b"\n" for r in requests))
        answered: set[Any] = set()
        lines = []
        f = s.makefile("rb")
        while not wanted <= answered and (line := f.readline()):
            lines.append(line)
            reply = json.loads(line)
            for one in reply if isinstance(reply, list) else [reply]:
                answered.add(one.get("id", "notification"))
        return b"".join(lines)

    def run() -> dict[Any, Any]:
        by_id: dict[Any, Any] = {}
        for line in as_user(user, ask).splitlines():
            reply = json.loads(line)
            for one in reply if isinstance(reply, list) else [reply]:
                if "id" in one:
                    by_id[one["id"]] = one
        return by_id

    return anyio.to_thread.run_sync(run)  # type: ignore[return-value]


def req(i: Any, method: str, **params: Any) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": i, "method": method, "params": params}


NEVER_BY_DEFAULT = {
    "spawn": ("session.spawn", {"argv": ["true"], "session_id": "peer-spawned"}),
    "inject": ("session.inject", {"session_id": "owned", "message": "hi"}),
    "kill": ("session.kill", {"session_id": "owned"}),
    "backup": ("daemon.backup", {"path": "/tmp/sd-peer-backup-never.db"}),
    "replace": ("session.import", {"document": {}, "on_conflict": "replace"}),
    "delete": ("session.delete", {"session_id": "owned"}),
    "cleanup": ("session.cleanup", {"older_than_days": 0}),
}


@pytest.fixture
def shared_dir() -> Iterator[str]:
    """A temporary directory another user can reach (it cannot write there)."""
    with tempfile.TemporaryDirectory(prefix="sd-") as d:
        os.chmod(d, 0o755)
        yield d


class TestPeerAuthorization:
    @pytest.mark.parametrize("by", ["uid", "gid"])
    async def test_default_peer_gets_session_data_only(self, shared_dir: str, by: str) -> None:
        """An allowed other user (by uid or by gid) creates, appends, reads and subscribes;
        everything the issue lists is -32006 naming the method (in a batch too), and
        nothing happens."""
        user = peer_user()
        allowed = ({"allowed_uids": [user.pw_uid]} if by == "uid"
                   else {"allowed_gids": [user.pw_gid]})
        config = daemon_config(shared_dir, socket_mode=0o666, **allowed)
        async with running_daemon(config) as d, AsyncClient(d.socket) as owner:
            await owner.create_session("owned")
            answers = await as_peer(d.socket, user, [
                req(1, "daemon.ping"), req(2, "session.create", session_id="theirs"),
                req(3, "message.append", session_id="theirs", role="user", content="hi"),
                req(4, "events.append", session_id="owned",
                    events=[{"type": "metadata.updated", "data": {"patch": {"k": 1}}}]),
                req(5, "events.read", session_id="owned"),
                req(6, "session.get", session_id="owned"),
                req(7, "events.subscribe", session_id="owned"),
                *[req(name, m, **p) for name, (m, p) in NEVER_BY_DEFAULT.items()],
                [req("b1", "session.get", session_id="owned"),
                 req("b2", "session.delete", session_id="owned")],
            ])
            for i in range(1, 8):
                assert "result" in answers[i], answers[i]
            [*_, appended] = (await owner.read_events("owned")).events
            assert appended.meta.peer_uid == user.pw_uid
            for name, (method, _) in [*NEVER_BY_DEFAULT.items(), ("b2", ("session.delete", {}))]:
                error = answers[name]["error"]
                assert error["code"] == -32006, (name, error)
                assert method in error["message"] and error["data"]["method"] == method
                assert error["data"]["uid"] == user.pw_uid
            assert answers["replace"]["error"]["data"]["grant"] == "session.import:replace"
            assert "result" in answers["b1"]
            state = await owner.get_session("owned")
            assert state.status == "active" and state.version == 2
            assert not os.path.exists("/tmp/sd-peer-backup-never.db")
            with pytest.raises(SessiondError):
                await owner.get_session("peer-spawned")

    async def test_grants_by_name_and_on_reload(self, shared_dir: str) -> None:
        """peer_methods adds methods by name; SIGHUP's reload changes them live; the
        daemon's own uid is never limited."""
        from sessiond_daemon.serve import lifecycle

        user = peer_user()
        config = daemon_config(shared_dir, socket_mode=0o666, allowed_uids=[user.pw_uid],
                               peer_methods=["session.delete", "session.import"])
        daemon = lifecycle.Daemon(config)
        shutdown = anyio.Event()
        async with anyio.create_task_group() as tg:
            sock = await tg.start(daemon.run, shutdown)
            async with AsyncClient(sock) as owner:
                for sid in ("a", "b", "c"):
                    await owner.create_session(sid)
                doc = await owner.export_session("c")
                answers = await as_peer(sock, user, [
                    req(1, "session.delete", session_id="a"),
                    req(2, "session.import", document=doc, on_conflict="skip"),
                    req(3, "session.import", document=doc, on_conflict="replace"),
                    req(4, "session.kill", session_id="b")])
                assert answers[1]["result"] == {"deleted": True}
                assert "result" in answers[2]
                assert answers[3]["error"]["code"] == -32006
                assert answers[4]["error"]["code"] == -32006
                new = msgspec.structs.replace(config, peer_methods=["session.import:replace"])
                assert "peer_methods" in daemon.reload(new)
                answers = await as_peer(sock, user, [
                    req(1, "session.delete", session_id="b"),
                    req(2, "session.import", document=doc, on_conflict="replace")])
                assert answers[1]["error"]["code"] == -32006
                assert "result" in answers[2]
                assert await owner.delete_session("b")  # the owner: everything
            shutdown.set()

    async def test_unknown_grant_is_refused_at_load(self) -> None:
        """A misspelt method in peer_methods stops the config, naming the entry."""
        from sessiond_daemon.serve.config import ConfigError, load

        with pytest.raises(ConfigError, match=r"peer_methods\[1\]"):
            load(None, {"peer_methods": ["session.spawn", "session.spwan"]}, env={})


class TestExecutorEnvironment:
    async def test_clean_environment_and_refused_keys(self, client: AsyncClient,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
        """The executor sees the allowlist and `env`, never the daemon's own secrets;
        LD_* and PYTHON* keys are -32602 naming the key."""
        monkeypatch.setenv("SESSIOND_TEST_SECRET", "hunter2")
        monkeypatch.setenv("LC_TIME", "C")
        state = await client.spawn(["env"], env={"ASKED": "yes"}, session_id="env")
        async def ended() -> bool:
            return (await client.get_session("env")).status != "active"

        await eventually(ended, "env to exit")
        seen = dict(line.split("=", 1) for line in (await client.output("env")).lines
                    if "=" in line)
        assert state.pid and seen["ASKED"] == "yes" and seen["SESSIOND_SESSION_ID"] == "env"
        assert seen["PATH"] == os.environ["PATH"] and seen["LC_TIME"] == "C"
        assert "SESSIOND_TEST_SECRET" not in seen
        assert set(seen) <= {"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE",
                             "TERM", "TZ", "TMPDIR", "XDG_RUNTIME_DIR", "ASKED",
                             "SESSIOND_SESSION_ID", "SESSIOND_TURN", "SESSIOND_SOCKET"} | {
                                 k for k in seen if k.startswith("LC_")}
        for key in ("LD_PRELOAD", "LD_LIBRARY_PATH", "PYTHONPATH", "PYTHONSTARTUP"):
            with pytest.raises(InvalidParamsError) as refused:
                await client.spawn(["true"], env={key: "/tmp/x"}, session_id=f"k-{key}")
            assert key in refused.value.message and refused.value.data["path"] == f"$.env.{key}"
            with pytest.raises(SessiondError):
                await client.get_session(f"k-{key}")
        with pytest.raises(InvalidParamsError) as refused:
            await client.spawn(["true", "a\0b"], session_id="nul")
        assert refused.value.data["path"] == "$.argv[1]"
