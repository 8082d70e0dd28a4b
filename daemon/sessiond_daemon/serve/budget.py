"""The daemon-wide memory budget: the bytes every face's connections hold, together.

`max_reply_buffer` bounds one connection; this bounds them all together, on every face
(the RPC socket, the HTTP face whatever its route, the metrics listener), so that many
clients that send and never read, or never finish sending, cannot take the host's
memory. Each connection's `Holding` counts:

- what its requests in flight may build: first an estimate (each reserves its share of
  `max_page_bytes` before it runs), then the real size of each item a paged read takes
  from the store (`Reservation`, through `stores.rows.page_reserve`), counted before the
  answer is built from it: a 16 MB event reserves its 16 MB;
- the answers built and not handed to its transport yet, and its transport's unsent bytes
  (sampled after each write and drain);
- the request bytes it has sent and the daemon holds: an unfinished line on the socket,
  a request body being received on HTTP.

Past three quarters of the budget, the connections holding more than their share are not
read any more (paused); a reservation, an answer or received bytes that would take the
total past the budget first close the connections holding the most real bytes (built,
unsent, received, or reserved by size; never one holding only an estimate: a ping
reserves a page, so honest clients that read are not closed for asking at once). A
reservation by size that still finds no room is refused (-32008). Memory given back by
closed connections, drained buffers and finished requests, on any face, is returned to
the operating system (glibc keeps freed blocks in its arenas, so RSS would stay up).
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import ctypes.util
import os
import time
from collections.abc import Callable
from contextlib import AbstractAsyncContextManager
from functools import cache
from typing import Any

import anyio
import structlog

from sessiond_schemas.errors import OverloadedError

log = structlog.get_logger("sessiond.rpc")

MAX_DEFAULT = 512 << 20  # the default budget's ceiling
MEMORY_SHARE = 8  # the default budget: an eighth of the machine's memory, at most 512 MiB
TRIM_STEP = 32 << 20  # bytes given back since the last trim that call for one
TRIM_EVERY_S = 1.0  # trims at most this often
TRIM_FOLLOW_UPS = 5  # trims after one that gave memory back, a second apart
CONNECTION_SHARE = 8  # a connection holding more than this part of the budget is not read
PAUSED_POLL_S = 0.05  # a paused connection looks again at its own buffer this often
COPIES = 2  # an item read is held twice while its answer is built: the row, the answer
FETCHES = 1  # paged reads fetching rows not yet counted, at once, daemon-wide


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


M_MMAP_THRESHOLD = -3  # mallopt's parameter (glibc's malloc.h)
MMAP_THRESHOLD = 1 << 20  # blocks this large are mapped alone, and unmapped when freed


@cache
def tune_allocator() -> bool:
    """On glibc, map every block of MMAP_THRESHOLD or more on its own (a fixed threshold:
    glibc's own rises to 32 MiB after a large block is freed, and 16 MB answers would then
    come from the heap and stay in it), so that a large answer, line or body goes back to
    the OS as soon as it is freed. True if set."""
    name = ctypes.util.find_library("c")
    if name is None:
        return False
    with contextlib.suppress(OSError):
        mallopt = getattr(ctypes.CDLL(name), "mallopt", None)
        if mallopt is not None:
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD))
    return False


class Holding:
    """One connection's bytes in the budget, whatever its face."""

    __slots__ = ("buffered", "building", "close", "closed", "most", "paused", "peer",
                 "receiving", "sized", "waiting")

    def __init__(self, peer: tuple[int, int], close: Callable[[str], None]) -> None:
        self.peer = peer  # (pid, uid): for the log (-1 where unknown: TCP)
        self.close = close  # ends the connection at once (its answers are dropped)
        self.building = 0  # estimated by requests in flight, for the answers they build
        self.sized = 0  # reserved by requests in flight for the items they read (real)
        self.waiting = 0  # answers built, not yet handed to the transport
        self.buffered = 0  # the transport's unsent bytes, when last sampled
        self.receiving = 0  # request bytes received and held: a line, a body
        self.most = 0  # the most it held unsent or received at once
        self.closed = False
        self.paused = False

    @property
    def held(self) -> int:
        return self.building + self.sized + self.waiting + self.buffered + self.receiving

    @property
    def unsent(self) -> int:
        """Built, and not taken by the client yet: what a client that does not read holds."""
        return self.waiting + self.buffered

    @property
    def weight(self) -> int:
        """The real bytes it holds (no estimate): what closing it gives back."""
        return self.sized + self.waiting + self.buffered + self.receiving


class ReplyBudget:
    """Every connection's Holding, on every face, their total, and what is done past the
    budget."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.total = 0  # every holding's `held`
        self.unsent = 0  # every holding's `unsent`
        self.real = 0  # every holding's `weight`
        self.closed = 0  # connections closed by the budget since start
        self.refused = 0  # reservations by size refused since start
        self._holdings: set[Holding] = set()
        self._room: anyio.Event | None = None  # set when the total falls under the mark
        self._reached = False  # logged once per time the mark is passed
        self._high = 0  # the most real bytes held since the last trim
        self._last_trim = 0.0
        self._trim_pending = False
        self._released = 0  # held by connections closed since the last trim
        self._released_late = 0  # the most held by transports closed since the last trim
        self.fetching = asyncio.Semaphore(FETCHES)  # see Reservation
        tune_allocator()

    @property
    def mark(self) -> int:
        """Past this total, the connections holding more than their share are not read."""
        return self.limit * 3 // 4

    @property
    def paused(self) -> int:
        return sum(1 for h in self._holdings if h.paused)

    @property
    def received(self) -> int:
        """Request bytes held across the connections (lines, bodies being received)."""
        return sum(h.receiving for h in self._holdings)

    def join(self, holding: Holding) -> None:
        self._holdings.add(holding)

    def leave(self, holding: Holding) -> None:
        """The connection is gone: what it held is given back."""
        if holding in self._holdings:
            self._holdings.discard(holding)
            self._released += holding.weight
            self.unsent -= holding.unsent
            self.real -= holding.weight
            self._change(-holding.held)
        holding.building = holding.sized = holding.waiting = holding.buffered = 0
        holding.receiving = 0
        holding.closed = True

    def reserve(self, holding: Holding, delta: int) -> None:
        """Count `delta` more (or fewer) bytes that requests in flight may build."""
        if not holding.closed:
            holding.building += delta
            self._change(delta)

    def size(self, holding: Holding, delta: int) -> None:
        """Count `delta` more (or fewer) bytes reserved by size (Reservation)."""
        if not holding.closed:
            holding.sized += delta
            self.real += delta
            self._change(delta)

    def receive(self, holding: Holding, delta: int) -> None:
        """Count `delta` more (or fewer) request bytes received and held."""
        if not holding.closed:
            holding.receiving += delta
            self.real += delta
            if delta > 0:
                holding.most = max(holding.most, holding.weight)
            else:
                self._released += -delta
            self._change(delta)

    def wait(self, holding: Holding, delta: int) -> None:
        """Count `delta` more (or fewer) built answers not yet handed to the transport."""
        if not holding.closed:
            holding.waiting += delta
            self.unsent += delta
            self.real += delta
            if delta > 0:
                holding.most = max(holding.most, holding.weight)
            self._change(delta)

    def sample(self, holding: Holding, transport: asyncio.WriteTransport) -> None:
        """Take the transport's unsent bytes as this connection's buffered bytes."""
        if not holding.closed:
            size = transport.get_write_buffer_size()
            delta, holding.buffered = size - holding.buffered, size
            self.unsent += delta
            self.real += delta
            if delta > 0:
                holding.most = max(holding.most, holding.weight)
            self._change(delta)

    def make_room(self, holding: Holding, size: int, *, built: bool) -> bool:
        """Before `size` bytes are counted for `holding` (`built`: real bytes, an answer,
        received bytes or a reservation by size; else an estimate, which closes nothing):
        while they would take the real bytes held past the budget, close the connection
        holding the most of them. False if that was `holding` itself (its bytes are
        dropped)."""
        # Only real bytes close a connection: estimates (a page share per request, many
        # more than the budget when many clients ask at once) only pause reading.
        while built and self.real + size > self.limit and self._holdings:
            # By what each already holds: the bytes being counted are not held yet, so a
            # client that reads (none unsent) is never closed for its own answer.
            worst = max(self._holdings, key=lambda h: h.weight)
            if worst.weight == 0:
                break
            self.closed += 1
            pid, uid = worst.peer
            log.warning("server.memory_budget_closed", peer_pid=pid, peer_uid=uid,
                        held_bytes=worst.weight, total_bytes=self.real, limit=self.limit,
                        setting="max_reply_buffer_total")
            reason = (f"the daemon holds {self.real + size} bytes for its clients, past its"
                      f" budget of {self.limit} (max_reply_buffer_total), and this"
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
        await self._room_for(holding, resample, self.over)

    async def room_to_receive(self, holding: Holding, resample: Callable[[], None]) -> None:
        """Before more of a request body is taken: wait while the total is past the mark
        and this connection holds more than its share (no eighth rule here: a body up to
        max_request_bytes must be receivable when the daemon is quiet)."""
        await self._room_for(holding, resample, self.crowded)

    async def _room_for(self, holding: Holding, resample: Callable[[], None],
                        over: Callable[[Holding], bool]) -> None:
        while over(holding):
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
        """Whether `holding`'s connection must not be read now (see room_to_read): by what
        its requests and answers hold (the lines it sent already are freed only by being
        taken, so they do not keep it from being read)."""
        if holding.closed:
            return False
        owed = holding.held - holding.receiving
        if owed > self.limit // CONNECTION_SHARE:
            return True  # no one connection takes more than an eighth, however quiet the rest
        return self._crowded(owed)

    def crowded(self, holding: Holding) -> bool:
        """Past the mark, and `holding` holds more than its share of the budget."""
        return not holding.closed and self._crowded(holding.held)

    def _crowded(self, held: int) -> bool:
        if self.total <= self.mark:
            return False
        holders = sum(1 for h in self._holdings if h.held) or 1
        return held > self.limit // holders

    def _change(self, delta: int) -> None:
        self.total += delta
        if delta > 0:
            self._high = max(self._high, self.real)
            return
        if self.total <= self.mark:
            self._reached = False
            if self._room is not None:
                self._room.set()
                self._room = None
        # Trims follow real bytes (answers built), not reservations (estimates).
        if (self._high - self.real >= TRIM_STEP or self._released >= TRIM_STEP
                or (self._released and not self.real)):
            self._schedule_trim()

    def transport_closed(self, holding: Holding) -> None:
        """A connection's transport is closed: the bytes it held are freed only now, some
        perhaps after the trims `leave` called for. Counted as released by the most it
        held unsent at once (the transport's buffer keeps the memory it grew to), they
        call for a trim by the same rule."""
        self._released_late += holding.most
        holding.most = 0
        if self._released_late >= TRIM_STEP or (self._released_late and not self.real):
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
        self._high, self._released, self._released_late = self.real, 0, 0
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


class Reservation:
    """What one request reserves by size, on any face: each item a paged read takes from
    the store is counted (`take`, called through stores.rows.page_reserve) before the
    answer is built from it, for the item and the answer made from it (COPIES), and given
    back when the request is done (`release`). Rows are fetched under the budget's
    `fetching` gate, so that rows fetched and not yet counted are few daemon-wide (the
    readers can fetch faster than the loop builds answers)."""

    __slots__ = ("budget", "ended", "holding", "sized")

    def __init__(self, budget: ReplyBudget, holding: Holding) -> None:
        self.budget, self.holding, self.sized = budget, holding, 0
        self.ended = False

    def fetching(self) -> AbstractAsyncContextManager[Any]:
        return self.budget.fetching

    def take(self, size: int) -> None:
        """Count `size` bytes read for the answer (COPIES times: the item and the answer
        built from it live together); past the budget the heaviest connections are
        closed first; an item larger than the budget is refused (-32008)."""
        budget, holding = self.budget, self.holding
        if self.ended:
            return  # a task that outlived its request (its context copied): not counted
        size *= COPIES
        if holding.closed:
            raise OverloadedError("the connection was closed by the daemon's memory budget",
                                  {"setting": "max_reply_buffer_total"})
        # An item larger than the whole budget is refused at once: closing others would
        # not make room for it.
        if size <= budget.limit and budget.make_room(holding, size, built=True):
            budget.size(holding, size)
            self.sized += size
            return
        budget.refused += 1
        log.info("server.memory_budget_refused", size=size, total_bytes=budget.real,
                 limit=budget.limit)
        raise OverloadedError(
            f"the daemon holds {budget.real} bytes for its clients and this read needs"
            f" {size} more, past its budget of {budget.limit} (max_reply_buffer_total);"
            " retry later", {"setting": "max_reply_buffer_total", "size": size,
                             "limit": budget.limit, "retry_after_ms": 1000})

    def release(self) -> None:
        """Give back what was reserved so far: the answer built from it is handed over
        (and counted as such); later items are reserved again."""
        if self.sized:
            self.budget.size(self.holding, -self.sized)
            self.sized = 0

    def end(self) -> None:
        """The request is done: give back what it reserved, and reserve nothing more."""
        self.release()
        self.ended = True
