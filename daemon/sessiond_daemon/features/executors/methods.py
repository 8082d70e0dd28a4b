"""The executor runner's methods: session.spawn, inject, kill, output and trajectory.

Agent CLIs run as supervised sessions. A turn's process and output belong to turns.py,
the processes themselves (spawning, pidfds, signals) to processes.py, the turns a previous
daemon left to recovery.py, and what the stored history says to trajectory.py.
"""

from __future__ import annotations

import os
from typing import Any

import anyio
import msgspec
from anyio.abc import TaskStatus

from sessiond_daemon.core.commands import Commands, check_transition, require
from sessiond_daemon.core.request import page_budget
from sessiond_daemon.core.writer import Plan, PlanData
from sessiond_daemon.features.executors.adapters import ADAPTERS
from sessiond_daemon.features.executors.processes import REFUSED_ENV_PREFIXES
from sessiond_daemon.features.executors.recovery import (
    Recovery,
    latest_resume_id,
    owner_host,
    runner_rows,
)
from sessiond_daemon.features.executors.trajectory import (
    TRAJECTORY_TYPES,
    decode_cursor,
    encode_cursor,
    last_turn,
    steps,
    truncate_step,
)
from sessiond_daemon.features.executors.turns import Settings, Turn, Turns, plan_of
from sessiond_daemon.stores.interface import Store
from sessiond_schemas import rpc
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    OtherHostError,
    OverloadedError,
    SessionExistsError,
    ShuttingDownError,
)
from sessiond_schemas.events import (
    ALLOWED_TRANSITIONS,
    Data,
    EventMeta,
    MessageAppended,
    MessageFields,
    SessionCreated,
    new_id,
)
from sessiond_schemas.state import SessionState

__all__ = ["Executors", "Settings"]
TRAJECTORY_READ = 1000  # events read for one page of session.trajectory (and its bytes)


class Executors:
    """Starts, watches and stops executor processes; serves the executor methods."""

    def __init__(self, commands: Commands, store: Store, settings: Settings) -> None:
        self.commands = commands
        self.store = store
        self.turns = Turns(commands, settings)
        self.recovery = Recovery(commands, store, settings.host)
        self.running: dict[str, Turn] = self.turns.running
        self._starting: set[str] = set()  # sessions between the check and process.started
        self._closed = False

    @property
    def settings(self) -> Settings:
        return self.turns.settings

    @settings.setter
    def settings(self, value: Settings) -> None:  # lifecycle adds the socket once bound
        self.turns.settings = value

    # --- lifetime ---------------------------------------------------------------------

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Recover turns a previous daemon left, then supervise until cancelled."""
        async with anyio.create_task_group() as tg:
            self.turns.tasks = tg
            await self.recovery.recover(tg)
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
                tg.start_soon(self.turns.terminate, t.handle)
        for t in turns:
            await t.done.wait()

    # --- methods ----------------------------------------------------------------------

    async def session_spawn(self, p: rpc.SessionSpawnParams, meta: EventMeta) -> msgspec.Raw:
        if p.cwd is not None and not os.path.isabs(p.cwd):
            raise InvalidParamsError(f"cwd must be an absolute path: {p.cwd!r}",
                                     {"detail": "relative path", "path": "$.cwd"})
        check_spawn(p)
        self._check_capacity()
        sid = p.session_id or new_id()
        event = SessionCreated(
            task=p.task, working_dir=p.cwd, model=p.model, adapter=p.adapter, source=p.source,
            metadata=p.metadata, status="active")
        if p.namespace:
            event = msgspec.structs.replace(event, namespace=p.namespace)
        self.commands.check_event_size(event, "session.created data")
        task = MessageFields(role="user", content=p.task) if p.task and p.task.strip() else None

        def plan(state: SessionState | None) -> Plan:
            if state is not None:
                raise SessionExistsError(f"session {sid} already exists", {"session_id": sid})
            first: list[tuple[str, PlanData]] = [("session.created", event)]
            if task is not None:
                first.append(("message.appended", MessageAppended(
                    role=task.role, content=task.content, message_id=new_id(), sequence=0)))
            return Plan(first, lambda s, ev: s)

        self._starting.add(sid)
        try:
            await self.commands.submit(sid, meta, plan)
            return await self.turns.start(sid, meta, ADAPTERS[p.adapter], p.argv, p.cwd, p.env,
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
            state = await self.commands.state(sid)
            adapter = ADAPTERS.get(state.adapter or "")
            # Only what this daemon's runner recorded: an imported argv is never run.
            started = [d for _, d in await runner_rows(self.store, sid,
                                                       ("process.started",))]
            if started:
                self._check_host(sid, started[-1], "continue")
            if adapter is None or not started:
                raise InvalidParamsError(
                    f"session {sid} has no executor to continue: {no_executor(state)}",
                    {"detail": "no executor", "path": "$.session_id"})
            if state.status == "active":
                raise InvalidTransitionError(
                    f"session {sid} is active (its process is not supervised by this daemon);"
                    " kill it first", {"from": "active", "to": "active",
                                       "allowed": list(ALLOWED_TRANSITIONS["active"])})
            self._check_capacity(starting=1)  # this session is counted in _starting
            try:
                argv = adapter.resume_argv(
                    started[0]["argv"], await latest_resume_id(self.store, sid, adapter),
                    p.message, state.model)
            except ValueError as exc:
                raise InvalidParamsError(f"session {sid}: {exc}",
                                         {"detail": str(exc), "path": "$.session_id"}) from None

            def plan(s: SessionState | None) -> Plan:
                s = require(s, sid)
                check_transition(sid, s.status, "active")
                return plan_of(s, [
                    ("message.appended", {"role": "user", "content": p.message}),
                    ("session.status_changed", {"to": "active", "reason": "message injected"})])

            await self.commands.submit(sid, meta, plan)
            return await self.turns.start(
                sid, meta, adapter, argv, started[-1].get("cwd"), {}, state.turn + 1,
                p.message if adapter.message_on_stdin else None)
        finally:
            self._starting.discard(sid)

    async def session_kill(self, p: rpc.SessionRef, meta: EventMeta) -> msgspec.Raw:
        sid = p.session_id
        turn = self.running.get(sid)
        if turn is not None:
            turn.killing = True
            await self.turns.terminate(turn.handle)
            await turn.done.wait()
            return msgspec.Raw(msgspec.json.encode(await self.commands.state(sid)))
        state = await self.commands.state(sid)
        if sid not in self.recovery.detached:
            started = await runner_rows(self.store, sid, ("process.started",))
            if started:
                self._check_host(sid, started[-1][1], "kill")
        check_transition(sid, state.status, "killed")
        exited: list[tuple[str, dict[str, Any]]] = []
        # Only a process this daemon started, or one a previous daemon started that was
        # proven at start-up to still be it: a pid in the stored events is never a target.
        detached = self.recovery.detached.pop(sid, None)
        if detached is not None:
            handle, turn_no = detached
            # Not our child, so its exit status is unknown.
            await self.turns.terminate(handle)
            # As JSON: a ProcessExited would store the unknown exit status, signal and line
            # counts as nulls, which this record has never held.
            exited.append(("process.exited", {"pid": handle.pid, "turn": turn_no}))

        def plan(s: SessionState | None) -> Plan:
            s = require(s, sid)
            check_transition(sid, s.status, "killed")
            return plan_of(s, [*exited, ("session.status_changed", {
                "to": "killed", "reason": "killed", "error": "Manually killed"})])

        return await self.commands.submit(sid, meta, plan)

    async def session_output(self, p: rpc.SessionOutputParams, meta: EventMeta) -> rpc.OutputResult:
        state = await self.commands.state(p.session_id)
        turn = p.turn or state.turn
        if not 1 <= turn <= state.turn:
            raise InvalidParamsError(
                f"session {p.session_id} has no turn {turn}: " + (
                    no_executor(state) if state.turn == 0
                    else f"its turns are 1 to {state.turn}"),
                {"detail": "no such turn", "path": "$.turn" if p.turn else "$.session_id",
                 "turns": state.turn})
        page = await self.store.process_output(
            p.session_id, turn, p.stream, p.after_position, max_bytes=page_budget.get())
        return rpc.OutputResult(turn=turn, lines=[line for _, line in page],
                                next=page[-1][0] if page.cut else None,
                                truncated_by_bytes=page.cut)

    async def session_trajectory(self, p: rpc.SessionTrajectoryParams,
                                 meta: EventMeta) -> rpc.TrajectoryResult:
        """A page of the session's steps: built from one read of its trajectory events of
        at most max_page_bytes (one event at least), so a history of any size is read a
        page at a time; `next_cursor` goes on after it."""
        state = await self.commands.state(p.session_id)
        version, turn, running = (decode_cursor(p.cursor) if p.cursor is not None
                                  else (1, 0, False))
        events = await self.store.read_events(
            session_id=p.session_id, from_version=version, after_position=0,
            limit=TRAJECTORY_READ, types=list(TRAJECTORY_TYPES), max_bytes=page_budget.get())
        rows: list[Data] = [e.data for e in events]
        found = steps(rows, ADAPTERS.get(state.adapter or ""), turn, running)
        if not p.full:
            found = [truncate_step(s, p.max_output_len) for s in found]
        more = bool(events) and (events.cut or len(events) == TRAJECTORY_READ)
        return rpc.TrajectoryResult(
            steps=found, truncated_by_bytes=events.cut,
            next_cursor=encode_cursor(events[-1].version + 1, *last_turn(rows, turn, running))
            if more else None)

    def _check_host(self, sid: str, started: dict[str, Any], action: str) -> None:
        """-32013 naming the host whose daemon started the session's executor, if that is
        not this one: only that daemon supervises, continues or kills it."""
        host = owner_host(started, self.settings.host)
        if host != self.settings.host:
            raise OtherHostError(
                f"session {sid}'s executor belongs to host {host}, not to this daemon's host"
                f" {self.settings.host}; {action} it through host {host}'s daemon",
                {"session_id": sid, "host": host})

    def _check_capacity(self, starting: int = 0) -> None:
        if self._closed:
            raise ShuttingDownError("the daemon is shutting down")
        if len(self.running) + len(self._starting) - starting >= self.settings.max_processes:
            raise OverloadedError(
                f"{self.settings.max_processes} executors are running (max_processes); retry later",
                {"retry_after_ms": 1000})


def no_executor(state: SessionState) -> str:
    """Why a session has no turn to continue or read, in words: its spawn failed to start
    the process, its turns came with an import (never continued), or no spawn made it."""
    if state.turn == 0 and state.adapter and state.status == "failed" and state.error:
        return f"its executor never started ({state.error}); spawn it again"
    if state.turn > 0:
        return "its turns were imported, and an imported executor history is never continued"
    return "no executor was ever started for it (session.spawn starts one)"


def check_spawn(p: rpc.SessionSpawnParams) -> None:
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
