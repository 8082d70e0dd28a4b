"""The executor runner: agent CLIs as supervised sessions (session.spawn/inject/kill/output/trajectory).

Each turn is one process in its own process group. Its stdout and stderr are read line by
line; every line becomes a `process.output` event, and the session's adapter turns stdout
lines into messages, token usage and errors as they arrive. On exit the turn's status is
decided by seed 004's rules. A daemon start marks turns it no longer supervises.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass, field
from typing import Any

import anyio
import msgspec
import structlog
from anyio.abc import ByteReceiveStream, Process, TaskStatus

from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    OverloadedError,
    SessiondError,
    SessionExistsError,
    ShuttingDownError,
)
from sessiond_schemas.events import (
    ALLOWED_TRANSITIONS,
    EventMeta,
    SessionCreated,
    new_id,
)
from sessiond_schemas.state import SessionState

from .adapters import ADAPTERS, JSONL_TYPES, Adapter, Parsed
from .eventstore import page_budget
from .processes import Handle, boot_id, stat, valid_pid
from .service import (
    APPEND_INPUTS,
    Service,
    check_transition,
    created_view,
    require,
    sequenced,
)
from .writer import Plan

log = structlog.get_logger("sessiond.executors")

MAX_PENDING = 1000  # lines read but not yet handed to the writer; past it, reading waits
LINGER_S = 2.0  # after the leader exits, how long its children may keep the pipes open
_decode = msgspec.json.Decoder()


@dataclass(frozen=True)
class Settings:
    max_processes: int = 16
    max_line_bytes: int = 256 << 10
    max_output_lines_per_s: int = 2000
    kill_grace_s: float = 5.0
    socket: str | None = None  # passed to executors as $SESSIOND_SOCKET


@dataclass(eq=False)
class Turn:
    """One running process of a session, and what its output said so far."""

    session_id: str
    turn: int
    pid: int
    process: Process
    adapter: Adapter
    handle: Handle  # checked before every signal to the turn's process group
    pending: list[tuple[str, dict[str, Any]]] = field(default_factory=list)
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


class Executors:
    """Starts, watches and stops executor processes; serves the executor methods."""

    def __init__(self, service: Service, settings: Settings) -> None:
        self.service = service
        self.settings = settings
        self.running: dict[str, Turn] = {}
        self._starting: set[str] = set()  # sessions between the check and process.started
        # Turns a previous daemon left running, proven ours at start-up: sid -> (handle, turn).
        self.detached: dict[str, tuple[Handle, int]] = {}
        self._tg: anyio.abc.TaskGroup | None = None
        self._closed = False

    # --- lifetime ---------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Recover turns a previous daemon left, then supervise until cancelled."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            await self._recover(tg)
            task_status.started()
            await anyio.sleep_forever()

    async def stop(self) -> None:
        """Shutdown: end every running turn (SIGTERM, then SIGKILL) and record it as failed."""
        self._closed = True
        turns = list(self.running.values())
        for t in turns:
            t.stopping = True
        async with anyio.create_task_group() as tg:
            for t in turns:
                tg.start_soon(self._terminate, t.handle)
        for t in turns:
            await t.done.wait()

    # --- methods ----------------------------------------------------------------------

    async def session_spawn(self, p: rpc.SessionSpawnParams, meta: EventMeta) -> msgspec.Raw:
        if p.cwd is not None and not os.path.isabs(p.cwd):
            raise InvalidParamsError(f"cwd must be an absolute path: {p.cwd!r}",
                                     {"detail": "relative path", "path": "$.cwd"})
        _check_spawn(p)
        self._check_capacity()
        sid = p.session_id or new_id()
        created = msgspec.to_builtins(SessionCreated(
            task=p.task, working_dir=p.cwd, model=p.model, adapter=p.adapter, source=p.source,
            metadata=p.metadata, status="active",
            **({"namespace": p.namespace} if p.namespace else {})))
        self.service.check_event_size(created, "session.created data")
        task = [("message.appended", {"role": "user", "content": p.task})] \
            if p.task and p.task.strip() else []

        def plan(state: SessionState | None) -> Plan:
            if state is not None:
                raise SessionExistsError(f"session {sid} already exists", {"session_id": sid})
            return Plan([("session.created", created), *sequenced(created_view(sid, created), task)],
                        lambda s, ev: s)

        self._starting.add(sid)
        try:
            await self.service.write(sid, meta, plan)
            return await self._start_turn(sid, meta, ADAPTERS[p.adapter], p.argv, p.cwd, p.env,
                                          1, p.task)
        finally:
            self._starting.discard(sid)

    async def session_inject(self, p: rpc.SessionInjectParams, meta: EventMeta) -> msgspec.Raw:
        sid = p.session_id
        if sid in self.running or sid in self._starting:
            turn = self.running.get(sid)
            raise InvalidTransitionError(
                f"session {sid} is running" + (f" turn {turn.turn}" if turn else "")
                + "; wait for it to finish or kill it",
                {"from": "active", "to": "active", "allowed": list(ALLOWED_TRANSITIONS["active"])})
        self._starting.add(sid)
        try:
            state = await self.service.state(sid)
            adapter = ADAPTERS.get(state.adapter or "")
            # Only what this daemon's runner recorded: an imported argv is never run.
            history = await self._runner_rows(sid, ("process.started", "process.output"))
            started = [d for t, d in history if t == "process.started"]
            if adapter is None or not started:
                raise InvalidParamsError(
                    f"session {sid} has no executor to continue (not started by this daemon's"
                    " session.spawn; an imported executor history is never continued)",
                    {"detail": "no executor", "path": "$.session_id"})
            if state.status == "active":
                raise InvalidTransitionError(
                    f"session {sid} is active (its process is not supervised by this daemon);"
                    " kill it first", {"from": "active", "to": "active",
                                       "allowed": list(ALLOWED_TRANSITIONS["active"])})
            self._check_capacity(starting=1)  # this session is counted in _starting
            resume_id = None
            for t, d in history:
                if t == "process.output" and d.get("stream", "stdout") == "stdout":
                    parsed = adapter.parse(d["line"])
                    if parsed is not None and parsed.resume_id:
                        resume_id = parsed.resume_id
            try:
                argv = adapter.resume_argv(started[0]["argv"], resume_id, p.message, state.model)
            except ValueError as exc:
                raise InvalidParamsError(f"session {sid}: {exc}",
                                         {"detail": str(exc), "path": "$.session_id"}) from None

            def plan(s: SessionState | None) -> Plan:
                s = require(s, sid)
                check_transition(sid, s.status, "active")
                return self._plan(s, [
                    ("message.appended", {"role": "user", "content": p.message}),
                    ("session.status_changed", {"to": "active", "reason": "message injected"})])

            await self.service.write(sid, meta, plan)
            return await self._start_turn(
                sid, meta, adapter, argv, started[-1].get("cwd"), {}, state.turn + 1,
                p.message if adapter.message_on_stdin else None)
        finally:
            self._starting.discard(sid)

    async def session_kill(self, p: rpc.SessionRef, meta: EventMeta) -> msgspec.Raw:
        sid = p.session_id
        turn = self.running.get(sid)
        if turn is not None:
            turn.killing = True
            await self._terminate(turn.handle)
            await turn.done.wait()
            return msgspec.Raw(msgspec.json.encode(await self.service.state(sid)))
        state = await self.service.state(sid)
        check_transition(sid, state.status, "killed")
        exited: list[tuple[str, dict[str, Any]]] = []
        # Only a process this daemon started, or one a previous daemon started that was
        # proven at start-up to still be it: a pid in the stored events is never a target.
        detached = self.detached.pop(sid, None)
        if detached is not None:
            handle, turn_no = detached
            # Not our child, so its exit status is unknown.
            await self._terminate(handle)
            exited.append(("process.exited", {"pid": handle.pid, "turn": turn_no}))

        def plan(s: SessionState | None) -> Plan:
            s = require(s, sid)
            check_transition(sid, s.status, "killed")
            return self._plan(s, [*exited, ("session.status_changed", {
                "to": "killed", "reason": "killed", "error": "Manually killed"})])

        return await self.service.write(sid, meta, plan)

    async def session_output(self, p: rpc.SessionOutputParams, meta: EventMeta) -> rpc.OutputResult:
        state = await self.service.state(p.session_id)
        turn = p.turn or state.turn
        page = await self.service.store.process_output(
            p.session_id, turn, p.stream, p.after_position, max_bytes=page_budget.get())
        return rpc.OutputResult(turn=turn, lines=[line for _, line in page],
                                next=page[-1][0] if page.cut else None,
                                truncated_by_bytes=page.cut)

    async def session_trajectory(self, p: rpc.SessionTrajectoryParams,
                                 meta: EventMeta) -> rpc.TrajectoryResult:
        state = await self.service.state(p.session_id)
        adapter = ADAPTERS.get(state.adapter or "")
        rows = await self.service.store.events_of_types(
            p.session_id, ("message.appended", "process.started", "process.output", "process.exited"))
        steps: list[rpc.Step] = []
        turn = 0
        for kind, d in rows:
            if kind == "process.started":
                turn = d.get("turn", turn)
            elif kind == "message.appended" and d.get("role") == "user":
                steps.append(rpc.Step(type="user", summary=d["content"], turn=turn + 1))
            elif kind == "process.output" and d.get("stream", "stdout") == "stdout" and adapter:
                parsed = adapter.parse(d["line"])
                if parsed is not None:  # user messages are already steps, from their events
                    steps += [rpc.Step(turn=d.get("turn", turn), **s) for s in parsed.steps
                              if s["type"] != "user"]
            elif kind == "process.exited" and (d.get("exit_code") or d.get("signal")):
                how = (f"exit code {d['exit_code']}" if d.get("exit_code")
                       else f"signal {d.get('signal')}")
                steps.append(rpc.Step(type="exit", summary=how, turn=d.get("turn", turn),
                                      details={k: d[k] for k in ("exit_code", "signal") if k in d}))
        if not p.full:
            steps = [_truncate_step(s, p.max_output_len) for s in steps]
        return rpc.TrajectoryResult(steps=steps)

    # --- starting a turn --------------------------------------------------------------

    def _check_capacity(self, starting: int = 0) -> None:
        if self._closed:
            raise ShuttingDownError("the daemon is shutting down")
        if len(self.running) + len(self._starting) - starting >= self.settings.max_processes:
            raise OverloadedError(
                f"{self.settings.max_processes} executors are running (max_processes); retry later",
                {"retry_after_ms": 1000})

    async def _start_turn(self, sid: str, meta: EventMeta, adapter: Adapter, argv: list[str],
                          cwd: str | None, env: dict[str, str], turn_no: int,
                          stdin_text: str | None) -> msgspec.Raw:
        # A clean environment: never the daemon's own (its secrets), only the allowlist,
        # then what the request asked for, then the runner's own variables.
        full_env = {**_inherited_env(), **env, "SESSIOND_SESSION_ID": sid,
                    "SESSIOND_TURN": str(turn_no)}
        if self.settings.socket:
            full_env["SESSIOND_SOCKET"] = self.settings.socket
        problem = _cannot_start(argv, cwd, full_env.get("PATH"))
        process = None
        if problem is None:
            try:
                process = await anyio.open_process(
                    argv, cwd=cwd, env=full_env, start_new_session=True,
                    stdin=subprocess.PIPE if stdin_text else subprocess.DEVNULL,
                    stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            except (OSError, ValueError) as exc:  # ValueError: not encodable for exec
                problem = f"cannot start {argv[0]!r}: {getattr(exc, 'strerror', None) or exc}"
        if process is None:
            assert problem is not None
            log.warning("executor.start_failed", session_id=sid, turn=turn_no, error=problem)

            def failed(s: SessionState | None) -> Plan:
                s = require(s, sid)
                return self._plan(s, [("session.status_changed", {
                    "to": "failed", "reason": "executor did not start", "error": problem})])

            return await self.service.write(sid, meta, failed)
        handle = Handle.of_child(process.pid)
        turn = Turn(sid, turn_no, process.pid, process, adapter, handle)
        self.running[sid] = turn
        # pid, start time and boot id: what a later daemon checks before it signals.
        started = {"pid": process.pid, "argv": argv, "cwd": cwd, "turn": turn_no,
                   "start_time": handle.start_time, "boot_id": boot_id()}

        def plan(s: SessionState | None) -> Plan:
            return self._plan(require(s, sid), [("process.started", started)])

        try:
            result = await self.service.write(sid, meta, plan)
        except BaseException:
            del self.running[sid]
            handle.signal(signal.SIGKILL)
            with anyio.CancelScope(shield=True):
                await process.wait()
            handle.close()
            raise
        log.info("executor.started", session_id=sid, turn=turn_no, pid=process.pid,
                 adapter=adapter.name)
        assert self._tg is not None
        self._tg.start_soon(self._supervise, turn, stdin_text)
        return result

    # --- supervising ------------------------------------------------------------------

    async def _supervise(self, turn: Turn, stdin_text: str | None) -> None:
        proc = turn.process
        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(self._flusher, turn)
                if stdin_text and proc.stdin is not None:
                    tg.start_soon(_feed_stdin, proc, stdin_text)
                async with anyio.create_task_group() as readers:
                    async def read_both() -> None:
                        async with anyio.create_task_group() as pumps:
                            assert proc.stdout is not None and proc.stderr is not None
                            pumps.start_soon(self._pump, turn, proc.stdout, "stdout")
                            pumps.start_soon(self._pump, turn, proc.stderr, "stderr")
                        readers.cancel_scope.cancel()

                    readers.start_soon(read_both)
                    readers.start_soon(self._reap_leftovers, turn)
                returncode = await proc.wait()
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
        await anyio.sleep(LINGER_S)
        if turn.handle.group_alive():
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
        line = raw.decode("utf-8", "replace").rstrip("\r")
        turn.lines += 1
        if dropped:
            turn.truncated += 1
            line += f" …[truncated {dropped} bytes]"
        turn.pending.append(("process.output", {"turn": turn.turn, "stream": name, "line": line}))
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
            self.service.check_event_size(data, f"{kind} data")
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
                            events: list[tuple[str, dict[str, Any]]]) -> None:
        def plan(s: SessionState | None) -> Plan:
            return self._plan(require(s, turn.session_id), events)

        try:
            await self.service.write(turn.session_id, meta, plan)
        except SessiondError as exc:  # e.g. the disk is full: the lines are lost, say so
            log.error("executor.output_lost", session_id=turn.session_id, lines=len(events),
                      error=exc.message)

    async def _finish(self, turn: Turn, returncode: int) -> None:
        code = returncode if returncode >= 0 else None
        signum = -returncode if returncode < 0 else None
        exited = {"pid": turn.pid, "turn": turn.turn, "exit_code": code, "signal": signum,
                  "lines": turn.lines, "truncated_lines": turn.truncated}
        to, error = _outcome(turn, code, signum)

        def plan(s: SessionState | None) -> Plan:
            s = require(s, turn.session_id)
            events: list[tuple[str, dict[str, Any]]] = [("process.exited", exited)]
            if s.status == "active" and s.turn == turn.turn:
                events.append(("session.status_changed", {
                    "to": to, "reason": "executor exited", **({"error": error} if error else {})}))
            return self._plan(s, events)

        meta = EventMeta(peer_uid=os.getuid(), peer_pid=turn.pid)
        with anyio.CancelScope(shield=True):
            await self.service.write(turn.session_id, meta, plan)
        log.info("executor.exited", session_id=turn.session_id, turn=turn.turn,
                 exit_code=code, signal=signum, status=to, lines=turn.lines)

    async def _terminate(self, handle: Handle) -> None:
        """SIGTERM the process group; SIGKILL it if anything is left after the grace period."""
        handle.signal(signal.SIGTERM)
        with anyio.move_on_after(self.settings.kill_grace_s):
            while handle.group_alive():
                await anyio.sleep(0.05)
            return
        log.info("executor.sigkill", pgid=handle.pid, grace_s=self.settings.kill_grace_s)
        handle.signal(signal.SIGKILL)
        with anyio.move_on_after(5):  # only a process stuck in the kernel outlives SIGKILL
            while handle.group_alive():
                await anyio.sleep(0.05)

    # --- restart recovery -------------------------------------------------------------

    async def _runner_rows(self, sid: str, types: tuple[str, ...]) -> list[tuple[str, Any]]:
        """A session's process events (and `types`) that this daemon's runner wrote: those
        after the marker an import puts after the history it brought (maintenance.py).
        What came before it is another daemon's history, never acted on."""
        rows = await self.service.store.events_of_types(
            sid, tuple({*types, "process.detached"}))
        marks = [i for i, (kind, d) in enumerate(rows)
                 if kind == "process.detached" and d.get("imported") is True]
        return [r for r in rows[marks[-1] + 1 if marks else 0:] if r[0] in types]

    async def _open_turn(self, sid: str) -> tuple[dict[str, Any], bool] | None:
        """The last process.started of a session if no exit was recorded after it, and
        whether a restart already recorded it as detached."""
        rows = await self._runner_rows(
            sid, ("process.started", "process.exited", "process.detached"))
        starts = [i for i, (kind, _) in enumerate(rows) if kind == "process.started"]
        if not starts or any(kind == "process.exited" for kind, _ in rows[starts[-1]:]):
            return None
        return rows[starts[-1]][1], any(kind == "process.detached" for kind, _ in rows[starts[-1]:])

    async def _recover(self, tg: anyio.abc.TaskGroup) -> None:
        """Decide the open turn of every active executor session. Stored data never stops
        the start: what cannot be decided is logged and left as it is."""
        try:
            sessions = await self.service.store.sessions_with_process()
        except Exception:
            log.exception("executor.recovery_failed", error_id=new_id())
            return
        for sid in sessions:
            try:
                await self._recover_one(tg, sid)
            except Exception:
                log.exception("executor.recovery_failed", session_id=sid, error_id=new_id())

    async def _recover_one(self, tg: anyio.abc.TaskGroup, sid: str) -> None:
        found = await self._open_turn(sid)
        if found is None:
            return
        last, detached = found
        pid = last.get("pid")
        pid = pid if type(pid) is int and -(1 << 63) <= pid < 1 << 63 else -1
        turn_no = last.get("turn") if type(last.get("turn")) is int else 0
        # Signalled later only if it provably is the process the runner recorded.
        handle = Handle.of_record(last, sid)
        events: list[tuple[str, dict[str, Any]]] = []
        if handle is not None and handle.running():
            reason = (f"daemon restarted; executor still running as pid {pid},"
                      " its output is no longer captured")
            if not detached:
                events = [("process.detached", {"pid": pid, "turn": turn_no, "alive": True,
                                                "reason": reason})]
            self.detached[sid] = (handle, turn_no)
            tg.start_soon(self._watch_detached, sid, handle, turn_no)
        else:
            if handle is not None:
                handle.close()
                handle = None
            reason = "daemon restarted; executor process lost"
            if valid_pid(pid) and (fields := stat(pid)) is not None and fields[0] != b"Z":
                reason += (f" (pid {pid} runs, but is not provably the process this daemon"
                           " started; it is not signalled)")
            events = [("process.detached", {"pid": pid, "turn": turn_no, "alive": False,
                                            "reason": reason}),
                      ("session.status_changed", {"to": "failed", "reason": "recovery",
                                                  "error": reason})]
        log.warning("executor.recovered", session_id=sid, pid=pid, alive=handle is not None)
        if not events:
            return

        def plan(s: SessionState | None) -> Plan:
            return self._plan(require(s, sid), events)

        meta = EventMeta(peer_uid=os.getuid(), peer_pid=os.getpid())
        try:
            await self.service.write(sid, meta, plan)
        except SessiondError as exc:
            log.error("executor.recovery_failed", session_id=sid, error=exc.message)

    async def _watch_detached(self, sid: str, handle: Handle, turn_no: int) -> None:
        """A detached executor that ends by itself: record it (its exit status is unknown)."""
        pid = handle.pid
        try:
            while handle.running():
                await anyio.sleep(1.0)
        finally:
            handle.close()
        if self.detached.get(sid, (None,))[0] is not handle:
            return  # session.kill took it, and records its end
        del self.detached[sid]
        reason = "executor process lost after a daemon restart; its exit status is unknown"

        def plan(s: SessionState | None) -> Plan:
            s = require(s, sid)
            events: list[tuple[str, dict[str, Any]]] = []
            if s.pid == pid and s.turn == turn_no and s.status == "active":
                events = [("process.exited", {"pid": pid, "turn": turn_no}),
                          ("session.status_changed", {"to": "failed", "reason": "recovery",
                                                      "error": reason})]
            return self._plan(s, events)

        try:
            await self.service.write(sid, EventMeta(peer_uid=os.getuid(), peer_pid=pid), plan)
        except SessiondError as exc:
            log.error("executor.recovery_failed", session_id=sid, error=exc.message)

    # --- planning ---------------------------------------------------------------------

    @staticmethod
    def _plan(state: SessionState, events: list[tuple[str, dict[str, Any]]]) -> Plan:
        """Messages numbered and status changes' `from` filled, as events.append does."""
        return Plan(sequenced(state, events), lambda s, ev: s)


async def _feed_stdin(proc: Process, text: str) -> None:
    assert proc.stdin is not None
    try:
        await proc.stdin.send(text.encode() + (b"" if text.endswith("\n") else b"\n"))
        await proc.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        pass  # the process does not read its input; that is its business


# What an executor inherits of the daemon's environment; nothing else of it (its secrets,
# its LD_PRELOAD) reaches a process a client asked for.
INHERITED_ENV = frozenset({"PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "LANGUAGE",
                           "TERM", "TZ", "TMPDIR", "XDG_RUNTIME_DIR"})
# Keys a client may not set: they make the dynamic loader or Python run other code.
REFUSED_ENV_PREFIXES = ("LD_", "PYTHON")


def _inherited_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k in INHERITED_ENV or k.startswith("LC_")}


def _check_spawn(p: rpc.SessionSpawnParams) -> None:
    """Refuse (-32602, naming the field) what a process cannot be started with."""
    for key, value in p.env.items():
        path = f"$.env.{key}"
        if key.startswith(REFUSED_ENV_PREFIXES):
            raise InvalidParamsError(
                f"env key {key} is not allowed: LD_* and PYTHON* variables are refused",
                {"detail": "refused environment variable", "path": path})
        if not key or "=" in key or "\0" in key or "\0" in value:
            raise InvalidParamsError(f"env key {key!r} or its value cannot be an environment"
                                     " variable (empty, '=' or NUL)",
                                     {"detail": "invalid environment variable", "path": path})
    for i, arg in enumerate(p.argv):
        if "\0" in arg:
            raise InvalidParamsError(f"argv[{i}] holds a NUL character",
                                     {"detail": "NUL in argument", "path": f"$.argv[{i}]"})
    if p.cwd is not None and "\0" in p.cwd:
        raise InvalidParamsError("cwd holds a NUL character",
                                 {"detail": "NUL in path", "path": "$.cwd"})


def _cannot_start(argv: list[str], cwd: str | None, path: str | None) -> str | None:
    """Say in words why the command cannot start, before trying."""
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
        return f"executable not found on PATH: {program}"
    return None


def _outcome(turn: Turn, code: int | None, signum: int | None) -> tuple[str, str | None]:
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


def _truncate_step(step: rpc.Step, limit: int) -> rpc.Step:
    def cut(value: Any) -> Any:
        if isinstance(value, str) and len(value) > limit:
            return value[:limit] + "…"
        return value

    return rpc.Step(type=step.type, summary=cut(step.summary), turn=step.turn,
                    details={k: cut(v) for k, v in step.details.items()})
