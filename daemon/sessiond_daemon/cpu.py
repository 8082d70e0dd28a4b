"""The daemon's threads on one CPU (`cpu_affinity`), and its children on all it may use.

The daemon's Python runs one thread at a time (the GIL): the event loop, the SQLite
writer thread, the read pool. Spread over several CPUs, every hand-over of the GIL
between the loop and the writer thread (each SQLite call releases it and takes it
back) wakes a thread on another CPU, which costs more than the work it hands over. Kept
on one CPU, sixteen writers append 1.14-1.38x as fast at 0.82-0.91x the daemon's CPU
(bench/README, "One CPU for the daemon's threads").

`auto` (the default) starts on the CPU the scheduler ran the daemon on and looks again
every ~10 s (jittered, so daemons of several users sharing a host do not move in step):
it moves to the least busy other CPU when the load that is not its own on its CPU is
more than a fifth of a core above that one's. A number pins to that CPU and never moves;
`off` leaves the scheduler to place every thread. The processes the daemon starts
(executors) get every CPU it was allowed at start: the thread that forks is widened for
the fork (`for_children`), as a child takes its parent thread's mask.

Nothing here stops the daemon once it serves. Refused the call at start (a seccomp
filter), `auto` serves unpinned; unable to read the load (/proc/stat hidden), it stays
where it started. A CPU that goes away (offline, out of the cpuset) unpins every thread
onto what is left, and the next look pins again.

Only the main process pins: a daemon run inside a test process leaves it alone.
"""

from __future__ import annotations

import contextlib
import os
import random
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field

import structlog

log = structlog.get_logger("sessiond.cpu")

LOOK_EVERY_S = 10.0  # how often `auto` looks at the CPUs' load (jittered by a fifth)
MARGIN = 0.2  # of a core: foreign load on ours past the best other's by more: move


def move_to(ours: int, busy: Mapping[int, float], own: float,
            margin: float = MARGIN) -> int | None:
    """Where `auto` goes, or None to stay: `busy` is each allowed CPU's busy share of the
    last look (1.0: a whole core), `own` this process's (all of it on `ours`). The load on
    ours that is not ours, against the least busy other CPU's."""
    others = {cpu: load for cpu, load in busy.items() if cpu != ours}
    if not others or ours not in busy:
        return None
    best = min(others, key=lambda cpu: (others[cpu], cpu))
    return best if busy[ours] - own > others[best] + margin else None


Ticks = tuple[dict[int, tuple[int, int]], int]  # each CPU's (busy, total), the process's


def shares(last: Ticks, now: Ticks, allowed: frozenset[int],
           ours: int) -> tuple[dict[int, float], float]:
    """Between two readings: each allowed CPU's busy share (1.0: the whole span), and the
    process's own CPU time as a share of our CPU's span (all its threads are there)."""
    busy: dict[int, float] = {}
    for cpu in allowed & now[0].keys() & last[0].keys():
        spent = now[0][cpu][1] - last[0][cpu][1]
        busy[cpu] = (now[0][cpu][0] - last[0][cpu][0]) / spent if spent > 0 else 0.0
    span = now[0][ours][1] - last[0][ours][1] if ours in busy else 0
    return busy, (now[1] - last[1]) / span if span > 0 else 0.0


def _ticks() -> Ticks:
    """(each CPU's (busy, total) ticks, this process's own CPU ticks) since boot."""
    cpus: dict[int, tuple[int, int]] = {}
    with open("/proc/stat") as f:
        for line in f:
            name, *fields = line.split()
            if not (name.startswith("cpu") and name[3:].isdigit()):
                continue
            values = [int(v) for v in fields[:8]]  # user nice system idle iowait irq softirq steal
            idle = values[3] + values[4]
            cpus[int(name[3:])] = (sum(values) - idle, sum(values))
    with open("/proc/self/stat") as f:
        after_name = f.read().rpartition(")")[2].split()
    return cpus, int(after_name[11]) + int(after_name[12])  # utime, stime


def _listing(cpus: frozenset[int]) -> str:
    return ",".join(str(c) for c in sorted(cpus))


def current_cpu() -> int:
    """The CPU this thread last ran on (/proc's `processor`)."""
    with open(f"/proc/self/task/{os.getpid()}/stat") as f:
        return int(f.read().rpartition(")")[2].split()[36])


@dataclass
class Pin:
    """The process's CPU: `setting` is "auto", "off" or a CPU number."""

    setting: str | int = "off"
    allowed: frozenset[int] = field(default_factory=frozenset)  # the CPUs it may use
    cpu: int | None = None  # pinned to; None: not pinned
    _forking: int = 0  # spawns in progress: no move meanwhile
    _last: Ticks | None = None  # `auto`'s last reading; None: it cannot see the load

    def start(self, setting: str | int) -> None:
        """Pin every thread of the process as `setting` says (at the daemon's start, before
        it starts threads of its own). ValueError: a CPU number this process may not use."""
        self.setting = setting
        if setting == "off" or not sys.platform.startswith("linux"):
            return
        self.allowed = frozenset(os.sched_getaffinity(0))
        if isinstance(setting, int) and setting not in self.allowed:
            raise ValueError(f"cpu_affinity {setting} is not a CPU this process may use"
                             f" ({_listing(self.allowed)}); give one of them, auto or off")
        if len(self.allowed) < 2:
            return  # one CPU already: nothing to keep together
        cpu = setting if isinstance(setting, int) else current_cpu()
        if cpu not in self.allowed:  # moved since its mask was read
            cpu = min(self.allowed)
        try:
            self._set_all({cpu})
        except PermissionError as exc:  # a seccomp filter (systemd's ~@resources), say
            if isinstance(setting, int):
                raise ValueError(f"cpu_affinity {setting}: the CPU cannot be set ({exc});"
                                 " under systemd allow the call with"
                                 " SystemCallFilter=sched_setaffinity, or use CPUAffinity="
                                 " with cpu_affinity = \"off\"") from exc
            log.warning("daemon.cpu_not_pinned", error=str(exc),
                        hint="SystemCallFilter=sched_setaffinity allows it under systemd")
            return
        self.cpu = cpu
        log.info("daemon.cpu", cpu=cpu, setting=setting, allowed=len(self.allowed))
        if setting == "auto":
            try:
                self._last = _ticks()
            except OSError as exc:  # /proc/stat hidden (systemd's ProcSubset=pid)
                log.warning("daemon.cpu_fixed", cpu=cpu, error=str(exc),
                            detail="the CPUs' load cannot be read: auto stays on this CPU")

    @property
    def follows_load(self) -> bool:
        """`auto`, pinned at the start, and able to read the load: worth looking at."""
        return self.setting == "auto" and self._last is not None

    def look(self) -> int | None:
        """`auto`'s periodic look: move every thread if another CPU is better; return the
        CPU moved to, or None. A pin the kernel undid (our CPU went offline, the cpuset
        changed) or that a failed move lost is made again on the CPU the loop is on."""
        if not self.follows_load or self._forking:
            return None
        if self.cpu is None or os.sched_getaffinity(0) != {self.cpu}:
            if self.cpu is not None:  # the kernel undid it: every thread on what is left
                self.allowed = self._widen()
            return self._move(current_cpu(), "lost")
        last, now = self._last, _ticks()
        assert last is not None  # follows_load
        self._last, ours = now, self.cpu
        busy, own = shares(last, now, self.allowed, ours)
        target = move_to(ours, busy, own)
        if target is None:
            return None
        return self._move(target, "load", busy=round(busy[ours], 2), own=round(own, 2),
                          there=round(busy[target], 2))

    def _move(self, cpu: int, why: str, **figures: float) -> int | None:
        """Every thread to `cpu`; if the kernel refuses (it went offline, or out of the
        cpuset), every thread back on what is still allowed, unpinned until the next
        look. Never raises: a look or a spawn goes on either way."""
        left = self.cpu
        try:
            self._set_all({cpu})
        except OSError as exc:
            log.warning("daemon.cpu_unpinned", cpu=cpu, error=str(exc))
            self.cpu = None
            with contextlib.suppress(OSError):
                self.allowed = self._widen()
            return None
        self.cpu = cpu
        if cpu != left:
            log.info("daemon.cpu_moved", cpu=cpu, left=left, why=why, **figures)
        return cpu

    def _widen(self) -> frozenset[int]:
        """Every thread on the CPUs of `allowed` the kernel still lets it use; those."""
        self._set_all(set(self.allowed))
        return frozenset(os.sched_getaffinity(0))

    def _set_all(self, cpus: set[int]) -> None:
        """Every thread to `cpus`. A thread starting meanwhile takes its starter's mask, so
        the listing is walked again until it holds no thread not yet set (one that is
        still being made and not yet listed keeps the old mask until the next move)."""
        done: set[int] = set()
        while True:
            tids = {int(t) for t in os.listdir("/proc/self/task")} - done
            if not tids:
                return
            for tid in tids:
                with contextlib.suppress(ProcessLookupError):  # it ended meanwhile
                    os.sched_setaffinity(tid, cpus)
            done |= tids

    @contextlib.contextmanager
    def for_children(self) -> Iterator[None]:
        """Around a spawn: the calling thread (the one that forks) gets the whole mask for
        it, so the child does; then every thread is put back, those this thread started
        meanwhile too. Nothing here fails the spawn."""
        if self.cpu is None:
            yield
            return
        try:
            os.sched_setaffinity(0, self.allowed)
        except OSError:  # the cpuset changed under us: the next look pins again
            self._move(self.cpu, "spawn")
        self._forking += 1
        try:
            yield
        finally:
            self._forking -= 1
            if not self._forking and self.cpu is not None:  # the last of overlapping spawns
                self._move(self.cpu, "spawn")

    def next_look_s(self) -> float:
        return LOOK_EVERY_S * random.uniform(0.8, 1.2)


PIN = Pin()  # the process's: affinity is a property of the process's threads
