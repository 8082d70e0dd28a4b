"""A turn's lifecycle: one executor process started, its output captured, its end recorded.

Each turn is one process in its own process group. Its stdout and stderr are read line by
line; every line becomes a `process.output` event, and the session's adapter turns stdout
lines into messages, token usage and errors as they arrive. The leader's exit comes from
the child watcher (`Process.wait`); on exit the turn's status is decided by seed 004's
rules.
"""

from __future__ import annotations

import os
import signal
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from socket import gethostname
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import ByteReceiveStream, Process, TaskGroup

from sessiond_daemon.core import text
from sessiond_daemon.core.commands import Commands, RunnerData, require, sequenced
from sessiond_daemon.core.writer import Plan
from sessiond_daemon.features.executors.adapters import JSONL_TYPES, Adapter, Parsed
from sessiond_daemon.features.executors.processes import (
    Handle,
    boot_id,
    feed_stdin,
    inherited_env,
    spawn,
    terminate,
)
from sessiond_daemon.features.service import APPEND_INPUTS
from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import EventMeta, ProcessExited, ProcessOutput
from sessiond_schemas.state import SessionState

log = structlog.get_logger("sessiond.executors")

MAX_PENDING = 1000  # lines read but not yet handed to the writer; past it, reading waits
LINGER_S = 2.0  # after the leader exits, how long its children may keep the pipes open


@dataclass(frozen=True)
class Settings:
    """The runner's settings (serve/config.py's executor keys), and the socket executors get."""

    max_processes: int = 16
    max_line_bytes: int = 256 << 10
    max_output_lines_per_s: int = 2000
    kill_grace_s: float = 5.0
    socket: str | None = None  # passed to executors as $SESSIOND_SOCKET
    # This host's name (config host_name), recorded in process.started: only this host's
    # daemon supervises, continues or kills the process (fleet mode).
    host: str = field(default_factory=gethostname)


@dataclass(eq=False)
class Turn:
    """One running process of a session, and what its output said so far."""

    session_id: str
    turn: int
    pid: int
    process: Process
    adapter: Adapter
    handle: Handle  # checked before every signal to the turn's process group
    pending: list[tuple[str, dict[str, Any] | RunnerData]] = field(default_factory=list)
    wake: anyio.Event = field(default_factory=anyio.Event)
    drained: anyio.Event = field(default_factory=anyio.Event)
    done: anyio.Event = field(default_factory=anyio.Event)
    reading: bool = True
    killing: bool = False
    stopping: bool = False
    lines: int = 0
    truncated: int = 0
    response: bool = False
    error: str | None = None


class LineSplitter:
    """Bytes in, whole lines out; a line longer than `limit` keeps its head and a marker."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.buffer = bytearray()
        self.dropped = 0  # bytes of the current over-long line thrown away so far

    def feed(self, chunk: bytes) -> list[tuple[bytes, int]]:
        """Return (line, dropped byte count) for each line `chunk` completes."""
        out = []
        self.buffer += chunk
        while (nl := self.buffer.find(b"\n")) >= 0:
            out.append(self._take(nl))
            del self.buffer[:1]
        if len(self.buffer) > self.limit:  # keep the head only; count the rest
            self.dropped += len(self.buffer) - self.limit
            del self.buffer[self.limit:]
        return out

    def finish(self) -> list[tuple[bytes, int]]:
        """The last line, if the output did not end with a newline."""
        return [self._take(len(self.buffer))] if self.buffer or self.dropped else []

    def _take(self, end: int) -> tuple[bytes, int]:
        line = bytes(self.buffer[:min(end, self.limit)])
        dropped = self.dropped + max(0, end - self.limit)
        del self.buffer[:end]
        self.dropped = 0
        return line, dropped


class Throttle:
    """A token bucket: `rate` lines a second, bursts of up to `rate`."""

    def __init__(self, rate: int) -> None:
        self.rate = max(1, rate)
        self.tokens = float(self.rate)
        self.at = time.monotonic()
        self.waited = 0.0

    async def take(self) -> None:
        now = time.monotonic()
        self.tokens = min(self.rate, self.tokens + (now - self.at) * self.rate)
        self.at = now
        if self.tokens < 1:
            delay = (1 - self.tokens) / self.rate
            self.waited += delay
            await anyio.sleep(delay)  # not reading: the pipe fills and the writer blocks
            self.tokens, self.at = 1.0, time.monotonic()
        self.tokens -= 1


def plan_of(state: SessionState,
            events: Sequence[tuple[str, dict[str, Any] | RunnerData]]) -> Plan:
    """Messages numbered and status changes' `from` filled, as events.append does."""
    return Plan(sequenced(state, events), lambda s, ev: s)


class Turns:
    """The turns running now: started, supervised until their process ends, recorded."""

    def __init__(self, commands: Commands, settings: Settings) -> None:
        self.commands = commands
        self.settings = settings
        self.running: dict[str, Turn] = {}
        self.tasks: TaskGroup | None = None  # the runner's: supervisors outlive requests

    async def start(self, sid: str, meta: EventMeta, adapter: Adapter, argv: list[str],
                    cwd: str | None, env: dict[str, str], turn_no: int,
                    stdin_text: str | None) -> msgspec.Raw:
        """Start a turn's process and record it (or record why it did not start)."""
        # A clean environment: never the daemon's own (its secrets), only the allowlist,
        # then what the request asked for, then the runner's own variables.
        full_env = {**inherited_env(), **env, "SESSIOND_SESSION_ID": sid,
                    "SESSIOND_TURN": str(turn_no)}
        if self.settings.socket:
            full_env["SESSIOND_SOCKET"] = self.settings.socket
        whose = "the PATH the spawn's env gave" if "PATH" in env else "the daemon's PATH"
        process = await spawn(argv, cwd, full_env, stdin=bool(stdin_text), path_from=whose)
        if isinstance(process, str):
            problem = process
            log.warning("executor.start_failed", session_id=sid, turn=turn_no, error=problem)

            def failed(s: SessionState | None) -> Plan:
                s = require(s, sid)
                return plan_of(s, [("session.status_changed", {
                    "to": "failed", "reason": "executor did not start", "error": problem})])

            return await self.commands.submit(sid, meta, failed)
        handle = Handle.of_child(process.pid)
        turn = Turn(sid, turn_no, process.pid, process, adapter, handle)
        self.running[sid] = turn
        # pid, start time and boot id: what a later daemon checks before it signals.
        started = {"pid": process.pid, "argv": argv, "cwd": cwd, "turn": turn_no,
                   "start_time": handle.start_time, "boot_id": boot_id(),
                   "host": self.settings.host}

        def plan(s: SessionState | None) -> Plan:
            return plan_of(require(s, sid), [("process.started", started)])

        try:
            result = await self.commands.submit(sid, meta, plan)
        except BaseException:
            del self.running[sid]
            handle.signal(signal.SIGKILL)
            with anyio.CancelScope(shield=True):
                await process.wait()
            handle.close()
            raise
        log.info("executor.started", session_id=sid, turn=turn_no, pid=process.pid,
                 adapter=adapter.name)
        assert self.tasks is not None
        self.tasks.start_soon(self._supervise, turn, stdin_text)
        return result

    async def terminate(self, handle: Handle) -> None:
        """SIGTERM the process group, SIGKILL after the grace period; return once it is gone."""
        await terminate(handle, self.settings.kill_grace_s)

    # --- supervising ------------------------------------------------------------------

    async def _supervise(self, turn: Turn, stdin_text: str | None) -> None:
        proc = turn.process
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._flusher, turn)
                if stdin_text and proc.stdin is not None:
                    tg.start_soon(feed_stdin, proc, stdin_text)
                async with anyio.create_task_group() as readers:
                    async def read_both() -> None:
                        async with anyio.create_task_group() as pumps:
                            assert proc.stdout is not None and proc.stderr is not None
                            pumps.start_soon(self._pump, turn, proc.stdout, "stdout")
                            pumps.start_soon(self._pump, turn, proc.stderr, "stderr")
                        readers.cancel_scope.cancel()

                    readers.start_soon(read_both)
                    readers.start_soon(self._reap_leftovers, turn)
                returncode = await proc.wait()  # the child watcher reaps the leader
                turn.reading = False
                turn.wake.set()
            await self._finish(turn, returncode)
        except Exception:
            log.exception("executor.supervision_failed", session_id=turn.session_id)
        finally:
            self.running.pop(turn.session_id, None)
            turn.done.set()
            turn.handle.signal(signal.SIGKILL)  # nothing of the turn outlives it
            turn.handle.close()

    async def _reap_leftovers(self, turn: Turn) -> None:
        """The leader exited but children hold the pipes: give them a moment, then end them."""
        await turn.process.wait()
        with anyio.move_on_after(LINGER_S):
            await turn.handle.wait_group_gone()
            return  # nothing left: the pipes close as the readers drain them
        log.info("executor.leftovers_killed", session_id=turn.session_id, pgid=turn.pid)
        turn.handle.signal(signal.SIGKILL)

    async def _pump(self, turn: Turn, stream: ByteReceiveStream, name: str) -> None:
        splitter = LineSplitter(self.settings.max_line_bytes)
        throttle = Throttle(self.settings.max_output_lines_per_s)
        throttled = False

        async def emit(lines: list[tuple[bytes, int]]) -> None:
            nonlocal throttled
            for raw, dropped in lines:
                waited = throttle.waited
                await throttle.take()
                if throttle.waited > waited and not throttled:
                    log.warning("executor.throttled", session_id=turn.session_id,
                                stream=name, lines_per_s=throttle.rate)
                    throttled = True
                while len(turn.pending) >= MAX_PENDING:
                    turn.drained = anyio.Event()
                    await turn.drained.wait()
                self._take_line(turn, name, raw, dropped)

        async for chunk in stream:
            await emit(splitter.feed(chunk))
        await emit(splitter.finish())

    def _take_line(self, turn: Turn, name: str, raw: bytes, dropped: int) -> None:
        line = text.scrub_line(raw.decode("utf-8", "replace").rstrip("\r"))
        turn.lines += 1
        if dropped:
            turn.truncated += 1
            line += f" …[truncated {dropped} bytes]"
        turn.pending.append(("process.output",
                             ProcessOutput(turn=turn.turn, line=line,
                                           stream="stdout" if name == "stdout" else "stderr")))
        if name == "stdout":
            parsed = turn.adapter.parse(line) if not dropped else None
            if parsed is not None:
                self._take_parsed(turn, parsed)
        turn.wake.set()

    def _take_parsed(self, turn: Turn, parsed: Parsed) -> None:
        turn.response = turn.response or parsed.response
        if parsed.error:
            turn.error = parsed.error
        for kind, data in parsed.events:
            problem = self._invalid(kind, data)
            if problem is None:
                turn.pending.append((kind, data))
            elif turn.adapter.name == "jsonl":  # tell the executor's author what was wrong
                turn.pending.append(("problem.recorded", {
                    "kind": "invalid_executor_event", "type": kind, "detail": problem}))

    def _invalid(self, kind: str, data: dict[str, Any]) -> str | None:
        shape = APPEND_INPUTS.get(kind)
        if kind not in JSONL_TYPES or shape is None:
            return f"{kind} cannot be written by an executor"
        try:
            msgspec.convert(data, shape)
            self.commands.check_event_size(data, f"{kind} data")
        except (msgspec.ValidationError, SessiondError) as exc:
            return str(exc)
        return None

    async def _flusher(self, turn: Turn) -> None:
        """Hand the pending lines to the writer, as one write per wake-up (group commit)."""
        meta = EventMeta(peer_uid=os.getuid(), peer_pid=turn.pid)
        while True:
            await turn.wake.wait()
            turn.wake = anyio.Event()
            if turn.pending:
                events, turn.pending = turn.pending, []
                turn.drained.set()
                await self._write_events(turn, meta, events)
            if not turn.reading and not turn.pending:
                return

    async def _write_events(self, turn: Turn, meta: EventMeta,
                            events: list[tuple[str, dict[str, Any] | RunnerData]]) -> None:
        def plan(s: SessionState | None) -> Plan:
            return plan_of(require(s, turn.session_id), events)

        try:
            await self.commands.submit(turn.session_id, meta, plan)
        except SessiondError as exc:  # e.g. the disk is full: the lines are lost, say so
            log.error("executor.output_lost", session_id=turn.session_id, lines=len(events),
                      error=exc.message)

    async def _finish(self, turn: Turn, returncode: int) -> None:
        code = returncode if returncode >= 0 else None
        signum = -returncode if returncode < 0 else None
        exited = ProcessExited(pid=turn.pid, turn=turn.turn, exit_code=code, signal=signum,
                               lines=turn.lines, truncated_lines=turn.truncated)
        to, error = outcome(turn, code, signum)

        def plan(s: SessionState | None) -> Plan:
            s = require(s, turn.session_id)
            events: list[tuple[str, dict[str, Any] | RunnerData]] = [("process.exited", exited)]
            if s.status == "active" and s.turn == turn.turn:
                events.append(("session.status_changed", {
                    "to": to, "reason": "executor exited", **({"error": error} if error else {})}))
            return plan_of(s, events)

        meta = EventMeta(peer_uid=os.getuid(), peer_pid=turn.pid)
        with anyio.CancelScope(shield=True):
            await self.commands.submit(turn.session_id, meta, plan)
        log.info("executor.exited", session_id=turn.session_id, turn=turn.turn,
                 exit_code=code, signal=signum, status=to, lines=turn.lines)


def outcome(turn: Turn, code: int | None, signum: int | None) -> tuple[str, str | None]:
    """Seed 004's rules: an error with an assistant reply still completes, the error kept."""
    if turn.killing:
        return "killed", "Manually killed"
    if turn.stopping:
        return "failed", "daemon stopped; executor terminated"
    failure = turn.error or (f"exited with code {code}" if code else
                             f"killed by signal {signum}" if signum else None)
    if failure is None:
        return "completed", None
    if turn.response:
        return "completed", f"Completed with error: {failure}"
    return "failed", failure
