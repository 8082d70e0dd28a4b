"""Processes the executor runner starts: spawning one, the proof, checked before every
signal, that a pid still names one of them (docs/security.md, "Signals"), and waiting for
them to end.

A turn's leader is started in a new session, so its pid is also its process group and
session id. While the leader is not reaped, that id cannot be reused, so signalling the
group is safe; the runner knows the leader is not reaped from a pidfd opened at spawn (or
from the leader's start time in /proc). Once it is reaped, the runner signals what is left
of the group one verified process at a time, each through a pidfd of its own.

Exits are waited for, not polled: a pidfd turns readable when its process exits, and the
event loop watches it. Only a process the runner holds no pidfd for (pidfd_open missing,
Linux before 5.3) is polled, every POLL_WITHOUT_PIDFD_S, through its /proc entry, with the
same start-time proof.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
from dataclasses import dataclass
from functools import cache
from typing import Any

import anyio
import structlog
from anyio.abc import Process

from sessiond_daemon.cpu import PIN

log = structlog.get_logger("sessiond.executors")

PID_MAX = 1 << 22  # the kernel's PID_MAX_LIMIT: no pid is larger
POLL_WITHOUT_PIDFD_S = 0.25  # how often a process with no pidfd is looked at in /proc
SIGKILL_WAIT_S = 5.0  # only a process stuck in the kernel outlives SIGKILL this long

# What an executor inherits of the daemon's environment; nothing else of it (its secrets,
# its LD_PRELOAD) reaches a process a client asked for.
INHERITED_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE",
                           "TERM", "TZ", "TMPDIR", "XDG_RUNTIME_DIR"})
# Keys a client may not set: they make the dynamic loader or Python run other code.
REFUSED_ENV_PREFIXES = ("LD_", "PYTHON")


@cache
def boot_id() -> str | None:
    """This boot's id: a start time (clock ticks since boot) means nothing in another boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return f.read().strip() or None
    except OSError:
        return None


def stat(pid: int) -> list[bytes] | None:
    """/proc/PID/stat from the state field on: [0] state, [1] ppid, [2] process group,
    [3] session, [19] start time. None if there is no such process."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            raw = f.read()
    except (OSError, ValueError):
        return None
    fields = raw[raw.rindex(b")") + 2:].split()
    return fields if len(fields) > 19 else None


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot, to tell a reused pid."""
    fields = stat(pid)
    return int(fields[19]) if fields else None


def valid_pid(pid: Any) -> bool:
    """A pid a process of ours can have: never 0, 1, a negative (a group) or out of range."""
    return type(pid) is int and 1 < pid < PID_MAX and pid != os.getpid()


def _owner(pid: int) -> int | None:
    try:
        return os.stat(f"/proc/{pid}").st_uid
    except OSError:
        return None


def _environ_has(pid: int, wanted: dict[str, str]) -> bool:
    """Whether the process was started with these environment variables (its own uid only)."""
    try:
        with open(f"/proc/{pid}/environ", "rb") as f:
            entries = set(f.read().split(b"\0"))
    except OSError:
        return False
    return all(f"{k}={v}".encode() in entries for k, v in wanted.items())


def _pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except (OSError, AttributeError):  # gone, or no pidfds (not Linux 5.3+)
        return None


async def _exited(pidfd: int) -> None:
    """Return once the process behind `pidfd` has exited (a zombie has): it turns readable."""
    fd = os.dup(pidfd)  # anyio lets one task wait on a descriptor: each waiter has its own
    try:
        await anyio.wait_readable(fd)
    finally:
        os.close(fd)


async def _member_exited(group: int, pid: int, ticks: int) -> None:
    """Return once the group member `pid` (started at `ticks`) no longer runs."""
    def runs() -> bool:
        fields = stat(pid)
        return (fields is not None and fields[0] != b"Z" and int(fields[19]) == ticks
                and int(fields[2]) == group)

    fd = _pidfd(pid)
    try:
        if fd is not None and runs():  # checked after opening: the pidfd is this process
            await _exited(fd)
            return
        while fd is None and runs():  # no pidfd for it: the slow poll
            await anyio.sleep(POLL_WITHOUT_PIDFD_S)
    finally:
        if fd is not None:
            os.close(fd)


@dataclass(eq=False)
class Handle:
    """A turn's process group: the leader's pid, start time and pidfd, checked before
    every signal. Used only on the event loop's thread, so a check and its signal are
    never separated by another task."""

    pid: int
    start_time: int | None
    pidfd: int | None = None

    @classmethod
    def of_child(cls, pid: int) -> Handle:
        """The handle of a leader the runner has just started (its child, not yet waited)."""
        fd = _pidfd(pid)
        fields = stat(pid)
        if fd is not None and (fields is None or int(fields[1]) != os.getpid()):
            os.close(fd)  # already reaped, and the pid is someone else's now: never signal
            return cls(pid, None, None)
        return cls(pid, int(fields[19]) if fields else None, fd)

    @classmethod
    def of_record(cls, data: dict[str, Any], session_id: str) -> Handle | None:
        """The handle of a leader recorded by a `process.started` of a previous daemon, if
        it provably still runs as that process: a valid pid, recorded in this boot with its
        start time, running as our uid, leading its own session, started with this
        session's and turn's SESSIOND_* variables. None otherwise: nothing is signalled."""
        pid, ticks, turn = data.get("pid"), data.get("start_time"), data.get("turn")
        if not (type(pid) is int and valid_pid(pid) and type(ticks) is int and type(turn) is int
                and data.get("boot_id") is not None and data.get("boot_id") == boot_id()):
            return None
        handle = cls(pid, ticks, _pidfd(pid))
        fields = stat(pid)
        if (fields is None or fields[0] == b"Z" or int(fields[19]) != ticks
                or int(fields[2]) != pid or int(fields[3]) != pid or _owner(pid) != os.getuid()
                or not _environ_has(pid, {"SESSIOND_SESSION_ID": session_id,
                                          "SESSIOND_TURN": str(turn)})):
            handle.close()
            return None
        return handle  # checked after the pidfd was opened: the pidfd is that process

    def close(self) -> None:
        fd, self.pidfd = self.pidfd, None
        if fd is not None:
            os.close(fd)

    def leader_alive(self) -> bool:
        """The leader is not reaped yet (a zombie counts): the group id is still its."""
        if self.pidfd is not None:
            try:
                signal.pidfd_send_signal(self.pidfd, 0)
            except OSError:
                return False
            return True
        fields = stat(self.pid)
        return (self.start_time is not None and fields is not None
                and int(fields[19]) == self.start_time)

    def running(self) -> bool:
        """The leader runs (a zombie does not)."""
        fields = stat(self.pid)
        return self.leader_alive() and fields is not None and fields[0] != b"Z"

    def members(self) -> list[tuple[int, int]]:
        """(pid, start time) of the group's processes that still run (not zombies), as
        far as they can be ours: in the leader's group and session, started no earlier
        than the leader, with our uid. None if the leader's pid names another process:
        then every process of ours had left, and the id was free to be reused."""
        leader = stat(self.pid)
        if self.start_time is None or (leader is not None and int(leader[19]) != self.start_time):
            return []  # unknown, or the leader's pid is another process's now: not ours
        try:
            pids = [int(d) for d in os.listdir("/proc") if d.isdigit()]
        except OSError:
            return []
        found = []
        for pid in pids:
            fields = stat(pid)
            if fields is None or fields[0] == b"Z" or int(fields[2]) != self.pid \
                    or int(fields[3]) != self.pid:
                continue
            ticks = int(fields[19])
            if ticks >= self.start_time and _owner(pid) == os.getuid():
                found.append((pid, ticks))
        return found

    def group_alive(self) -> bool:
        """Whether anything of the group still runs."""
        return self.running() or bool(self.members())

    async def wait_exit(self) -> None:
        """Return once the leader has exited: its pidfd turns readable. Without a pidfd,
        look at its /proc entry every POLL_WITHOUT_PIDFD_S."""
        if self.pidfd is not None:
            await _exited(self.pidfd)
            return
        while self.running():
            await anyio.sleep(POLL_WITHOUT_PIDFD_S)

    async def wait_group_gone(self) -> None:
        """Return once nothing of the group runs. The leader is waited for through its
        pidfd; then the members left, each through a pidfd of its own. No kernel call
        lists a process group, so /proc is read once a round, and a round ends when
        every member it found has exited; the next one finds what they forked meanwhile."""
        await self.wait_exit()
        while members := self.members():
            async with anyio.create_task_group() as tg:
                for pid, ticks in members:
                    tg.start_soon(_member_exited, self.pid, pid, ticks)

    def signal(self, signum: int) -> None:
        """Signal the whole group, checked first; never a pid that is not provably ours."""
        if self.leader_alive():
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.pid, signum)
            return
        for pid, ticks in self.members():
            fd = _pidfd(pid)
            if fd is None:
                continue
            try:
                fields = stat(pid)  # checked after opening: the pidfd is this process
                if fields is not None and int(fields[19]) == ticks and int(fields[2]) == self.pid:
                    signal.pidfd_send_signal(fd, signum)
            except OSError:
                pass
            finally:
                os.close(fd)


async def terminate(handle: Handle, grace_s: float) -> None:
    """SIGTERM the process group; SIGKILL it if anything is left after the grace period."""
    handle.signal(signal.SIGTERM)
    with anyio.move_on_after(grace_s):
        await handle.wait_group_gone()
        return
    log.info("executor.sigkill", pgid=handle.pid, grace_s=grace_s)
    handle.signal(signal.SIGKILL)
    with anyio.move_on_after(SIGKILL_WAIT_S):
        await handle.wait_group_gone()


# --- spawning -------------------------------------------------------------------------


def inherited_env() -> dict[str, str]:
    """The part of the daemon's environment an executor inherits (INHERITED_ENV, LC_*)."""
    return {k: v for k, v in os.environ.items() if k in INHERITED_ENV or k.startswith("LC_")}


def cannot_start(argv: list[str], cwd: str | None, path: str | None,
                 whose: str = "the daemon's PATH") -> str | None:
    """Say in words why the command cannot start, before trying. A bare name is looked up
    on `path`, which is `whose` (the daemon's, or the one the request's env gave), never the
    caller's: the message says which, and what it held."""
    if cwd is not None and not os.path.isdir(cwd):
        return f"working directory does not exist: {cwd}"
    program = argv[0]
    if os.sep in program:
        full = program if os.path.isabs(program) or cwd is None else os.path.join(cwd, program)
        if not os.path.exists(full):
            return f"executable not found: {program}"
        if not os.access(full, os.X_OK) or os.path.isdir(full):
            return f"not an executable file: {program}"
    elif shutil.which(program, path=path) is None:
        searched = f"PATH={path}" if path else f"no PATH set, so {os.defpath}"
        hint = ("; the caller's PATH is not used: give an absolute path, or PATH in env"
                if whose == "the daemon's PATH" else "")
        return f"executable not found on {whose}: {program} (searched {searched}{hint})"
    return None


async def spawn(argv: list[str], cwd: str | None, env: dict[str, str], stdin: bool,
                path_from: str = "the daemon's PATH") -> Process | str:
    """Start a turn's leader in a session of its own, its output on pipes; or say why not
    (`path_from`: whose PATH `env` holds, for that message)."""
    problem = cannot_start(argv, cwd, env.get("PATH"), path_from)
    if problem is not None:
        return problem
    try:
        with PIN.for_children():  # every CPU the daemon may use, not its own one (cpu.py)
            return await anyio.open_process(
                argv, cwd=cwd, env=env, start_new_session=True,
                stdin=subprocess.PIPE if stdin else subprocess.DEVNULL,
                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    except (OSError, ValueError) as exc:  # ValueError: not encodable for exec
        return f"cannot start {argv[0]!r}: {getattr(exc, 'strerror', None) or exc}"


async def feed_stdin(proc: Process, text: str) -> None:
    """Write `text` (a line) to the process's input, then close it."""
    assert proc.stdin is not None
    try:
        await proc.stdin.send(text.encode() + (b"" if text.endswith("\n") else b"\n"))
        await proc.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # the process does not read its input; that is its business
