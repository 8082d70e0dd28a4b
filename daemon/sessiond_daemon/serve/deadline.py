"""The last resort of a stop: the process ends once the drain has had its time, whatever
the event loop and the writer are doing (a CPU loop, a call that never returns).

Armed from the Python-level handler of SIGTERM/SIGINT, which the interpreter runs on the
main thread between bytecodes even while the event loop is stuck in a task (the loop
itself sees the signal only when it turns again). A thread then waits out the deadline,
logs `daemon.stop_deadline_passed` and calls `os._exit`; an `alarm(2)` a little later
ends the process through the kernel should even that thread never get the interpreter.
"""

from __future__ import annotations

import math
import os
import signal
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

import structlog

log = structlog.get_logger("sessiond.lifecycle")

MARGIN_S = 5.0  # past drain_timeout_s + kill_grace_s: the writer's flush, the store's close
BACKSTOP_S = 2.0  # past the deadline: SIGALRM's default action, if the thread cannot run
EXIT_CODE = 1  # as a forced exit on a second signal: the stop did not finish


class StopDeadline:
    """Ends the process `seconds()` after the first stop signal, unless it ended before."""

    def __init__(self, seconds: Callable[[], float]) -> None:
        self._seconds = seconds  # read at the signal: drain_timeout_s may be reloaded
        self._armed = threading.Event()

    def chain(self, *signums: signal.Signals) -> None:
        """Arm on `signums`, keeping the handler installed for them (the event loop's:
        call this after it installed its own), so the loop still sees each signal."""
        for signum in signums:
            previous = signal.getsignal(signum)

            def handler(num: int, frame: FrameType | None, previous: Any = previous) -> None:
                self.arm()
                if callable(previous):
                    previous(num, frame)

            signal.signal(signum, handler)

    def arm(self) -> None:
        """Start the countdown (once; later calls do nothing)."""
        if self._armed.is_set():
            return
        self._armed.set()
        seconds = self._seconds()
        if hasattr(signal, "alarm"):  # SIGALRM is left at its default: the process ends
            signal.alarm(math.ceil(seconds + BACKSTOP_S))
        threading.Thread(target=self._wait, args=(seconds,), name="stop-deadline",
                         daemon=True).start()

    @staticmethod
    def _wait(seconds: float) -> None:
        started = time.monotonic()
        time.sleep(seconds)
        log.error("daemon.stop_deadline_passed", after_s=round(time.monotonic() - started, 1),
                  hint="the drain did not finish: what was acknowledged is on disk, the rest"
                       " was not acknowledged")
        os._exit(EXIT_CODE)
