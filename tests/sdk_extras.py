"""Tests of the SDK integrations skip when the SDK is not installed, except in CI.

.ci/run installs every extra and sets SESSIOND_REQUIRE_SDKS=1, so there a missing SDK fails
the run instead of skipping its tests.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require_sdk(module: str, extra: str) -> ModuleType:
    if os.environ.get("SESSIOND_REQUIRE_SDKS"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"pip install -e '.[{extra}]' to test it")


class Workers:
    """Real worker processes (tests/sdk_workers.py), driven a command at a time or all at once."""

    def __init__(self, *argv_each: list[str]) -> None:
        import subprocess
        import sys
        from pathlib import Path

        script = str(Path(__file__).with_name("sdk_workers.py"))
        self.procs = [subprocess.Popen([sys.executable, script, *argv], stdin=subprocess.PIPE,
                                       stdout=subprocess.PIPE, text=True) for argv in argv_each]

    def ask(self, i: int, command: str) -> object:
        """Send one worker a command and wait for its answer (blocking: call from a thread)."""
        import json

        proc = self.procs[i]
        assert proc.stdin is not None and proc.stdout is not None
        proc.stdin.write(command + "\n")
        proc.stdin.flush()
        line = proc.stdout.readline()
        assert line, f"worker {i} died on {command!r} (exit {proc.wait()})"
        return json.loads(line)

    def all(self, command: str) -> list[object]:
        """Send every worker the command at once, then collect their answers."""
        import json

        for proc in self.procs:
            assert proc.stdin is not None
            proc.stdin.write(command + "\n")
            proc.stdin.flush()
        answers = []
        for i, proc in enumerate(self.procs):
            assert proc.stdout is not None
            line = proc.stdout.readline()
            assert line, f"worker {i} died on {command!r} (exit {proc.wait()})"
            answers.append(json.loads(line))
        return answers

    def close(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                assert proc.stdin is not None
                proc.stdin.write("exit\n")
                proc.stdin.close()
        for proc in self.procs:
            code = proc.wait(timeout=60)
            assert proc.stdout is not None
            proc.stdout.close()
            if code != 0:
                raise AssertionError(f"worker exited {code}")
