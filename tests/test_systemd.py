"""systemd integration: socket activation, sd_notify, the watchdog, SIGHUP reloads, fd
limits, units."""

from __future__ import annotations

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
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import daemon_config, wait_for_daemon, wait_until

from sessiond import AsyncClient, Client
from sessiond_daemon.serve import lifecycle
from sessiond_daemon.serve.systemd import Notifier, Watchdog

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
    """What systemd listens on: a datagram socket; records each message, in arrival order."""

    def __init__(self, directory: str, abstract: bool) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        if abstract:
            name = f"sessiond-test-{uuid.uuid4().hex}"
            self.sock.bind("\0" + name)
            self.address = "@" + name
        else:
            self.address = os.path.join(directory, "notify.sock")
            self.sock.bind(self.address)
        self.messages: list[dict[str, str]] = []

    def wait_for(self, key: str, value: str | None = None, *, containing: str = "",
                 after: int = -1, timeout: float = 60) -> int:
        """Receive until a message later than index `after` sets `key` (to `value`, if
        given; to a text holding `containing`); return that message's index."""
        def match(msg: dict[str, str]) -> bool:
            return key in msg and (value is None or msg[key] == value) \
                and containing in msg[key]

        deadline = time.monotonic() + timeout
        seen = after + 1
        while True:
            for i in range(seen, len(self.messages)):
                if match(self.messages[i]):
                    return i
            seen = len(self.messages)
            remaining = deadline - time.monotonic()
            assert remaining > 0, f"no {key}={value or containing} from the daemon: {self.messages}"
            self.receive(remaining)

    def receive(self, timeout: float) -> None:
        self.sock.settimeout(timeout)
        try:
            data = self.sock.recv(4096)
        except TimeoutError:
            return
        self.messages.append(dict(line.split("=", 1) for line in data.decode().splitlines()
                                  if "=" in line))

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
        found = con.execute("SELECT count(*) FROM sqlite_master WHERE name = 'events'")
        return bool(found.fetchone()[0])
    finally:
        con.close()


class TestSocketActivation:
    def test_serves_the_inherited_socket_and_tells_systemd(self, short_dir: str,
                                                            notify: NotifySocket) -> None:
        """With fd 3 and NOTIFY_SOCKET: READY=1 once it answers, WATCHDOG=1 again and
        again (its pace is TestWatchdog's), STATUS= lines, STOPPING=1."""
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
            ready = notify.messages[notify.wait_for("READY", "1")]
            # READY comes only once the database is open and requests are answered.
            assert has_schema(db)
            with Client(path, timeout=5) as client:
                assert client.ping().pong is True
            assert ready["MAINPID"] == str(proc.pid)
            assert "serving on " + path in ready["STATUS"]
            # The real thing end to end: pings keep coming (each 1 s, half WATCHDOG_USEC).
            first = notify.wait_for("WATCHDOG", "1")
            notify.wait_for("WATCHDOG", "1", after=first)
            notify.wait_for("STATUS", containing=" connections, ")
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
            wait_for_daemon(os.path.join(short_dir, "ours.sock"), proc)
            with Client(os.path.join(short_dir, "ours.sock")) as client:
                assert client.ping().pong is True
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


class FakeClock:
    """Monotonic seconds that move only when the test says."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


class TestWatchdog:
    def test_the_interval_is_half_of_systemds_timeout(self) -> None:
        """sd_watchdog_enabled(3): ping at half WATCHDOG_USEC; none without it."""
        assert Notifier("/run/notify", 2_000_000).watchdog_interval == 1.0
        assert Notifier("/run/notify").watchdog_interval is None
        env = {"NOTIFY_SOCKET": "/run/notify", "WATCHDOG_USEC": "3000000",
               "WATCHDOG_PID": str(os.getpid() + 1)}
        assert Notifier.from_environment(env).watchdog_interval is None  # another process's
        assert env == {}

    def test_pings_each_interval_and_none_while_the_writer_is_stuck(self) -> None:
        """Beats each quarter interval on a driven clock: a ping each interval; none once the
        writer has been stuck on one batch for the whole timeout (two intervals), until it
        moves; then one at once."""
        clock = FakeClock()
        dog = Watchdog(1.0, clock)
        pings: list[float] = []
        stuck: list[float] = []
        stuck_since: float | None = None

        def beat_until(t: float) -> None:
            while clock.now - 1000.0 < t:
                stalled = 0.0 if stuck_since is None else clock.now - stuck_since
                if dog.beat(stalled):
                    pings.append(clock.now - 1000.0)
                if dog.stuck:
                    stuck.append(clock.now - 1000.0)
                clock.now += 0.25

        beat_until(3.0)
        stuck_since = clock.now  # a commit hangs at t=3
        beat_until(8.0)
        stuck_since = None  # and returns at t=8
        beat_until(10.0)
        assert pings == [0.0, 1.0, 2.0, 3.0, 4.0, 8.0, 9.0]
        assert stuck == [5.0, 5.25, 5.5, 5.75, 6.0, 6.25, 6.5, 6.75, 7.0, 7.25, 7.5, 7.75]

    @pytest.mark.anyio
    async def test_a_daemon_whose_writer_is_stuck_withholds_pings(self, short_dir: str) -> None:
        """End to end: a commit that hangs is seen by the heartbeat (STATUS says so) and no
        WATCHDOG=1 goes out while the writer is stuck; pings resume once it moves."""
        notify = NotifySocket(short_dir, abstract=False)
        timeout_s = 0.4
        daemon = lifecycle.Daemon(daemon_config(short_dir),
                                  notifier=Notifier(notify.address, int(timeout_s * 1e6)))
        release, entered, written = anyio.Event(), anyio.Event(), anyio.Event()
        try:
            async with anyio.create_task_group() as tg:
                shutdown = anyio.Event()
                path = await tg.start(daemon.run, shutdown)
                assert daemon.writer is not None
                commit = daemon.writer.store.commit

                async def stuck_commit(batch: Any) -> None:
                    entered.set()
                    await release.wait()
                    await commit(batch)

                daemon.writer.store.commit = stuck_commit  # type: ignore[method-assign]

                async def write() -> None:
                    async with AsyncClient(path) as c:
                        await c.create_session(session_id="w")
                    written.set()

                tg.start_soon(write)
                await entered.wait()
                # Stuck for the whole timeout: said so; then, still stuck, stall figures
                # go by (a STATUS line each whole second) with no ping between them.
                stuck = await anyio.to_thread.run_sync(
                    lambda: notify.wait_for("STATUS", containing="writer stuck for "))
                later = await anyio.to_thread.run_sync(
                    lambda: notify.wait_for("STATUS", containing="writer stuck for 2 s"))
                release.set()
                await written.wait()
                resumed = await anyio.to_thread.run_sync(
                    lambda: notify.wait_for("WATCHDOG", "1", after=later))
                status = await anyio.to_thread.run_sync(
                    lambda: notify.wait_for("STATUS", after=resumed))
                shutdown.set()
        finally:
            notify.close()
        pings = [i for i, m in enumerate(notify.messages) if "WATCHDOG" in m]
        assert pings[0] < stuck, notify.messages  # it did ping before
        assert [i for i in pings if stuck < i < later] == [], notify.messages
        assert resumed > later
        # The ping that resumes comes with a STATUS line that no longer says stuck.
        assert status == resumed + 1, notify.messages
        assert "writer stuck" not in notify.messages[status]["STATUS"], notify.messages


class TestReload:
    def test_sighup_changes_log_level_and_limits_without_dropping_connections(
            self, short_dir: str, tmp_path: Path) -> None:
        """SIGHUP re-reads the file: new log level and limits apply, open connections stay."""
        conf = tmp_path / "sessiond.toml"
        conf.write_text('log_level = "warning"\nmax_message_bytes = 1000\n')
        sock, db = os.path.join(short_dir, "r.sock"), os.path.join(short_dir, "r.db")
        with open(tmp_path / "stderr", "wb") as log:  # the daemon keeps its own descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "sessiond_daemon", "--config", str(conf), "--socket",
                 sock, "--db", db, "--log-format", "json"], stderr=log)
        try:
            wait_for_daemon(sock, proc)
            client = Client(sock, timeout=10)
            client.create_session(session_id="r")
            with pytest.raises(Exception, match="message content"):
                client.append_message("r", "user", "x" * 2000)
            conf.write_text('log_level = "debug"\nmax_message_bytes = 5000\n'
                            'durability = "normal"\n')
            proc.send_signal(signal.SIGHUP)
            text = wait_for_log(tmp_path / "stderr", "config.reloaded")
            reloaded = next(line for line in text.splitlines() if "config.reloaded" in line)
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


class TestDescriptors:
    def test_running_out_of_descriptors_is_quiet_and_recovers(self, short_dir: str,
                                                              tmp_path: Path) -> None:
        """Past the fd limit, clients wait in the accept queue; one log line, not a flood."""
        sock, db = os.path.join(short_dir, "fd.sock"), os.path.join(short_dir, "fd.db")
        limit = 48

        def low_limit() -> None:
            resource.setrlimit(resource.RLIMIT_NOFILE, (limit, limit))

        with open(tmp_path / "stderr", "wb") as log:  # the daemon keeps its own descriptor
            proc = subprocess.Popen(
                [sys.executable, "-m", "sessiond_daemon", "--socket", sock, "--db", db,
                 "--log-format", "json"], stderr=log, preexec_fn=low_limit)
        held: list[socket.socket] = []
        try:
            wait_for_daemon(sock, proc)
            for _ in range(limit + 20):
                s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                s.connect(sock)
                held.append(s)
            wait_for_log(tmp_path / "stderr", "rpc.accept_failing")
            # Idle while every accept fails: what is under test is that ~15 failed accepts
            # at the back-off pace log nothing more (counted below). No event to wait on.
            time.sleep(1.5)
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
        out = subprocess.run(args, cwd=tmp_path, capture_output=True, text=True, env=env,
                             timeout=60)
        assert out.stdout + out.stderr == "", out.stdout + out.stderr

    def test_follow_unit_verifies_clean(self, tmp_path: Path) -> None:
        """The transcript follower's template, as the instances the docs enable."""
        tool = systemd_tool("systemd-analyze")
        for name in ("sessiond-follow@.service", "sessiond.socket"):
            text = (UNITS / "user" / name).read_text()
            sessionctl = os.path.join(os.path.dirname(installed_sessiond()), "sessionctl")
            text = re.sub(r"^ExecStart=\S+", f"ExecStart={sessionctl}", text, flags=re.M)
            (tmp_path / name).write_text(text)
        for instance in ("claude-code", "codex"):
            out = subprocess.run(
                [tool, "--user", "verify", "--man=no", f"sessiond-follow@{instance}.service"],
                cwd=tmp_path, capture_output=True, text=True, timeout=60,
                env=dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path)))
            assert out.stdout + out.stderr == "", out.stdout + out.stderr
        unit = (UNITS / "user" / "sessiond-follow@.service").read_text()
        assert re.search(r"^ExecStart=\S+/sessionctl import --format %i --follow$", unit, re.M)

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
        """SocketMode=0600 explicitly, and the socket outside any RuntimeDirectory that a
        stop removes."""
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


def wait_for_log(path: Path, needle: str) -> str:
    return wait_until(lambda: text if needle in (text := path.read_text()) else None,
                      f"{needle} in the log {path}")
