"""What an executor session's stored history says: its trajectory of steps."""

from __future__ import annotations

import base64
from typing import Any

import msgspec

from sessiond_daemon.features.executors.adapters import Adapter
from sessiond_schemas import rpc
from sessiond_schemas.errors import InvalidParamsError
from sessiond_schemas.events import (
    Data,
    MessageAppended,
    ProcessExited,
    ProcessOutput,
    ProcessStarted,
)

# The events a trajectory is read from.
TRAJECTORY_TYPES = ("message.appended", "process.started", "process.output", "process.exited")


def steps(rows: list[Data], adapter: Adapter | None, turn: int = 0) -> list[rpc.Step]:
    """The steps of a session, from its TRAJECTORY_TYPES events' data in order: user
    messages, the adapter's steps from stdout lines, and an `exit` step for a non-zero
    exit (data that does not read, Unread, makes none). `turn`: the turn the rows start
    in (a page after the first goes on from its cursor's)."""
    out: list[rpc.Step] = []
    for d in rows:
        match d:
            case ProcessStarted():
                turn = d.turn
            case MessageAppended(role="user"):
                out.append(rpc.Step(type="user", summary=d.content, turn=turn + 1))
            case ProcessOutput(stream="stdout") if adapter:
                parsed = adapter.parse(d.line)
                if parsed is not None:  # user messages are already steps, from their events
                    out += [rpc.Step(turn=d.turn, **s) for s in parsed.steps
                            if s["type"] != "user"]
            case ProcessExited() if d.exit_code or d.signal:
                how = f"exit code {d.exit_code}" if d.exit_code else f"signal {d.signal}"
                out.append(rpc.Step(type="exit", summary=how, turn=d.turn,
                                    details={"exit_code": d.exit_code, "signal": d.signal}))
    return out


def truncate_step(step: rpc.Step, limit: int) -> rpc.Step:
    """The step with every string longer than `limit` characters cut, with `…`."""
    def cut(value: Any) -> Any:
        if isinstance(value, str) and len(value) > limit:
            return value[:limit] + "…"
        return value

    return rpc.Step(type=step.type, summary=cut(step.summary), turn=step.turn,
                    details={k: cut(v) for k, v in step.details.items()})


def last_turn(rows: list[Data], turn: int) -> int:
    """The turn the events after `rows` are in (what `steps` tracks as it goes)."""
    for d in rows:
        if isinstance(d, ProcessStarted):
            turn = d.turn
    return turn


def encode_cursor(version: int, turn: int) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode([version, turn])).decode()


def decode_cursor(cursor: str) -> tuple[int, int]:
    try:
        return msgspec.json.decode(base64.urlsafe_b64decode(cursor.encode()),
                                   type=tuple[int, int])
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidParamsError("`cursor` is not a cursor session.trajectory returned",
                                 {"detail": str(exc), "path": "$.cursor"}) from exc
