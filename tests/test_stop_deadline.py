"""SIGTERM ends the daemon in time whatever its writer is doing (docs/reliability.md):
a daemon process whose writer spins on the event loop, through the fault-injecting store."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import tempfile

import pytest
from conftest import wait_for_daemon, wait_until

from sessiond import Client, SessiondError

# The real entry point, with its store wrapped so that a commit of session "spin" never
# returns: a CPU loop on the event loop, where the writer decides and commits.
SPINNING_DAEMON = """
import sys
from faulty_store import FaultyStore
from sessiond_daemon import __main__ as entry
from sessiond_daemon.serve import lifecycle

def spin(batch, n):
    if any(e.session_id == "spin" for e in batch.events):
        while True:
            pass
    return None

class Spinning(lifecycle.Daemon):
    def __init__(self, config, **kw):
        def factory(config):
            store = FaultyStore(lifecycle.default_store(config))
            store.fail_commits(spin)
            return store
        super().__init__(config, store_factory=factory, **kw)

lifecycle.Daemon = Spinning
entry.main(sys.argv[1:])
"""

DRAIN_S, GRACE_S = 1.0, 0.5


def _tests_path() -> str:
    here = os.path.dirname(os.path.abspath(__file__))
    return os.pathsep.join([here, os.environ.get("PYTHONPATH", "")])


class TestStopDeadline:
    # The uvloop variant in the second run (marked fleet: a long suite).
    @pytest.mark.parametrize("loop", [pytest.param("uvloop", marks=pytest.mark.fleet),
                                      "asyncio"])
    def test_sigterm_ends_a_daemon_whose_writer_spins(self, loop: str) -> None:
        """The writer is stuck in a CPU loop inside a commit, so the event loop never
        turns again: SIGTERM still ends the process, at the deadline (exit 1, logged
        `daemon.stop_deadline_passed`), well before any patience runs out."""
        with tempfile.TemporaryDirectory(prefix="sd-") as base:
            sock, db = os.path.join(base, "s.sock"), os.path.join(base, "s.db")
            log_path = os.path.join(base, "log")
            with open(log_path, "wb") as log:
                proc = subprocess.Popen(
                    [sys.executable, "-c", SPINNING_DAEMON, "--socket", sock, "--db", db,
                     "--log-level", "info", "--log-format", "json",
                     "--drain-timeout-s", str(DRAIN_S), "--kill-grace-s", str(GRACE_S)],
                    stderr=log, start_new_session=True,
                    env={**os.environ, "PYTHONPATH": _tests_path(), "SESSIOND_LOOP": loop})
            try:
                wait_for_daemon(sock, proc)
                with Client(sock, timeout=5) as client:
                    client.create_session("fine")
                # The write that spins: its answer never comes.
                spinner = subprocess.Popen(
                    [sys.executable, "-c", "import sys; from sessiond import Client\n"
                     f"Client({sock!r}).create_session('spin')"],
                    stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                wait_until(lambda: _stuck(sock), "the event loop to be stuck")
                proc.send_signal(signal.SIGTERM)
                # The bound, generous: the deadline is drain_timeout_s + kill_grace_s + 5 s.
                code = proc.wait(timeout=60)
                spinner.kill()
                spinner.wait()
            finally:
                if proc.poll() is None:
                    proc.kill()
                    proc.wait()
            with open(log_path) as f:
                logged = f.read()
        assert code == 1, logged
        assert "daemon.stop_deadline_passed" in logged


def _stuck(sock: str) -> bool:
    """True once the daemon no longer answers a ping (its loop is in the spin)."""
    try:
        with Client(sock, timeout=0.5) as client:
            client.ping()
    except SessiondError:
        return True
    except OSError:
        return True
    return False
