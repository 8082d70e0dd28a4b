"""The domain rules of a write, in one place: a session must exist (`require`), a status
moves only along the status machine (`check_transition`), appended events are numbered
(`sequenced`), sizes stay within the limits, and a plan reaches the writer (`submit`).

Feature modules take a `Commands` in their constructor (with the store and writer they
read) instead of reaching into the Service.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn, Protocol, TypeVar, overload

import msgspec

from sessiond_daemon.core import projection
from sessiond_daemon.core.histories import unreadable_error
from sessiond_daemon.core.writer import Command, Given, PlanData, Planner, Writer
from sessiond_daemon.stores.interface import Store
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    SessionNotFoundError,
    TooLargeError,
)
from sessiond_schemas.events import (
    ALLOWED_TRANSITIONS,
    EventMeta,
    MessageFields,
    ProcessDetached,
    ProcessExited,
    ProcessOutput,
    SessionCreated,
    decode_data,
    new_id,
    now,
    typed_event,
)
from sessiond_schemas.export import canonical
from sessiond_schemas.state import SessionState

_json = msgspec.json.Encoder()

# The process events the executor runner builds as Structs (features/executors), not JSON.
RunnerData = ProcessOutput | ProcessExited | ProcessDetached


N = TypeVar("N", int, float)


@dataclass(frozen=True, slots=True)
class Limits:
    max_message_bytes: int = 16 << 20
    max_event_bytes: int = 32 << 20
    max_checkpoint_bytes: int = 96 << 20
    max_fork_depth: int = 1000  # serve/config.py max_fork_depth (at most forks.WALK_LIMIT)
    # The config's default_ttl_s: namespace (or "prefix*") -> idle TTL of new sessions.
    default_ttl_s: Mapping[str, int] = field(default_factory=dict)
    # session.search's cost budget (stores/interface.py SearchBudget; docs/reliability.md "Budgets")
    search_max_terms: int = 64
    search_max_prefixes: int = 8
    search_max_prefix_matches: int = 100_000
    search_max_steps: int = 500_000_000
    search_timeout_s: float = 10.0


def default_ttl(defaults: Mapping[str, N], namespace: str) -> N | None:
    """The idle TTL a new session of `namespace` gets: its own entry, else the longest
    "prefix*" entry that matches it, else none (the same lookup for trim_after_days)."""
    if namespace in defaults:
        return defaults[namespace]
    matches = [(len(pattern), ttl) for pattern, ttl in defaults.items()
               if pattern.endswith("*") and namespace.startswith(pattern[:-1])]
    return max(matches)[1] if matches else None


@overload
def require(state: None, session_id: str) -> NoReturn: ...
@overload
def require(state: SessionState | None, session_id: str) -> SessionState: ...
def require(state: SessionState | None, session_id: str) -> SessionState:
    """The session's view; -32001 when it does not exist."""
    if state is None:
        raise SessionNotFoundError(f"session {session_id} not found", {"session_id": session_id})
    return state


def check_transition(session_id: str, current: str, to: str) -> None:
    """-32003 unless the status machine allows `current` -> `to`."""
    allowed = ALLOWED_TRANSITIONS[current]
    if to not in allowed:
        raise InvalidTransitionError(
            f"session {session_id} cannot move from {current} to {to}; from {current} it can"
            f" move to: {', '.join(allowed) or 'nothing (it has ended)'}",
            {"from": current, "to": to, "allowed": list(allowed)},
        )


def created_view(sid: str, data: SessionCreated) -> SessionState:
    """The view right after a session.created with `data`: what events in the same write
    as the creation are numbered and checked against."""
    return projection.fold(None, [typed_event(
        position=0, session_id=sid, version=1, event_id="", type="session.created",
        recorded_at=now(), data=data, data_json=b"", meta=EventMeta())])


def sequenced(s: SessionState, events: Sequence[tuple[str, dict[str, Any] | RunnerData]]
              ) -> list[tuple[str, PlanData]]:
    """Events given as JSON objects (events.append, an executor's output) to append after
    view `s`, typed: messages get their id and sequence, status changes their `from`,
    each move checked in order (the daemon's part of events.append). The objects must
    have passed their type's validation (service.APPEND_INPUTS). The runner's own process
    events come built (RunnerData: they move no status and number no message)."""
    status, sequence = s.status, s.message_count
    out: list[tuple[str, PlanData]] = []
    for event_type, raw in events:
        if not isinstance(raw, dict):
            out.append((event_type, raw))
            continue
        data = dict(raw)
        if event_type == "session.status_changed":
            check_transition(s.session_id, status, data["to"])
            data["from"], status = status, data["to"]
        elif event_type == "message.appended":
            data.update(message_id=new_id(), sequence=sequence)
            sequence += 1
        elif event_type == "session.compacted":
            data.update(compacted_at(s, data, sequence, len(out)))
        out.append((event_type, given(event_type, data)))
    return out


def compacted_at(s: SessionState, data: dict[str, Any], sequence: int,
                 index: int) -> dict[str, Any]:
    """A session.compacted given to events.append, as the batch's `index`th event after view
    `s`, with `sequence` messages before it: its through_sequence (left out: the last of
    them) checked, and through_version the version before it."""
    through = data.get("through_sequence")
    through = sequence - 1 if through is None else through
    if through >= sequence:
        raise InvalidParamsError(
            f"through_sequence {through} is past session {s.session_id}'s {sequence}"
            " messages", {"detail": "through_sequence too large",
                          "path": f"$.events[{index}].data.through_sequence"})
    return {"through_sequence": through, "through_version": s.version + index}


def given(event_type: str, data: dict[str, Any]) -> Given:
    """Event data given as a JSON object, typed (raises msgspec.ValidationError when it
    does not fit) and encoded as given (unknown fields kept), and canonically."""
    return Given(decode_data(event_type, data), _json.encode(data), canonical(data))


def utf8_size(text: str, limit: int) -> int:
    """The UTF-8 size of `text`, measured without copying it when that is known to be
    within `limit`: an ASCII string's is its length, any other's at most 4 bytes a
    character. Only a text near the limit with non-ASCII characters is encoded."""
    if text.isascii() or 4 * len(text) <= limit:
        return len(text) if text.isascii() else min(4 * len(text), limit)
    return len(text.encode())


class WriteOptions(Protocol):
    """What a write method's params carry besides its own fields (rpc.WriteParams)."""

    @property
    def session_id(self) -> str: ...
    @property
    def expected_version(self) -> int | None: ...
    @property
    def idempotency_key(self) -> str | None: ...


def command(session_id: str, meta: EventMeta, plan: Planner, *,
            idempotency_key: str | None = None,
            expected_version: int | None = None) -> Command:
    """The writer's command for `plan` on the session (the key goes into the events' meta)."""
    return Command(
        session_id=session_id, plan=plan,
        meta=msgspec.structs.replace(meta, idempotency_key=idempotency_key)
        if idempotency_key is not None else meta,
        expected_version=expected_version, idempotency_key=idempotency_key,
    )


def params_command(p: WriteOptions, meta: EventMeta, plan: Planner) -> Command:
    """`command` for the session, idempotency key and expected version that `p` names."""
    return command(p.session_id, meta, plan, idempotency_key=p.idempotency_key,
                   expected_version=p.expected_version)


class Commands:
    """Plans to the writer, and the checks every write makes before it gets there."""

    def __init__(self, store: Store, writer: Writer, limits: Limits) -> None:
        self.store = store
        self.writer = writer
        self.limits = limits  # replaced on reload

    async def submit(self, session_id: str, meta: EventMeta, plan: Planner, *,
                     idempotency_key: str | None = None,
                     expected_version: int | None = None) -> msgspec.Raw:
        """Have the writer decide `plan` on the session's view and commit what it returns;
        the answer comes back encoded (the writer encodes it once, for the cache too)."""
        return msgspec.Raw(await self.writer.submit(command(
            session_id, meta, plan, idempotency_key=idempotency_key,
            expected_version=expected_version)))

    async def submit_params(self, p: WriteOptions, meta: EventMeta,
                            plan: Planner) -> msgspec.Raw:
        """`submit` for the session, idempotency key and expected version that `p` names."""
        return msgspec.Raw(await self.writer.submit(params_command(p, meta, plan)))

    async def state(self, session_id: str) -> SessionState:
        """The session's current view (the writer's, once a commit in flight that changes
        it has landed: `Writer.view`; else the store's); -32001 if none."""
        state = await self.writer.view(session_id)
        if state is None:
            raw = await self.store.state_json(session_id)
            try:
                state = msgspec.json.decode(raw, type=SessionState) if raw is not None else None
            except (msgspec.DecodeError, msgspec.ValidationError) as exc:
                # Stored data, not the caller's: the next write folds the view again.
                raise unreadable_error(session_id, exc) from exc
        return require(state, session_id)

    # --- sizes ----------------------------------------------------------------------

    def check_event_size(self, data: Any, what: str) -> None:
        self.check_size(len(_json.encode(data)), self.limits.max_event_bytes, what)

    def check_checkpoint_size(self, data: Any, what: str) -> None:
        self.check_size(len(_json.encode(data)), self.limits.max_checkpoint_bytes, what)

    def check_message(self, m: MessageFields) -> None:
        self.check_size(utf8_size(m.content, self.limits.max_message_bytes),
                        self.limits.max_message_bytes, "message content")

    def check_size(self, size: int, limit: int, what: str) -> None:
        """-32005 when `size` is past `limit`; the message names the setting to raise."""
        if size > limit:
            setting = " or ".join(name for name in Limits.__dataclass_fields__
                                  if getattr(self.limits, name) == limit) or "limit"
            raise TooLargeError(f"{what} is {size} bytes, over {setting} ({limit})",
                                {"limit": limit, "size": size})
