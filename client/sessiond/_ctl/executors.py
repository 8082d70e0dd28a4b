"""sessionctl's executor commands: spawn, inject, kill, output, trajectory."""

from __future__ import annotations

import argparse
import os
from typing import Any

import msgspec

from sessiond_schemas import rpc
from sessiond_schemas.toolcalls import input_text

from .._render import render_state
from .._sync import Client
from .inputs import read_text
from .registry import CliError, arg, command, full_id


@command("spawn", "run an agent CLI as a supervised session: spawn [opts] -- CMD ARGS...",
         sid=False, render=render_state, args=[
             arg("--adapter", choices=["jsonl", "codex", "claude"],
                 help="how to read its output (default jsonl)"),
             arg("--cwd", help="working directory (default: here)"),
             arg("--env", action="append", metavar="KEY=VALUE", help="extra environment"),
             arg("--task", help="the first user message, written to its stdin"),
             arg("--model"),
             arg("--source"),
             arg("--id", help="session id (default: a new ULID)"),
             arg("argv", nargs=argparse.REMAINDER, metavar="-- CMD ARGS")])
def _spawn(c: Client, a: argparse.Namespace) -> Any:
    argv = a.argv[1:] if a.argv[:1] == ["--"] else a.argv
    if not argv:
        raise SystemExit("sessionctl spawn: give the command after --,"
                         " e.g. -- codex exec --json TASK")
    bad = [kv for kv in a.env or [] if "=" not in kv or kv.startswith("=")]
    if bad:
        raise CliError(f"--env wants KEY=VALUE, not {bad[0]!r}", "usage", 2)
    env = dict(kv.split("=", 1) for kv in a.env or [])
    state = c.spawn(argv, cwd=os.path.abspath(a.cwd or os.getcwd()), env=env or None,
                    adapter=a.adapter, task=a.task, model=a.model, session_id=a.id,
                    source=a.source)
    if state.status == "failed":  # the program did not start: show the session, then fail
        (print(msgspec.json.encode(state).decode()) if a.json else render_state(state))
        raise CliError(f"{argv[0]} did not start: {state.error or 'unknown reason'}"
                       f" (session {state.session_id})", "spawn_failed", 1,
                       {"session_id": state.session_id})
    return state


@command("inject", "run a follow-up turn of an executor session", render=render_state,
         args=[arg("message", nargs="?", help="the message; '-' or nothing reads stdin")])
def _inject(c: Client, a: argparse.Namespace) -> Any:
    return c.inject(full_id(c, a.id), read_text(a.message))


@command("kill", "end an executor session's processes (SIGTERM, then SIGKILL)",
         render=render_state)
def _kill(c: Client, a: argparse.Namespace) -> Any:
    return c.kill(full_id(c, a.id))


@command("output", "print an executor turn's raw output lines",
         render=lambda r: r.lines and print("\n".join(r.lines)), args=[
             arg("--turn", type=int, help="which turn (default: the latest)"),
             arg("--stream", choices=["stdout", "stderr"], help="one stream only")])
def _output(c: Client, a: argparse.Namespace) -> Any:
    sid = full_id(c, a.id)
    result = c.output(sid, turn=a.turn, stream=a.stream)
    while result.next is not None:  # a page cut by bytes: read the rest of the turn
        more: rpc.OutputResult = c.call("session.output", rpc.OutputResult, session_id=sid,
                                        turn=result.turn, stream=a.stream,
                                        after_position=result.next)
        result = msgspec.structs.replace(more, lines=result.lines + more.lines)
    return result


def _render_steps(steps: Any) -> None:
    for s in steps:
        call = s.type == "tool_call" and s.details.get("input") is not None
        summary = f"{s.summary}({input_text(s.details['input'])})" if call else s.summary
        print(f"[{s.turn}] {s.type:<12} {summary}")


@command("trajectory", "list an executor session's steps", render=_render_steps, args=[
    arg("--full", action="store_true", help="do not truncate long text"),
    arg("--max-output-len", type=int, help="truncate text past this (default 200)")])
def _trajectory(c: Client, a: argparse.Namespace) -> Any:
    return c.trajectory(full_id(c, a.id), full=a.full, max_output_len=a.max_output_len)
