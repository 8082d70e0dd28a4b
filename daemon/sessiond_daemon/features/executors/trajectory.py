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
from sessiond_schemas.toolcalls import is_call_text, message_calls

# The events a trajectory is read from.
TRAJECTORY_TYPES = ("message.appended", "process.started", "process.output", "process.exited")


def steps(rows: list[Data], adapter: Adapter | None, turn: int = 0,
          running: bool = False) -> list[rpc.Step]:
    """The steps of a session, from its TRAJECTORY_TYPES events' data in order: user
    messages, the adapter's steps from stdout lines, and an `exit` step for a non-zero
    exit (data that does not read, Unread, makes none). The other messages written while
    no process of the session runs (an imported transcript, a client's own) are steps
    too, as the adapters name them: `message`, `tool_call`, `tool_result`; a running
    process's messages come from its stdout, whose steps already hold them. `turn`: the
    turn the rows start in, `running` whether a process runs there (a page after the
    first goes on from its cursor's)."""
    out: list[rpc.Step] = []
    for d in rows:
        match d:
            case ProcessStarted():
                turn, running = d.turn, True
            case MessageAppended(role="user"):
                out.append(rpc.Step(type="user", summary=d.content, turn=turn + 1))
            case MessageAppended() if not running:
                out += message_steps(d, turn + 1)
            case ProcessOutput(stream="stdout") if adapter:
                parsed = adapter.parse(d.line)
                if parsed is not None:  # user messages are already steps, from their events
                    out += [rpc.Step(turn=d.turn, **s) for s in parsed.steps
                            if s["type"] != "user"]
            case ProcessExited():
                running = False
                if d.exit_code or d.signal:
                    how = f"exit code {d.exit_code}" if d.exit_code else f"signal {d.signal}"
                    out.append(rpc.Step(type="exit", summary=how, turn=d.turn,
                                        details={"exit_code": d.exit_code, "signal": d.signal}))
    return out


def message_steps(m: MessageAppended, turn: int) -> list[rpc.Step]:
    """A stored message's steps: a tool result, or the message's text and then each tool
    call of its `metadata.tool_calls` (the importers' `{id, name, input}`, or OpenAI's,
    LangChain's and the Agents SDK's shapes of a call) with its name and input."""
    if m.role == "tool":
        return [rpc.Step(type="tool_result", summary=m.content, turn=turn,
                         details={"id": m.tool_call_id})]
    calls = message_calls(m.metadata, m.content)
    out = [] if calls and is_call_text(m.content, calls) else [
        rpc.Step(type="message", summary=m.content, turn=turn, details={"role": m.role})]
    for c in calls:
        out.append(rpc.Step(type="tool_call", summary=c["name"], turn=turn,
                            details={"id": c["id"], "input": c["input"]}))
    return out


def truncate_step(step: rpc.Step, limit: int) -> rpc.Step:
    """The step with every string longer than `limit` characters cut, with `…`."""
    def cut(value: Any) -> Any:
        if isinstance(value, str) and len(value) > limit:
            return value[:limit] + "…"
        return value

    return rpc.Step(type=step.type, summary=cut(step.summary), turn=step.turn,
                    details={k: cut(v) for k, v in step.details.items()})


def last_turn(rows: list[Data], turn: int, running: bool = False) -> tuple[int, bool]:
    """The turn the events after `rows` are in, and whether a process runs there (what
    `steps` tracks as it goes)."""
    for d in rows:
        if isinstance(d, ProcessStarted):
            turn, running = d.turn, True
        elif isinstance(d, ProcessExited):
            running = False
    return turn, running


def encode_cursor(version: int, turn: int, running: bool = False) -> str:
    return base64.urlsafe_b64encode(msgspec.json.encode(
        [version, turn, 1] if running else [version, turn])).decode()


def decode_cursor(cursor: str) -> tuple[int, int, bool]:
    """(version, turn, running): cursors of earlier daemons hold the first two."""
    try:
        got = msgspec.json.decode(base64.urlsafe_b64decode(cursor.encode()), type=list[int])
        if len(got) not in (2, 3):
            raise ValueError(f"{len(got)} numbers, not 2 or 3")
    except (ValueError, msgspec.DecodeError, msgspec.ValidationError) as exc:
        raise InvalidParamsError("`cursor` is not a cursor session.trajectory returned",
                                 {"detail": str(exc), "path": "$.cursor"}) from exc
    return got[0], got[1], len(got) == 3 and bool(got[2])
