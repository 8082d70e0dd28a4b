"""Sessions that end by themselves: the periodic sweep that ends sessions idle for their TTL.

A session's view holds `expires_at` (its last event's time + `ttl_s`, while it is
pending, active or paused), and each store keeps it in an indexed column, so a sweep
reads only the sessions that are due, a page at a time, however many sessions there
are. Each due session is decided again in the writer against its current view: one
written to since the page was read is no longer due and is left alone. In fleet mode
every daemon sweeps; the writer's version check makes a second daemon's attempt on a
session another has just expired a no-op (it reloads the view, finds it expired).
"""

from __future__ import annotations

import os
from collections.abc import Callable

import anyio
import structlog

from sessiond_daemon.core.commands import Commands
from sessiond_daemon.core.writer import Plan
from sessiond_daemon.stores.interface import Store
from sessiond_schemas.errors import SessiondError
from sessiond_schemas.events import EXPIRABLE, EventMeta, SessionExpired, now
from sessiond_schemas.state import SessionState

log = structlog.get_logger("sessiond.expiry")

PAGE = 500  # due sessions submitted together (one group commit), then the next page


class _NotDue(SessiondError):
    """The session was written to (or ended, or deleted) since the page was read."""


def due(state: SessionState | None, at: str) -> bool:
    """Whether the idle TTL of `state` has passed at time `at` (the events' time format)."""
    return (state is not None and state.ttl_s is not None and state.status in EXPIRABLE
            and state.expires_at is not None and state.expires_at <= at)


class Expiry:
    """Ends sessions whose idle TTL has passed (`sweep`), every `every_s` (`run`)."""

    def __init__(self, store: Store, commands: Commands, *,
                 clock: Callable[[], str] = now) -> None:
        self.store = store
        self.commands = commands
        self.clock = clock  # tests pass their own to drive time
        self.meta = EventMeta(peer_uid=os.getuid(), peer_pid=os.getpid())

    async def sweep(self) -> list[str]:
        """End every session due now; return the ids this daemon ended."""
        ended: list[str] = []
        after: tuple[str, str] | None = None
        while page := await self.store.expiring_sessions(self.clock(), after, PAGE):
            async with anyio.create_task_group() as tg:  # submitted together: one commit
                for _, sid in page:
                    tg.start_soon(self._expire, sid, ended)
            if len(page) < PAGE:
                break
            after = page[-1]
        if ended:
            log.info("session.expired", count=len(ended))
        return sorted(ended)

    async def _expire(self, sid: str, ended: list[str]) -> None:
        def plan(state: SessionState | None) -> Plan:
            # Decided in the writer, on the view as it is now (the stored one in fleet mode).
            if state is None or not due(state, self.clock()):
                raise _NotDue(sid)
            assert state.ttl_s is not None
            data = SessionExpired(ttl_s=state.ttl_s, idle_since=state.timestamps.updated_at)
            return Plan([("session.expired", data)], lambda s, ev: s)

        try:
            await self.commands.submit(sid, self.meta, plan)
            ended.append(sid)
        except _NotDue:
            pass
        except SessiondError as exc:  # this session (damaged, say): the others go on
            log.warning("expiry.session_failed", session_id=sid, error=exc.message)

    async def run(self, every_s: float) -> None:
        """Sweep every `every_s` seconds until cancelled; a failed sweep is said, then retried."""
        while True:
            try:
                await self.sweep()
            except SessiondError as exc:
                log.warning("expiry.failed", error=exc.message)
            await anyio.sleep(every_s)
