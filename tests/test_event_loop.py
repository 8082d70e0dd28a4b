"""The daemon's event loop: uvloop on Linux when installed, `SESSIOND_LOOP=asyncio` for the
standard loop, anything else refused as a configuration error."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
from conftest import wait_for_daemon

from sessiond import Client
from sessiond_daemon.__main__ import EX_CONFIG, loop_options
from sessiond_daemon.serve.config import ConfigError

HAS_UVLOOP = sys.platform.startswith("linux") and importlib.util.find_spec("uvloop") is not None


def test_loop_options() -> None:
    assert loop_options({"SESSIOND_LOOP": "asyncio"}) == {}
    expected = {"use_uvloop": True} if HAS_UVLOOP else {}
    assert loop_options({}) == expected
    assert loop_options({"SESSIOND_LOOP": " UVLOOP "}) == expected
    with pytest.raises(ConfigError, match="SESSIOND_LOOP must be asyncio or uvloop"):
        loop_options({"SESSIOND_LOOP": "trio"})


def _mapped(pid: int, name: str) -> bool:
    with open(f"/proc/{pid}/maps") as f:
        return name in f.read()


@pytest.mark.skipif(not HAS_UVLOOP, reason="uvloop is used on Linux when installed")
@pytest.mark.parametrize("loop", ["uvloop", "asyncio"])
def test_daemon_runs_the_chosen_loop(short_dir: str, loop: str) -> None:
    """A real daemon serves on the loop asked for: uvloop's extension is loaded only then."""
    sock, db = os.path.join(short_dir, "d.sock"), os.path.join(short_dir, "d.db")
    env = {**os.environ, "SESSIOND_LOOP": loop}
    proc = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", sock,
                             "--db", db, "--log-level", "warning"], env=env)
    try:
        wait_for_daemon(sock, proc)
        with Client(sock) as c:
            sid = c.create_session().session_id
            c.append_message(sid, "user", "hello")
            assert c.get_session(sid).message_count == 1
        assert _mapped(proc.pid, "uvloop") == (loop == "uvloop")
    finally:
        proc.terminate()
        assert proc.wait(timeout=60) == 0


def test_a_bad_loop_is_a_config_error(short_dir: str) -> None:
    env = {**os.environ, "SESSIOND_LOOP": "trio"}
    done = subprocess.run([sys.executable, "-m", "sessiond_daemon", "--socket",
                           os.path.join(short_dir, "d.sock"), "--db",
                           os.path.join(short_dir, "d.db")], env=env, capture_output=True,
                          timeout=60, check=False)
    assert done.returncode == EX_CONFIG
    assert b"SESSIOND_LOOP must be asyncio or uvloop" in done.stderr
