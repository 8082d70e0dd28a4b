"""The agent integrations' rules: ADK's app and user state (scoped_state, from
state.updated; session keys live in the view) and the executor runner's index
(runner_events: the events that decide a turn, and the output lines that may name the
executor's resume id), which session.inject and restart recovery read instead of every
process.output line."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Final

import msgspec

from sessiond_daemon.stores.models.ops import Insert, Op
from sessiond_schemas.events import Data, Event, ProcessOutput, StateUpdated

_json = msgspec.json.Encoder()

# Every adapter's resume id is named on a stdout line holding one of these (codex's
# thread.started names `thread_id`, claude's lines `session_id`): the runner index keeps
# only such lines. An adapter whose id comes another way adds its mark here (and a
# migration indexes the old lines).
RESUME_MARKS: tuple[str, ...] = ("thread_id", "session_id")
# The event types always indexed; process.output only when its line holds a mark.
TURN_TYPES: Final = ("process.started", "process.exited", "process.detached")


def scoped_state(events: Sequence[Event], payloads: Mapping[str, bytes]) -> list[Op]:
    """The batch's last value of each app/user key, in key order (rows shared by sessions:
    two writers lock them in the same order), replacing only an older event's."""
    latest: dict[tuple[str, str, str], tuple[bytes, int]] = {}
    for e in events:
        d = e.data
        if not isinstance(d, StateUpdated) or d.scope == "session":
            continue
        user = d.user_id if d.scope == "user" else ""  # '' is the app's own state
        for k, v in d.delta.items():
            latest[(d.app_name or "", user or "", k)] = (_json.encode(v), e.position)
    if not latest:
        return []
    return [Insert("scoped_state", [(*key, *latest[key]) for key in sorted(latest)], "newer")]


def indexed(event_type: str, data: Data) -> bool:
    """Whether an event belongs in the runner index."""
    if event_type in TURN_TYPES:
        return True
    return isinstance(data, ProcessOutput) and any(m in data.line for m in RESUME_MARKS)


def runner(events: Sequence[Event], payloads: Mapping[str, bytes]) -> list[Op]:
    rows = [(e.session_id, e.version, e.position, e.type) for e in events
            if e.type.startswith("process.") and indexed(e.type, e.data)]
    return [Insert("runner_events", rows)] if rows else []
