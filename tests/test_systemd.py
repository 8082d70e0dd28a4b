"""systemd integration: socket activation, sd_notify, the watchdog, SIGHUP reloads, fd limits, units."""

from __future__ import annotations

import itertools
import os
import re
import resource
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import daemon_config

from sessiond import AsyncClient, Client
from sessiond_daemon import lifecycle
from sessiond_daemon.systemd import Notifier

ROOT = Path(__file__).resolve().parent.parent
UNITS = ROOT / "systemd"

# Starts the daemon the way systemd does: the listening socket as fd 3, LISTEN_PID = its pid.
LAUNCH = """\
import os, sys
os.dup2(int(sys.argv[1]), 3)
os.environ.update(LISTEN_FDS="1", LISTEN_PID=str(os.getpid()), LISTEN_FDNAMES="sessiond")
os.execv(sys.executable, [sys.executable, "-m", "sessiond_daemon", *sys.argv[2:]])
"""


def systemd_tool(name: str) -> str:
    """Path of a tool from Debian's systemd package; .ci/run installs it, so CI never skips."""
    path = shutil.which(name)
    if path is None:
        if os.environ.get("SESSIOND_REQUIRE_SYSTEMD_TOOLS"):
            pytest.fail(f"{name} is missing; .ci/run should have installed Debian's systemd")
        pytest.skip(f"{name} is not installed (apt-get install systemd)")
    return path


class NotifySocket:
    """What systemd listens on: a datagram socket; records each message with its arrival time."""

    def __init__(self, directory: str, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"sessiond-test-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            self.address = os.path.join(directory, "notify.sock")
            self.sock.bind(self.address)
        self.messages: list[tuple[float, dict[str, str]]] = []

    def wait_for(self, key: str, value: str | None = None, timeout: float = 30) -> dict[str, str]:
        """Receive until a message sets `key` (to `value`, if given); return that message."""
        deadline = time.monotonic() + timeout
        while True:
            for _, msg in self.messages:
                if key in msg and (value is None or msg[key] == value):
                    return msg
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {key} from the daemon; got {self.messages}"
            self.receive(remaining)
            if self.messages and key in self.messages[-1][1] and (
                    value is None or self.messages[-1][1][key] == value):
                return self.messages[-1][1]

    def receive(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return
        msg = dict(line.split("=", 1) for line in data.decode().splitlines() if "=" in line)
        self.messages.append((time.monotonic(), msg))

    def collect(self, seconds: float) -> None:
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            self.receive(left)

    def times_of(self, key: str) -> list[float]:
        return [t for t, msg in self.messages if key in msg]

    def close(self) -> None:
        self.sock.close()


@pytest.fixture
def notify(short_dir: str) -> Iterator[NotifySocket]:
    n = NotifySocket(short_dir, abstract=True)
    yield n
    n.close()


def stop(proc: subprocess.Popen[Any]) -> int:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        raise


def has_schema(db: str) -> bool:
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        return bool(con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'events'").fetchone()[0])
    finally:
        con.close()


class TestSocketActivation:
    def test_serves_the_inherited_socket_and_tells_systemd(self, short_dir: str,
                                                            notify: NotifySocket) -> None:
        """With fd 3 and NOTIFY_SOCKET: READY=1 once it answers, WATCHDOG=1 each half timeout, STOPPING=1."""
        path, db = os.path.join(short_dir, "act.sock"), os.path.join(short_dir, "act.db")
        own = os.path.join(short_dir, "never.sock")
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen()
        env = dict(os.environ, NOTIFY_SOCKET=notify.address, WATCHDOG_USEC="2000000",
                   SESSIOND_SOCKET=own)
        proc = subprocess.Popen(
            [sys.executable, "-c", LAUNCH, str(listener.fileno()), "--db", db,
             "--log-level", "warning"],
            pass_fds=(listener.fileno(),), env=env)
        listener.close()
        try:
            ready = notify.wait_for("READY", "1")
            # READY comes only once the database is open and requests are answered.
            assert has_schema(db)
            with Client(path, timeout=5) as client:
                assert client.ping().pong is True
            assert ready["MAINPID"] == str(proc.pid)
            assert "serving on " + path in ready["STATUS"]
            notify.collect(4.5)
            pings = notify.times_of("WATCHDOG")
            # systemd restarts us if a ping is later than WATCHDOG_USEC (2 s); we ping each 1 s.
            assert 3 <= len(pings) <= 7, pings
            assert all(b - a < 2.0 for a, b in itertools.pairwise(pings)), pings
            assert any("connections" in m.get("STATUS", "") for _, m in notify.messages)
            proc.send_signal(signal.SIGTERM)
            notify.wait_for("STOPPING", "1")
            assert proc.wait(timeout=30) == 0
        finally:
            stop(proc)
        # The socket belongs to the socket unit: stopping leaves it; our own path never appears.
        assert os.path.exists(path)
        assert not os.path.exists(own)

    def test_systemd_socket_activate_starts_the_daemon(self, short_dir: str) -> None:
        """systemd-socket-activate holds the socket and execs the daemon on the first client."""
        tool = systemd_tool("systemd-socket-activate")
        path, db = os.path.join(short_dir, "sa.sock"), os.path.join(short_dir, "sa.db")
        notify = NotifySocket(short_dir, abstract=False)
        proc = subprocess.Popen(
            [tool, "-l", path, "--fdname=sessiond", "-E", f"NOTIFY_SOCKET={notify.address}",
             sys.executable, "-m", "sessiond_daemon", "--db", db, "--log-level", "warning"],
            stderr=subprocess.DEVNULL)
        try:
            wait_until(lambda: os.path.exists(path) or proc.poll() is not None, "the socket")
            assert proc.poll() is None
            with Client(path, timeout=30) as client:  # this connection starts the daemon
                session = client.create_session(session_id="activated")
                assert session.session_id == "activated"
            notify.wait_for("READY", "1")
            assert stop(proc) == 0
            assert os.path.exists(path)
        finally:
            stop(proc)
            notify.close()
        con = sqlite3.connect(db)
        assert con.execute("SELECT session_id FROM sessions").fetchall() == [("activated",)]
        con.close()

    def test_the_descriptor_named_sessiond_is_chosen(self, short_dir: str) -> None:
        """With several descriptors, LISTEN_FDNAMES picks ours; the others are closed."""
        decoy, ours = (socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) for _ in range(2))
        decoy.bind(os.path.join(short_dir, "decoy.sock"))
        ours.bind(os.path.join(short_dir, "ours.sock"))
        for s in (decoy, ours):
            s.listen()
        launch = ("import os, sys\n"
                  "os.dup2(int(sys.argv[1]), 3); os.dup2(int(sys.argv[2]), 4)\n"
                  "os.environ.update(LISTEN_FDS='2', LISTEN_PID=str(os.getpid()),"
                  " LISTEN_FDNAMES='metrics:sessiond')\n"
                  "os.execv(sys.executable, [sys.executable, '-m', 'sessiond_daemon',"
                  " *sys.argv[3:]])\n")
        proc = subprocess.Popen(
            [sys.executable, "-c", launch, str(decoy.fileno()), str(ours.fileno()),
             "--db", os.path.join(short_dir, "n.db"), "--log-level", "error"],
            pass_fds=(decoy.fileno(), ours.fileno()))
        try:
            client = wait_for_daemon(os.path.join(short_dir, "ours.sock"), proc)
            assert client.ping().pong is True
            client.close()
        finally:
            stop(proc)
            decoy.close()
            ours.close()

    def test_a_non_socket_descriptor_is_a_configuration_error(self, short_dir: str) -> None:
        """A LISTEN_FDS descriptor that is not a listening Unix socket: exit 78, clear message."""
        with open(os.path.join(short_dir, "file"), "w") as f:
            proc = subprocess.run(
                [sys.executable, "-c", LAUNCH, str(f.fileno()), "--db",
                 os.path.join(short_dir, "x.db")],
                pass_fds=(f.fileno(),), capture_output=True, timeout=60)
        assert proc.returncode == 78
        assert b"not a listening Unix stream socket" in proc.stderr


@pytest.mark.anyio
class TestWatchdog:
    async def test_pings_stop_while_the_writer_is_stuck(self, short_dir: str) -> None:
        """A writer stuck on one batch for a whole watchdog timeout: no WATCHDOG=1 until it moves."""
        notify = NotifySocket(short_dir, abstract=False)
        timeout_s = 0.4
        daemon = lifecycle.Daemon(daemon_config(short_dir),
                                  notifier=Notifier(notify.address, int(timeout_s * 1e6)))
        release, entered = anyio.Event(), anyio.Event()
        stuck_at: list[float] = []
        try:
            async with anyio.create_task_group() as tg:
                shutdown = anyio.Event()
                path = await tg.start(daemon.run, shutdown)
                assert daemon.writer is not None
                commit = daemon.writer.store.commit

                async def stuck_commit(batch: Any) -> None:
                    stuck_at.append(time.monotonic())
                    entered.set()
                    await release.wait()
                    await commit(batch)

                daemon.writer.store.commit = stuck_commit  # type: ignore[method-assign]

                async def write() -> None:
                    async with AsyncClient(path) as c:
                        await c.create_session(session_id="w")

                tg.start_soon(write)
                await entered.wait()
                await anyio.to_thread.run_sync(notify.collect, 5 * timeout_s)
                released_at = time.monotonic()
                release.set()
                await anyio.to_thread.run_sync(notify.collect, 3 * timeout_s)
                shutdown.set()
        finally:
            notify.close()
        pings = notify.times_of("WATCHDOG")
        # Once stuck for the whole timeout (plus one tick of the heartbeat), pings stop...
        silent_from = stuck_at[0] + timeout_s + timeout_s / 2
        assert [t for t in pings if silent_from < t < released_at] == [], (stuck_at, released_at, pings)
        assert any("writer stuck" in m.get("STATUS", "") for _, m in notify.messages)
        # ...and resume once the writer moves again.
        assert any(t > released_at for t in pings), pings
        assert any(t < silent_from for t in pings), pings  # it did ping before


class TestReload:
    def test_sighup_changes_log_level_and_limits_without_dropping_connections(
            self, short_dir: str, tmp_path: Path) -> None:
        """SIGHUP re-reads the file: new log level and limits apply, open connections stay."""
        conf = tmp_path / "sessiond.toml"
        conf.write_text('log_level = "warning"\nmax_message_bytes = 1000\n')
        sock, db = os.path.join(short_dir, "r.sock"), os.path.join(short_dir, "r.db")
        log = open(tmp_path / "stderr", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessiond_daemon", "--config", str(conf), "--socket", sock,
             "--db", db, "--log-format", "json"], stderr=log)
        try:
            client = wait_for_daemon(sock, proc)
            client.create_session(session_id="r")
            with pytest.raises(Exception, match="message content"):
                client.append_message("r", "user", "x" * 2000)
            conf.write_text('log_level = "debug"\nmax_message_bytes = 5000\ndurability = "normal"\n')
            proc.send_signal(signal.SIGHUP)
            text = wait_for_log(tmp_path / "stderr", "config.reloaded")
            reloaded = [line for line in text.splitlines() if "config.reloaded" in line][0]
            assert '"log_level":["warning","debug"]' in reloaded
            assert '"max_message_bytes":[1000,5000]' in reloaded
            assert '"needs_restart":["durability"]' in reloaded
            # The connection opened before the reload still works, under the new limit.
            client.append_message("r", "user", "x" * 2000)
            with Client(sock, timeout=10) as other:
                other.ping()
            assert '"rpc.connected"' in wait_for_log(tmp_path / "stderr", "rpc.connected")
            # A broken file on reload: said so, the running settings stay.
            conf.write_text("log_level = [")
            proc.send_signal(signal.SIGHUP)
            wait_for_log(tmp_path / "stderr", "config.reload_failed")
            assert client.ping().pong is True
            client.close()
            assert stop(proc) == 0
        finally:
            stop(proc)
            log.close()


class TestDescriptors:
    def test_running_out_of_descriptors_is_quiet_and_recovers(self, short_dir: str,
                                                              tmp_path: Path) -> None:
        """Past the fd limit, clients wait in the accept queue; one log line, not a flood."""
        sock, db = os.path.join(short_dir, "fd.sock"), os.path.join(short_dir, "fd.db")
        limit = 48

        def low_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        log = open(tmp_path / "stderr", "wb")
        proc = subprocess.Popen(
            [sys.executable, "-m", "sessiond_daemon", "--socket", sock, "--db", db,
             "--log-format", "json"], stderr=log, preexec_fn=low_limit)
        held: list[socket.socket] = []
        try:
            wait_for_daemon(sock, proc).close()
            for _ in range(limit + 20):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(sock)
                held.append(s)
            wait_for_log(tmp_path / "stderr", "rpc.accept_failing")
            time.sleep(1.5)  # ~15 failed accepts at the back-off pace
            for s in held:
                s.close()
            held.clear()
            with Client(sock, timeout=30) as client:
                assert client.ping().pong is True
            text = wait_for_log(tmp_path / "stderr", "rpc.accept_resumed")
            assert text.count("rpc.accept_failing") == 1, text
            assert "daemon.fd_limit_low" in text
            assert len(text.splitlines()) < 15, text
            assert stop(proc) == 0
        finally:
            for s in held:
                s.close()
            stop(proc)
            log.close()


class TestUnits:
    @pytest.mark.parametrize("variant", ["system", "user"])
    def test_units_verify_clean(self, variant: str, tmp_path: Path) -> None:
        """systemd-analyze verify prints nothing (its exit code passes warnings) for each unit."""
        tool = systemd_tool("systemd-analyze")
        source = UNITS if variant == "system" else UNITS / "user"
        for name in ("sessiond.service", "sessiond.socket"):
            text = (source / name).read_text()
            # ExecStart must name an existing program: point it at this install's.
            text = re.sub(r"^ExecStart=\S+", f"ExecStart={installed_sessiond()}", text, flags=re.M)
            (tmp_path / name).write_text(text)
        dropin = tmp_path / "sessiond.service.d"
        dropin.mkdir()
        shutil.copy(UNITS / "sessiond-executors.conf", dropin / "executors.conf")
        args = [tool] + (["--user"] if variant == "user" else []) + [
            "verify", "--man=no", "sessiond.service", "sessiond.socket"]
        env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path))
        out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=env, timeout=60)
        assert out.stdout + out.stderr == "", out.stdout + out.stderr

    def test_system_service_exposure_is_at_most_2(self) -> None:
        """systemd-analyze security --offline rates the system unit 2.0 or lower."""
        tool = systemd_tool("systemd-analyze")
        out = subprocess.run([tool, "security", "--offline=yes", "--threshold=20",
                              str(UNITS / "sessiond.service")], capture_output=True, text=True,
                             timeout=60)
        assert out.returncode == 0, out.stdout[-2000:] + out.stderr
        score = float(re.search(r"Overall exposure level for \S+: ([\d.]+)", out.stdout)[1])
        assert score <= 2.0

    def test_socket_units_are_private_and_survive_a_stop(self) -> None:
        """SocketMode=0600 explicitly, and the socket outside any RuntimeDirectory that a stop removes."""
        for directory in (UNITS, UNITS / "user"):
            socket_unit = (directory / "sessiond.socket").read_text()
            service = (directory / "sessiond.service").read_text()
            assert re.search(r"^SocketMode=0600$", socket_unit, re.M)
            assert re.search(r"^FileDescriptorName=sessiond$", socket_unit, re.M)
            if re.search(r"^RuntimeDirectory=sessiond$", service, re.M):
                assert re.search(r"^RuntimeDirectoryPreserve=yes$", service, re.M)


def installed_sessiond() -> str:
    """This interpreter's `sessiond` entry point (the venv's, in CI), else the one on PATH."""
    beside = os.path.join(os.path.dirname(sys.executable), "sessiond")
    found = beside if os.access(beside, os.X_OK) else shutil.which("sessiond")
    assert found, "the sessiond entry point is not installed"
    return found


def wait_until(ready: Callable[[], Any], what: str, timeout: float = 30) -> Any:
    """Poll `ready` until it returns something true; fail naming `what` if it never does."""
    end = time.monotonic() + timeout
    while not (result := ready()):
        if time.monotonic() > end:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)
    return result


def wait_for_daemon(sock: str, proc: subprocess.Popen[Any]) -> Client:
    def answered() -> Client | None:
        assert proc.poll() is None, "the daemon exited"
        try:
            client = Client(sock, timeout=10)
            client.ping()
            return client
        except OSError:
            return None

    return wait_until(answered, "the daemon to answer")


def wait_for_log(path: Path, needle: str) -> str:
    return wait_until(lambda: text if needle in (text := path.read_text()) else None,
                      f"{needle} in the log {path}")
