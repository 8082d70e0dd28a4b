"""The writer's bells, and who follows them.

After each commit the writer rings a Bell: the batch's events and the sessions it
deleted. A bell is given to the followers there and then, and kept by nobody: it links to
no other bell, so once its ring returns, its batch is freed (a tail or a subscription
that waits holds its cursor, never a batch: what it has not taken it reads back from the
store). Whoever must not miss a batch becomes a follower before it reads the store.

Followers are not tasks waiting on a bell: they are indexed by the session they follow
(or as followers of every session), and the ring calls the followers of the sessions the
batch touched, and those of every session, right there. A follower of another session
costs nothing per commit; those woken write their notifications at once, one write per
connection (`Flush`), with no task woken.
"""

from __future__ import annotations

from typing import Protocol

import msgspec
import structlog

from sessiond_schemas.events import Event

log = structlog.get_logger("sessiond.bells")
_json = msgspec.json.Encoder()


class Flush(Protocol):
    """What a follower's ring leaves to do once every follower had the bell (e.g. one
    write for the notifications of one connection)."""

    def flush(self) -> None: ...


class Follower(Protocol):
    """A live follower: given each bell that touched what it follows, in order."""

    def ring(self, bell: Bell) -> Flush | None: ...


class Followers:
    """The live followers, by the session they follow (None: every session)."""

    __slots__ = ("_by_session", "_everything", "woken")

    def __init__(self) -> None:
        # dicts, not sets: followers are called in the order they came
        self._by_session: dict[str, dict[Follower, None]] = {}
        self._everything: dict[Follower, None] = {}
        self.woken = 0  # followers called, over the daemon's life (daemon.stats, tests)

    def __len__(self) -> int:
        return len(self._everything) + sum(len(f) for f in self._by_session.values())

    def add(self, session_id: str | None, follower: Follower) -> None:
        if session_id is None:
            self._everything[follower] = None
        else:
            self._by_session.setdefault(session_id, {})[follower] = None

    def discard(self, session_id: str | None, follower: Follower) -> None:
        if session_id is None:
            self._everything.pop(follower, None)
            return
        following = self._by_session.get(session_id)
        if following is not None:
            following.pop(follower, None)
            if not following:
                del self._by_session[session_id]

    def ring(self, bell: Bell) -> None:
        """Give `bell` to the followers of the sessions it touched (an event or a delete)
        and to those of every session; then flush what they left."""
        woken = list(self._everything)
        if self._by_session:
            by_session = self._by_session
            touched = {e.session_id for e in bell.events}
            touched.update(bell.deleted)
            for sid in touched:
                following = by_session.get(sid)
                if following is not None:
                    woken.extend(following)
        if not woken:
            return
        self.woken += len(woken)
        flushes: dict[Flush, None] = {}
        for follower in woken:  # a snapshot: a follower may end (and leave) as it rings
            try:
                flush = follower.ring(bell)
            except Exception:  # a bug: one follower must not fail the others or the writer
                log.exception("bells.follower_failed")
                continue
            if flush is not None:
                flushes[flush] = None
        for flush in flushes:
            try:
                flush.flush()
            except Exception:
                log.exception("bells.flush_failed")


class Bell:
    """One committed batch, rung for the followers: its events and the sessions it
    deleted. It refers to nothing else (no other bell), and a follower keeps nothing of it
    past its ring but the bytes it writes."""

    __slots__ = ("_encoded", "deleted", "events")

    def __init__(self, events: list[Event], deleted: frozenset[str]) -> None:
        self.events = events
        self.deleted = deleted
        self._encoded: list[bytes] | None = None

    def encoded(self) -> list[bytes]:
        """The events as JSON, encoded once however many subscribers send them."""
        if self._encoded is None:
            self._encoded = [_json.encode(e) for e in self.events]
        return self._encoded

    def touches(self, session_id: str) -> bool:
        """Whether this batch has an event of `session_id` or deleted it."""
        return session_id in self.deleted or any(e.session_id == session_id
                                                 for e in self.events)
