"""The daemon-wide budget of reply bytes held (built and not yet sent) across connections.

`max_reply_buffer` bounds one connection; this bounds them all together, so that many
clients that send and never read cannot take the host's memory. Each connection's
`Holding` counts what its requests in flight may build (each reserves its share of
`max_page_bytes` before it runs), the answers built and not handed to its transport yet,
and its transport's unsent bytes (sampled after each write and drain). Past three
quarters of the budget, the connections holding more than their share are not read any
more; a reservation or an answer that would take the total past the budget first closes
the connection holding the most bytes built and unsent (never one holding none: a
reservation is an estimate, a ping reserves a page, so honest clients that read are not
closed for asking at once; they wait, unread, meanwhile). Memory given back by closed
connections and drained buffers is returned to the operating system (glibc keeps freed
blocks in its arenas, so RSS would stay up).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable
from functools import cache

import anyio
import structlog

log = structlog.get_logger("sessiond.rpc")

MAX_DEFAULT = 512 << 20  # the default budget's ceiling
MEMORY_SHARE = 8  # the default budget: an eighth of the machine's memory, at most 512 MiB
TRIM_STEP = 32 << 20  # bytes given back since the last trim that call for one
TRIM_EVERY_S = 1.0  # trims at most this often
TRIM_FOLLOW_UPS = 5  # trims after one that gave memory back, a second apart
CONNECTION_SHARE = 8  # a connection holding more than this part of the budget is not read
PAUSED_POLL_S = 0.05  # a paused connection looks again at its own buffer this often


def default_budget(meminfo: str = "/proc/meminfo") -> int:
    """An eighth of MemTotal, at most 512 MiB (512 MiB when MemTotal cannot be read)."""
    try:
        with open(meminfo) as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return max(16 << 20, min(MAX_DEFAULT, int(line.split()[1]) * 1024
                                             // MEMORY_SHARE))
    except (OSError, ValueError, IndexError):
        pass
    return MAX_DEFAULT


@cache
def _malloc_trim() -> Callable[[int], int] | None:
    """glibc's malloc_trim, or None (musl, macOS: nothing to call)."""
    name = ctypes.util.find_library("c")
    if name is None:
        return None
    with contextlib.suppress(OSError):
        libc = ctypes.CDLL(name)
        trim = getattr(libc, "malloc_trim", None)
        if trim is not None:
            trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
            return trim  # type: ignore[no-any-return]
    return None


class Holding:
    """One connection's reply bytes: built and waiting, and unsent in its transport."""

    __slots__ = ("buffered", "building", "close", "closed", "most", "paused", "peer",
                 "waiting")

    def __init__(self, peer: tuple[int, int], close: Callable[[str], None]) -> None:
        self.peer = peer  # (pid, uid): for the log
        self.close = close  # ends the connection at once (its answers are dropped)
        self.building = 0  # reserved by requests in flight, for the answers they build
        self.waiting = 0  # answers built, not yet handed to the transport
        self.buffered = 0  # the transport's unsent bytes, when last sampled
        self.most = 0  # the most it held unsent at once
        self.closed = False
        self.paused = False

    @property
    def held(self) -> int:
        return self.building + self.waiting + self.buffered

    @property
    def unsent(self) -> int:
        """Built, and not taken by the client yet: what a client that does not read holds."""
        return self.waiting + self.buffered


class ReplyBudget:
    """Every connection's Holding, their total, and what is done past the budget."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0  # every holding's `held`
        self.unsent = 0  # every holding's `unsent`
        self.closed = 0  # connections closed by the budget since start
        self._holdings: set[Holding] = set()
        self._room: anyio.Event | None = None  # set when the total falls under the mark
        self._reached = False  # logged once per time the mark is passed
        self._high = 0  # the most held since the last trim
        self._last_trim = 0.0
        self._trim_pending = False
        self._released = 0  # held by connections closed since the last trim
        self._released_late = 0  # the most held by transports closed since the last trim

    @property
    def mark(self) -> int:
        """Past this total, the connections holding more than their share are not read."""
        return self.limit * 3 // 4

    @property
    def paused(self) -> int:
        return sum(1 for h in self._holdings if h.paused)

    def join(self, holding: Holding) -> None:
        self._holdings.add(holding)

    def leave(self, holding: Holding) -> None:
        """The connection is gone: what it held is given back."""
        if holding in self._holdings:
            self._holdings.discard(holding)
            self._released += holding.unsent
            self.unsent -= holding.unsent
            self._change(-holding.held)
        holding.building = holding.waiting = holding.buffered = 0
        holding.closed = True

    def reserve(self, holding: Holding, delta: int) -> None:
        """Count `delta` more (or fewer) bytes that requests in flight may build."""
        if not holding.closed:
            holding.building += delta
            self._change(delta)

    def wait(self, holding: Holding, delta: int) -> None:
        """Count `delta` more (or fewer) built answers not yet handed to the transport."""
        if not holding.closed:
            holding.waiting += delta
            self.unsent += delta
            if delta > 0:
                holding.most = max(holding.most, holding.unsent)
            self._change(delta)

    def sample(self, holding: Holding, transport: asyncio.WriteTransport) -> None:
        """Take the transport's unsent bytes as this connection's buffered bytes."""
        if not holding.closed:
            size = transport.get_write_buffer_size()
            delta, holding.buffered = size - holding.buffered, size
            self.unsent += delta
            if delta > 0:
                holding.most = max(holding.most, holding.unsent)
            self._change(delta)

    def make_room(self, holding: Holding, size: int, *, built: bool) -> bool:
        """Before `size` bytes are counted for `holding` (`built`: an answer, else a
        reservation): while they would take the total past the budget, close the
        connection holding the most bytes built and unsent, if any holds some. False if
        that was `holding` itself (its answer is dropped)."""
        while self.total + size > self.limit and self._holdings:
            # By what each already holds unsent: the answer being counted is not held yet,
            # so a client that reads (none unsent) is never closed for its own answer.
            worst = max(self._holdings, key=lambda h: h.unsent)
            if worst.unsent == 0:
                break
            self.closed += 1
            pid, uid = worst.peer
            log.warning("server.memory_budget_closed", peer_pid=pid, peer_uid=uid,
                        held_bytes=worst.unsent, total_bytes=self.unsent, limit=self.limit,
                        setting="max_reply_buffer_total")
            reason = (f"the daemon holds {self.unsent + size} reply bytes built and unsent,"
                      f" past its budget of {self.limit} (max_reply_buffer_total), and this"
                      " connection held the most")
            self.leave(worst)
            worst.close(reason)
            if worst is holding:
                return False
        return True

    async def room_to_read(self, holding: Holding,
                           resample: Callable[[], None]) -> None:
        """Wait while the total is past the mark and this connection holds more than its
        share: it is not read meanwhile (its requests wait in the socket)."""
        while self.over(holding):
            if not holding.paused:
                holding.paused = True
                if not self._reached:
                    self._reached = True
                    log.warning("server.memory_budget_reached", total_bytes=self.total,
                                limit=self.limit, setting="max_reply_buffer_total",
                                connections=len(self._holdings))
                pid, uid = holding.peer
                log.info("server.memory_budget_paused", peer_pid=pid, peer_uid=uid,
                         held_bytes=holding.held)
            self._room = self._room or anyio.Event()
            # Woken when the total falls under the mark, or soon, to look at its own
            # buffer again (its client may have read: nothing else samples it now).
            with anyio.move_on_after(PAUSED_POLL_S):
                await self._room.wait()
            resample()
        if holding.paused:
            holding.paused = False
            pid, uid = holding.peer
            log.info("server.memory_budget_resumed", peer_pid=pid, peer_uid=uid,
                     held_bytes=holding.held)

    def over(self, holding: Holding) -> bool:
        """Whether `holding`'s connection must not be read now (see room_to_read)."""
        if holding.closed:
            return False
        if holding.held > self.limit // CONNECTION_SHARE:
            return True  # no one connection takes more than an eighth, however quiet the rest
        if self.total <= self.mark:
            return False
        holders = sum(1 for h in self._holdings if h.held) or 1
        return holding.held > self.limit // holders

    def _change(self, delta: int) -> None:
        self.total += delta
        if delta > 0:
            self._high = max(self._high, self.unsent)
            return
        if self.total <= self.mark:
            self._reached = False
            if self._room is not None:
                self._room.set()
                self._room = None
        # Trims follow real bytes (answers built), not reservations (estimates).
        if (self._high - self.unsent >= TRIM_STEP or self._released >= TRIM_STEP
                or (self._released and not self.unsent)):
            self._schedule_trim()

    def transport_closed(self, holding: Holding) -> None:
        """A connection's transport is closed: the bytes it held are freed only now, some
        perhaps after the trims `leave` called for. Counted as released by the most it
        held unsent at once (the transport's buffer keeps the memory it grew to), they
        call for a trim by the same rule."""
        self._released_late += holding.most
        holding.most = 0
        if self._released_late >= TRIM_STEP or (self._released_late and not self.unsent):
            self._schedule_trim()

    def _schedule_trim(self) -> None:
        """Give freed memory back to the OS soon (the bytes are freed once the tasks and
        transports holding them let go), at most once every TRIM_EVERY_S."""
        if self._trim_pending or _malloc_trim() is None:
            return
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return
        self._trim_pending = True
        delay = max(0.1, self._last_trim + TRIM_EVERY_S - time.monotonic())
        loop.call_later(delay, self._trim)

    def _trim(self, again: int = TRIM_FOLLOW_UPS) -> None:
        self._trim_pending = False
        self._last_trim = time.monotonic()
        self._high, self._released, self._released_late = self.unsent, 0, 0
        trim = _malloc_trim()
        if trim is None:
            return
        started = time.perf_counter()
        released = trim(0)
        log.debug("server.memory_trimmed", released=bool(released), pid=os.getpid(),
                  took_ms=round((time.perf_counter() - started) * 1000, 1))
        # What the closed connections held is freed as their tasks and transports end,
        # some of it after this trim: look again while trims still give memory back.
        if released and again and not self._trim_pending:
            self._trim_pending = True
            asyncio.get_running_loop().call_later(TRIM_EVERY_S, self._trim, again - 1)
