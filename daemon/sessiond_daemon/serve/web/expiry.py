"""Stream-TTL and Stream-Expires-At on sessions: when a stream has expired, and keeping a
read stream alive.

The protocol's TTL is a sliding window that reads restart as well as writes (a HEAD
does not); `Stream-Expires-At` is an absolute time that nothing moves. The daemon keeps
each as the session's idle TTL (`ttl_s`, so its expiry sweep ends the session and
retention removes it, on every host), and the HTTP face answers 404 from the moment a
stream is past its time, whatever the sweep has done yet. A read does not write an event;
the face remembers when it last read each TTL'd stream (in this process, bounded), and
when a read's window would outlast the session's expiry, gives the session one and a
half times the TTL (`session.set_ttl`, as the daemon: a peer may read a stream without
the grant to set a TTL), so the sweep never ends a stream that is being read, and a
read writes at most once per half window.
"""

from __future__ import annotations

import math
import time
from collections import OrderedDict
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sessiond_daemon.serve.web.calls import DAEMON, Calls
from sessiond_schemas.streams import epoch

if TYPE_CHECKING:
    from sessiond_daemon.serve.web.streams import View

MAX_TRACKED = 100_000  # streams whose last read is remembered; the oldest is forgotten
RENEW_BY = 1.5  # a read renews the session's idle TTL by this many of the stream's TTLs


def idle_ttl(ttl_s: int | None, expires_at: str | None, now: float | None = None
             ) -> int | None:
    """The session's idle TTL for a stream's Stream-TTL, or for its Stream-Expires-At (the
    seconds left until then, at least 1); None for neither."""
    if ttl_s is not None:
        return max(1, ttl_s)
    if expires_at is not None:
        left = epoch(expires_at) - (time.time() if now is None else now)
        return max(1, math.ceil(left))
    return None


class Expiry:
    """The HTTP face's view of streams' expiry (one per daemon process)."""

    def __init__(self, calls: Calls, clock: Callable[[], float] = time.time) -> None:
        self.calls, self.clock = calls, clock
        self._read: OrderedDict[str, float] = OrderedDict()  # session id -> last read

    def expired(self, state: dict[str, Any], view: View) -> bool:
        """Whether the stream is past its time: the daemon ended it, its Expires-At has
        come, or its TTL has passed since its last write or read."""
        if state.get("status") == "expired":
            return True
        now = self.clock()
        if view.expires_at is not None and now >= epoch(view.expires_at):
            return True
        if view.ttl_s is None:
            return False
        last = max(epoch(state["timestamps"]["updated_at"]),
                   self._read.get(view.session_id, 0.0))
        return now >= last + view.ttl_s

    async def touch(self, state: dict[str, Any], view: View) -> bool:
        """A read or a write of the stream: its TTL starts again. Returns whether the
        session got its TTL again (a new version)."""
        if view.ttl_s is None or not view.generic:
            return False
        now = self.clock()
        self._read[view.session_id] = now
        self._read.move_to_end(view.session_id)
        while len(self._read) > MAX_TRACKED:
            self._read.popitem(last=False)
        due = state.get("expires_at")
        if due is not None and epoch(due) >= now + view.ttl_s:
            return False  # the session outlives this read's window already
        # Renewed for half a window more than asked, so that the renewal (a version) is
        # written at most once per half window while the stream is read: the daemon's
        # sweep then never ends it before the face would (the face is exact).
        await self.calls.call("session.set_ttl", {
            "session_id": view.session_id, "ttl_s": math.ceil(view.ttl_s * RENEW_BY)}, DAEMON)
        return True

    def forget(self, session_id: str) -> None:
        self._read.pop(session_id, None)
