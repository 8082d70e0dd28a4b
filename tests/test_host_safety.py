"""Safety on a shared host: paths another user controls, one daemon per database,
bounded settings, and clients that say which socket had no daemon (issue 13, 5/7/8/9)."""

from __future__ import annotations

import os
import pwd
import signal
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import daemon_config, running_daemon, wait_for_daemon, wait_until

from sessiond import AsyncClient, Client, DaemonUnavailableError, UntrustedDaemonError
from sessiond_schemas.errors import SessiondError, StorageError

pytestmark = pytest.mark.anyio
PEER = "sessiond-impostor"
needs_root = pytest.mark.skipif(os.getuid() != 0, reason="needs root to act as another uid")


# A ping on trio: prints the error's class name and its data's peer_uid, or "pong".
TRIO_PING = (
    "import anyio, sys\n"
    "from sessiond import AsyncClient, SessiondError\n"
    "async def main():\n"
    "    try:\n"
    "        async with AsyncClient(sys.argv[1]) as c:\n"
    "            await c.ping()\n"
    "        print('pong')\n"
    "    except SessiondError as e:\n"
    "        print(type(e).__name__, e.data.get('peer_uid', e.data.get('socket')))\n"
    "anyio.run(main, backend='trio')\n"
)


# --- helpers ---------------------------------------------------------------------------

def other_user() -> pwd.struct_passwd:
    """A throwaway user to play the other local user (created once; kept if it exists)."""
    try:
        return pwd.getpwnam(PEER)
    except KeyError:
        pass
    subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin",
                    PEER], capture_output=True, check=False)
    try:
        return pwd.getpwnam(PEER)  # made by us, or by a test that raced us
    except KeyError:
        pytest.skip("cannot create a throwaway user here")


def start_daemon(*args: str, log: Path, umask: int | None = None) -> subprocess.Popen[bytes]:
    preexec = (lambda: os.umask(umask)) if umask is not None else None
    with open(log, "wb") as stderr:  # the child keeps its own copy
        return subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--log-format",
                                 "json", *args], stderr=stderr, preexec_fn=preexec)


def stop(proc: subprocess.Popen[bytes]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    return proc.wait(timeout=60)


def run_daemon(*args: str) -> subprocess.CompletedProcess[str]:
    """Run a daemon expected to refuse to start; its exit code and stderr."""
    return subprocess.run([sys.executable, "-m", "sessiond_daemon", "--log-format", "json",
                           *args], capture_output=True, text=True, timeout=120, check=False)


@pytest.fixture
def impostor() -> Iterator[tuple[str, int]]:
    """A fake daemon run by another uid: a forked child that setuid()s, binds a socket
    in a directory it owns and answers every line with a pong. Yields (socket, uid)."""
    user = other_user()
    with tempfile.TemporaryDirectory(prefix="sd-") as base:
        os.chmod(base, 0o755)
        theirs = os.path.join(base, "theirs")
        os.mkdir(theirs, 0o777)
        os.chown(theirs, user.pw_uid, user.pw_gid)
        path = os.path.join(theirs, "sessiond.sock")
        ready_r, ready_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: become the other user, then pretend to be sessiond
            try:
                os.close(ready_r)
                os.setgroups([])
                os.setgid(user.pw_gid)
                os.setuid(user.pw_uid)
                server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                server.bind(path)
                os.chmod(path, 0o777)
                server.listen(16)
                os.write(ready_w, b"ready")
                while True:
                    conn, _ = server.accept()
                    for line in conn.makefile("rb"):
                        request_id = line.split(b'"id":', 1)[1].split(b",", 1)[0].strip(b"}\n ")
                        conn.sendall(b'{"jsonrpc":"2.0","id":%s,"result":{"pong":true,'
                                     b'"version":"0","uptime_s":0}}\n' % request_id)
                    conn.close()
            finally:
                os._exit(0)
        os.close(ready_w)
        try:
            assert os.read(ready_r, 5) == b"ready"
            yield path, user.pw_uid
        finally:
            os.close(ready_r)
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


# --- 5. paths another user controls ------------------------------------------------------

@needs_root
class TestImpostor:
    def test_sync_client_refuses_another_uids_daemon(self, impostor: tuple[str, int]) -> None:
        """A socket answered by another uid: UntrustedDaemonError naming it, no call made."""
        path, uid = impostor
        with pytest.raises(UntrustedDaemonError) as caught:
            Client(path).ping()
        assert caught.value.data["peer_uid"] == uid and caught.value.data["socket"] == path
        assert str(uid) in caught.value.message and path in caught.value.message
        assert "SESSIOND_TRUSTED_UIDS" in caught.value.message

    async def test_async_client_refuses_another_uids_daemon(
            self, impostor: tuple[str, int]) -> None:
        """The async client checks the same, before it sends anything."""
        path, uid = impostor
        with pytest.raises(UntrustedDaemonError) as caught:
            async with AsyncClient(path) as client:
                await client.ping()
        assert caught.value.data["peer_uid"] == uid

    async def test_the_sdk_stores_client_refuses_it_too(
            self, impostor: tuple[str, int]) -> None:
        """The integrations' asyncio client (LoopClient) checks who answers as well."""
        from sessiond.integrations._loop import LoopClient

        path, uid = impostor
        with pytest.raises(UntrustedDaemonError) as caught:
            await LoopClient(path).ping()
        assert caught.value.data["peer_uid"] == uid

    def test_a_uid_named_in_the_environment_is_trusted(
            self, impostor: tuple[str, int], monkeypatch: pytest.MonkeyPatch) -> None:
        """$SESSIOND_TRUSTED_UIDS lets in a daemon of that uid (a system-wide sessiond)."""
        path, uid = impostor
        monkeypatch.setenv("SESSIOND_TRUSTED_UIDS", f"12345, {uid}")
        with Client(path) as client:
            assert client.ping().pong is True

    def test_under_trio_too(self, impostor: tuple[str, int]) -> None:
        """On trio the client connects through anyio's stream: checked the same."""
        path, uid = impostor
        result = subprocess.run([sys.executable, "-c", TRIO_PING, path], capture_output=True,
                                text=True, timeout=120, check=False)
        assert result.stdout.strip() == f"UntrustedDaemonError {uid}", result.stderr

    def test_subscriptions_refuse_it_too(self, impostor: tuple[str, int]) -> None:
        """The blocking follower does not retry an impostor: it raises at once."""
        path, _ = impostor
        with pytest.raises(UntrustedDaemonError):
            next(Client(path).subscribe(retry_for=None))

    def test_daemon_refuses_a_runtime_directory_of_another_user(self) -> None:
        """A runtime directory another user made first (the /tmp/sessiond-$UID attack):
        exit 78, naming the directory, its owner and the fix."""
        user = other_user()
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            theirs = os.path.join(base, "sessiond-0")
            os.mkdir(theirs, 0o755)
            os.chown(theirs, user.pw_uid, user.pw_gid)
            result = run_daemon("--socket", os.path.join(theirs, "s.sock"),
                                "--db", os.path.join(base, "db", "s.db"))
        assert result.returncode == 78, result.stderr
        assert theirs in result.stderr and f"uid {user.pw_uid}" in result.stderr
        assert "daemon.unsafe_path" in result.stderr and "Fix:" in result.stderr

    def test_daemon_refuses_a_symlink_of_another_user(self) -> None:
        """Even pointing at a directory of ours: its owner could repoint it later."""
        user = other_user()
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            ours, link = os.path.join(base, "ours"), os.path.join(base, "sessiond-0")
            os.mkdir(ours, 0o700)
            os.symlink(ours, link)
            os.lchown(link, user.pw_uid, user.pw_gid)
            result = run_daemon("--socket", os.path.join(link, "s.sock"),
                                "--db", os.path.join(base, "db", "s.db"))
        assert result.returncode == 78 and "symlink" in result.stderr, result.stderr


class TestPrivatePaths:
    @pytest.mark.parametrize("mode", [0o777, 0o770, 0o1777])
    def test_daemon_refuses_a_runtime_directory_others_can_write(self, mode: int) -> None:
        """0777, group-writable or sticky /tmp-like: exit 78 naming the path and the fix."""
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            run = os.path.join(base, "run")
            os.mkdir(run)
            os.chmod(run, mode)
            result = run_daemon("--socket", os.path.join(run, "s.sock"),
                                "--db", os.path.join(base, "state", "s.db"))
            assert not os.path.exists(os.path.join(base, "state", "s.db"))
        assert result.returncode == 78, result.stderr
        assert run in result.stderr and f"chmod go-w {run}" in result.stderr

    def test_daemon_refuses_a_state_directory_others_can_write(self) -> None:
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            state = os.path.join(base, "state")
            os.mkdir(state)
            os.chmod(state, 0o777)
            result = run_daemon("--socket", os.path.join(base, "s.sock"),
                                "--db", os.path.join(state, "s.db"))
            assert os.listdir(state) == []
        assert result.returncode == 78 and "state directory" in result.stderr, result.stderr

    async def test_systemd_like_directories_pass(self, short_dir: str) -> None:
        """RuntimeDirectory= (0755) and StateDirectory= (0700), owned by the daemon: served.
        A socket shared with a group (socket_mode 0660) needs no group-writable directory."""
        run, state = os.path.join(short_dir, "run"), os.path.join(short_dir, "state")
        os.mkdir(run, 0o755)
        os.chmod(run, 0o755)
        os.mkdir(state, 0o700)
        config = daemon_config(short_dir, socket=os.path.join(run, "s.sock"),
                               db=os.path.join(state, "s.db"), socket_mode=0o660)
        async with running_daemon(config), AsyncClient(config.socket) as client:
            assert (await client.ping()).pong is True
            assert stat.S_IMODE(os.stat(config.socket or "").st_mode) == 0o660

    def test_what_the_daemon_creates_is_private_whatever_the_umask(self, tmp_path: Path) -> None:
        """Under umask 0, directories it makes are 0700; the database, its -wal and -shm,
        and the lock file are 0600."""
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            run, state = os.path.join(base, "r", "un"), os.path.join(base, "st", "ate")
            sock, db = os.path.join(run, "s.sock"), os.path.join(state, "s.db")
            proc = start_daemon("--socket", sock, "--db", db, log=tmp_path / "log", umask=0)
            try:
                wait_for_daemon(sock, proc)
                with Client(sock) as client:
                    client.create_session("private")
                for directory in (run, os.path.dirname(run), state, os.path.dirname(state)):
                    assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700, directory
                for name in (db, db + "-wal", db + "-shm", db + ".lock"):
                    assert stat.S_IMODE(os.stat(name).st_mode) == 0o600, name
                assert stat.S_IMODE(os.stat(sock).st_mode) == 0o600
            finally:
                assert stop(proc) == 0


# --- 7. one database, one daemon ---------------------------------------------------------

class TestOneDaemonPerDatabase:
    def test_second_daemon_on_the_same_database_exits_75_naming_the_pid(
            self, tmp_path: Path) -> None:
        """Another socket, the same database: the second daemon exits 75, names the
        first one's pid and never touches the socket it was given."""
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            db = os.path.join(base, "s.db")
            first = start_daemon("--socket", os.path.join(base, "a.sock"), "--db", db,
                                 log=tmp_path / "a.log")
            try:
                wait_for_daemon(os.path.join(base, "a.sock"), first)
                second = run_daemon("--socket", os.path.join(base, "b.sock"), "--db", db)
                assert second.returncode == 75, second.stderr
                assert f"pid {first.pid}" in second.stderr and db in second.stderr
                assert not os.path.exists(os.path.join(base, "b.sock"))
                with Client(os.path.join(base, "a.sock")) as client:
                    client.create_session("still-mine")
            finally:
                assert stop(first) == 0
            # Once the first has stopped, the lock is free again.
            again = start_daemon("--socket", os.path.join(base, "b.sock"), "--db", db,
                                 log=tmp_path / "b.log")
            try:
                wait_for_daemon(os.path.join(base, "b.sock"), again)
                with Client(os.path.join(base, "b.sock")) as client:
                    assert client.get_session("still-mine").session_id == "still-mine"
            finally:
                assert stop(again) == 0

    @pytest.mark.parametrize("how", ["deleted", "replaced"])
    def test_database_file_gone_under_the_daemon_stops_acknowledging(
            self, how: str, tmp_path: Path) -> None:
        """The file deleted, or replaced by another: the next write is -32012 saying
        why, in the error and in the log, and so is every write after it."""
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            sock, db = os.path.join(base, "s.sock"), os.path.join(base, "s.db")
            proc = start_daemon("--socket", sock, "--db", db, log=tmp_path / "log")
            try:
                wait_for_daemon(sock, proc)
                with Client(sock) as client:
                    client.create_session("before")
                    if how == "deleted":
                        os.unlink(db)
                    else:
                        os.rename(db, db + ".aside")
                        with open(db + ".aside", "rb") as src, open(db, "wb") as dst:
                            dst.write(src.read())
                    for attempt in ("after", "again"):
                        with pytest.raises(StorageError) as caught:
                            client.create_session(attempt)
                        assert caught.value.code == -32012
                        assert caught.value.data["path"] == db
                        assert how in caught.value.data["detail"]
                        assert db in caught.value.message
                    assert client.ping().pong is True  # it serves on; it only stops writing
            finally:
                assert stop(proc) == 0
            log = (tmp_path / "log").read_text()
            assert "store.database_file_lost" in log and how in log


# --- 8. settings and limits --------------------------------------------------------------

class TestSettingsBounds:
    @pytest.mark.parametrize("flag", [
        ["--max-connections", "0"], ["--max-inflight", "0"], ["--max-request-bytes", "-1"],
        ["--max-db-bytes", "-5"], ["--socket-mode", "1777"], ["--drain-timeout-s", "-1"],
        ["--kill-grace-s", "nan"], ["--cleanup-every-s", "inf"], ["--snapshot-every", "0"],
    ])
    def test_out_of_range_settings_exit_78_naming_them(self, flag: list[str]) -> None:
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            result = run_daemon("--socket", os.path.join(base, "s.sock"),
                                "--db", os.path.join(base, "s.db"), *flag)
            assert not os.path.exists(os.path.join(base, "s.db"))
        assert result.returncode == 78, result.stderr
        assert flag[0][2:].replace("-", "_") in result.stderr

    def test_out_of_range_on_reload_keeps_the_running_config(self, tmp_path: Path) -> None:
        """SIGHUP with max_connections = 0: logged, and the old limit still serves."""
        conf = tmp_path / "sessiond.toml"
        conf.write_text("max_connections = 8\n")
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            sock = os.path.join(base, "s.sock")
            proc = start_daemon("--config", str(conf), "--socket", sock,
                                "--db", os.path.join(base, "s.db"), log=tmp_path / "log")
            try:
                wait_for_daemon(sock, proc)
                conf.write_text("max_connections = 0\n")
                proc.send_signal(signal.SIGHUP)
                wait_until(lambda: "config.reload_failed" in (tmp_path / "log").read_text(),
                           "the reload to be refused")
                with Client(sock) as client:
                    assert client.ping().pong is True
            finally:
                assert stop(proc) == 0
        log = (tmp_path / "log").read_text()
        assert "max_connections" in log and "config.reloaded" not in log

    async def test_max_db_bytes_counts_the_wal(self, short_dir: str) -> None:
        """Filled to the cap, the database and its WAL together stay within max_db_bytes,
        and daemon.stats' db_bytes reports both."""
        cap = 512 * 1024
        config = daemon_config(short_dir, max_db_bytes=cap)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await client.create_session("fill")
            with pytest.raises(StorageError):
                for i in range(10_000):
                    await client.append_message("fill", "user", f"{i}" + "x" * 4000)
            on_disk = sum(os.path.getsize(d.db + s) for s in ("", "-wal")
                          if os.path.exists(d.db + s))
            assert on_disk <= cap
            assert (await client.stats()).db_bytes == on_disk


# --- 9. no daemon there ------------------------------------------------------------------

class TestNoDaemon:
    def test_sync_client_names_the_socket(self, short_dir: str) -> None:
        """No file, or a stale socket nobody answers: a sessiond error naming the path,
        which is also an OSError for code that caught the bare one."""
        missing = os.path.join(short_dir, "missing.sock")
        with pytest.raises(DaemonUnavailableError) as caught:
            Client(missing).ping()
        assert isinstance(caught.value, SessiondError) and isinstance(caught.value, OSError)
        assert missing in caught.value.message and caught.value.data["socket"] == missing
        stale = os.path.join(short_dir, "stale.sock")
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        s.bind(stale)
        s.close()
        with pytest.raises(DaemonUnavailableError, match=stale):
            Client(stale).ping()

    async def test_async_client_names_the_socket(self, short_dir: str) -> None:
        missing = os.path.join(short_dir, "missing.sock")
        with pytest.raises(DaemonUnavailableError, match=missing):
            async with AsyncClient(missing):
                pass

    def test_under_trio_too(self, short_dir: str) -> None:
        missing = os.path.join(short_dir, "missing.sock")
        result = subprocess.run([sys.executable, "-c", TRIO_PING, missing], capture_output=True,
                                text=True, timeout=120, check=False)
        assert result.stdout.strip() == f"DaemonUnavailableError {missing}", result.stderr

    async def test_subscription_gives_up_with_it(self, short_dir: str) -> None:
        missing = os.path.join(short_dir, "missing.sock")
        with pytest.raises(DaemonUnavailableError, match=missing):
            async with AsyncClient(missing).subscribe(retry_for=0) as events:
                async for _ in events:
                    pass

    def test_blocking_follow_gives_up_with_it(self, short_dir: str) -> None:
        missing = os.path.join(short_dir, "missing.sock")
        with pytest.raises(DaemonUnavailableError, match=missing):
            next(Client(missing).subscribe(retry_for=0))

    async def test_after_a_daemon_stops(self, short_dir: str) -> None:
        config = daemon_config(short_dir)
        async with running_daemon(config):
            pass
        with pytest.raises(DaemonUnavailableError, match=config.socket or ""):
            Client(config.socket).ping()
