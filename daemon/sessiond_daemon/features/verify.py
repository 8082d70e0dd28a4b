"""Checking a session's history: gapless versions, the hash chain, views equal to the fold."""

from __future__ import annotations

import msgspec

from sessiond_daemon.core.projection import FoldError, fold
from sessiond_schemas.events import Event, SessionForked, Unread
from sessiond_schemas.export import link_ok, sealed_by, split_v2
from sessiond_schemas.state import SessionState


class SessionCheck:
    """Feed a session's events in version order, page by page; collect what is wrong."""

    def __init__(self, session_id: str, snapshots: dict[int, SessionState],
                 key: bytes | None = None) -> None:
        self.session_id = session_id
        self.snapshots = snapshots
        self.problems: list[str] = []
        self.state: SessionState | None = None
        self._hash = ""
        self._version = 0
        self.first: Event | None = None  # a fork's session.forked event
        self.first_version = 1  # the first version stored (after a trim: past its anchor)
        self.key = key
        self.sealed = self.unkeyed = self.foreign = 0

    def start_at(self, version: int, anchor: str) -> None:
        """A trimmed history (retention): the events kept start after `version`, their
        chain from `anchor`, the fold from the snapshot kept at `version`."""
        self._version, self._hash, self.first_version = version, anchor, version + 1
        self.state = self.snapshots.get(version)
        if self.state is None:
            self.problems.append(f"trimmed at version {version}, but its snapshot is gone")

    def feed(self, events: list[Event]) -> None:
        for event in events:
            if self.state is None and isinstance(event.data, SessionForked):
                # A fork's versions and chain go on from its source's (forks.link_problems).
                self.first = event
                self._version = event.data.from_.version
                self._hash = event.data.from_.hash
            elif (self.state is None and event.type == "session.forked"
                  and isinstance(event.data, Unread)):  # its source's version is not known
                self.problems.append(f"history does not fold: session.forked at version"
                                     f" {event.version} does not read ({event.data.error})")
                return
            if event.version != self._version + 1:
                self.problems.append(f"version {self._version + 1} is missing"
                                     f" (next stored is {event.version})")
            self._version = event.version
            if not link_ok(self._hash, event):
                self.problems.append(f"hash chain broken at version {event.version}"
                                     " (the event or one before it was changed)")
            self._whose(event)
            self._hash = event.hash  # a break is reported once, not at every event after it
            try:
                self.state = fold(self.state, [event])
            except FoldError as exc:
                self.problems.append(f"history does not fold: {exc}")
                return
            snapshot = self.snapshots.get(event.version)
            if snapshot is not None and _differs(snapshot, self.state):
                self.problems.append(f"snapshot at version {event.version} differs from the fold")

    def _whose(self, event: Event) -> None:
        if split_v2(event.hash) is None:
            self.unkeyed += 1
        elif self.key is not None and sealed_by(event, self.key):
            self.sealed += 1
        else:
            self.foreign += 1

    def finish(self, stored: SessionState | None) -> list[str]:
        """Compare the stored view with the fold of everything fed."""
        if stored is None or self.state is None:
            self.problems.append("view row or events missing")
        elif _differs(stored, self.state):
            self.problems.append("stored view differs from a fresh fold of its events")
        return self.problems


def _differs(a: SessionState, b: SessionState) -> bool:
    return bool(msgspec.to_builtins(a) != msgspec.to_builtins(b))
