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
    found: ModuleType = pytest.importorskip(module,
                                            reason=f"pip install -e '.[{extra}]' to test it")
    return found


class Workers:
    """Real worker processes (tests/sdk_workers.py), driven a command at a time or all at once.

    One process imports the SDK, then forks the others (each a process of its own, with
    its own store object and connection), so the slow SDK import is paid once.
    """

    def __init__(self, sdk: str, count: int, *args: str) -> None:
        import subprocess
        import sys
        from pathlib import Path

        script = str(Path(__file__).with_name("sdk_workers.py"))
        ours, theirs = [], []
        for _ in range(count):
            (cmd_r, cmd_w), (ans_r, ans_w) = os.pipe(), os.pipe()
            ours.append((os.fdopen(cmd_w, "w"), os.fdopen(ans_r)))
            theirs.append((cmd_r, ans_w))
        spec = ";".join(f"{r},{w}" for r, w in theirs)
        self.proc = subprocess.Popen([sys.executable, script, sdk, spec, *args],
                                     pass_fds=[fd for pair in theirs for fd in pair])
        for r, w in theirs:
            os.close(r)
            os.close(w)
        self.pipes = ours

    def _send(self, i: int, command: str) -> None:
        self.pipes[i][0].write(command + "\n")
        self.pipes[i][0].flush()

    def _receive(self, i: int, command: str) -> object:
        import json

        line = self.pipes[i][1].readline()
        assert line, f"worker {i} died on {command!r}"
        return json.loads(line)

    def ask(self, i: int, command: str) -> object:
        """Send one worker a command and wait for its answer (blocking: call from a thread)."""
        self._send(i, command)
        return self._receive(i, command)

    def all(self, command: str) -> list[object]:
        """Send every worker the command at once, then collect their answers."""
        for i in range(len(self.pipes)):
            self._send(i, command)
        return [self._receive(i, command) for i in range(len(self.pipes))]

    def close(self) -> None:
        for w, _r in self.pipes:
            try:
                w.write("exit\n")
                w.close()
            except BrokenPipeError:
                pass
        code = self.proc.wait(timeout=60)
        for _, r in self.pipes:
            r.close()
        if code != 0:
            raise AssertionError(f"a worker failed (exit {code})")


async def burst(sdk: str, socket: str, count: int, processes: int = 4) -> None:
    """`processes` real worker processes each write `count` items through `sdk`'s store
    at once (their `burst` command), and all report ok."""
    import anyio

    def drive() -> None:
        workers = Workers(sdk, processes, socket)
        try:
            assert workers.all(f"burst {count}") == ["ok"] * processes
        finally:
            workers.close()

    await anyio.to_thread.run_sync(drive)
