"""Restart recovery: the turns a previous daemon left, decided at start and watched after.

A turn whose process provably still runs (processes.Handle.of_record) is adopted as
detached: its output is no longer captured, `session.kill` may end it, and its exit is
waited for through the pidfd opened for the proof. Anything else is recorded as lost.
"""

from __future__ import annotations

import os
from typing import Any

import structlog
from anyio.abc import TaskGroup

from sessiond_daemon.core.commands import Commands, require
from sessiond_daemon.core.writer import Plan
from sessiond_daemon.features.executors.adapters import Adapter
from sessiond_daemon.features.executors.processes import Handle, stat, valid_pid
from sessiond_daemon.features.executors.turns import plan_of
from sessiond_daemon.stores.interface import Store
from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import EventMeta, new_id
from sessiond_schemas.state import SessionState

log = structlog.get_logger("sessiond.executors")


async def runner_rows(store: Store, sid: str,
                      types: tuple[str, ...]) -> list[tuple[str, Any]]:
    """A session's turn events of `types` (process.started, .exited, .detached) that this
    daemon's runner wrote: those after the marker an import puts after the history it
    brought (features/maintenance.py). What came before it is another daemon's history, never
    acted on. Read from the runner index: one row per turn event, never the output."""
    rows = await store.runner_events(sid, tuple(sorted({*types, "process.detached"})))
    marks = [i for i, (kind, _, d) in enumerate(rows)
             if kind == "process.detached" and d.get("imported") is True]
    return [(kind, d) for kind, _, d in rows[marks[-1] + 1 if marks else 0:] if kind in types]


async def latest_resume_id(store: Store, sid: str, adapter: Adapter) -> str | None:
    """The last thread or session id the executor's stdout named, for its next turn (never
    one from before an import's marker). Walks the runner index's output lines newest
    first, a page at a time, and stops at the first that names one: O(1) pages for the
    adapters there are (their last turn names it), whatever the output history."""
    before: int | None = None
    while True:
        rows = await store.runner_events(sid, ("process.output", "process.detached"),
                                         newest_first=True, before_version=before, limit=64)
        for kind, _, d in rows:
            if kind == "process.detached":
                if d.get("imported") is True:
                    return None
            elif d.get("stream", "stdout") == "stdout":
                parsed = adapter.parse(d["line"])
                if parsed is not None and parsed.resume_id:
                    return parsed.resume_id
        if len(rows) < 64:
            return None
        before = rows[-1][1]


def owner_host(started: dict[str, Any], default: str) -> str:
    """The host whose daemon started a turn (process.started's `host`); a record from
    before hosts were recorded is the local host's."""
    host = started.get("host")
    return host if isinstance(host, str) and host else default


class Recovery:
    """Decides the open turns at start; holds the adopted ones until they end or are killed."""

    def __init__(self, commands: Commands, store: Store, host: str) -> None:
        self.commands = commands
        self.store = store
        self.host = host  # this daemon's host name: another host's turns are not ours
        # Turns a previous daemon left running, proven ours at start-up: sid -> (handle, turn).
        self.detached: dict[str, tuple[Handle, int]] = {}

    async def recover(self, tg: TaskGroup) -> None:
        """Decide the open turn of every active executor session. Stored data never stops
        the start: what cannot be decided is logged and left as it is."""
        try:
            sessions = await self.store.sessions_with_process()
        except Exception:
            log.exception("executor.recovery_failed", error_id=new_id())
            return
        for sid in sessions:
            try:
                await self._recover_one(tg, sid)
            except Exception:
                log.exception("executor.recovery_failed", session_id=sid, error_id=new_id())

    async def _open_turn(self, sid: str) -> tuple[dict[str, Any], bool] | None:
        """The last process.started of a session if no exit was recorded after it, and
        whether a restart already recorded it as detached."""
        rows = await runner_rows(self.store, sid,
                                 ("process.started", "process.exited", "process.detached"))
        starts = [i for i, (kind, _) in enumerate(rows) if kind == "process.started"]
        if not starts or any(kind == "process.exited" for kind, _ in rows[starts[-1]:]):
            return None
        if owner_host(rows[starts[-1]][1], self.host) != self.host:
            return None  # another host's daemon supervises it (fleet mode)
        return rows[starts[-1]][1], any(kind == "process.detached" for kind, _ in rows[starts[-1]:])

    async def _recover_one(self, tg: TaskGroup, sid: str) -> None:
        found = await self._open_turn(sid)
        if found is None:
            return
        last, detached = found
        raw_pid, raw_turn = last.get("pid"), last.get("turn")
        pid = raw_pid if type(raw_pid) is int and -(1 << 63) <= raw_pid < 1 << 63 else -1
        turn_no = raw_turn if type(raw_turn) is int else 0
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
            return plan_of(require(s, sid), events)

        meta = EventMeta(peer_uid=os.getuid(), peer_pid=os.getpid())
        try:
            await self.commands.submit(sid, meta, plan)
        except SessiondError as exc:
            log.error("executor.recovery_failed", session_id=sid, error=exc.message)

    async def _watch_detached(self, sid: str, handle: Handle, turn_no: int) -> None:
        """A detached executor that ends by itself: record it (its exit status is unknown).
        Its exit comes from the pidfd the proof opened (a slow /proc poll without one)."""
        pid = handle.pid
        try:
            await handle.wait_exit()
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
            return plan_of(s, events)

        try:
            await self.commands.submit(sid, EventMeta(peer_uid=os.getuid(), peer_pid=pid), plan)
        except SessiondError as exc:
            log.error("executor.recovery_failed", session_id=sid, error=exc.message)
