"""sessionctl's command registry: each command declares its arguments next to its handler.

    @command("memory", "apply a JSON merge patch to the session's memory", write=True,
             render=print_kv, args=[arg("patch", type=json_arg)])
    def memory(c: Client, a: argparse.Namespace) -> Any: ...

`build_parser` turns the registry into the argparse parser: each command gets `--json`,
the session `id` (unless `sid=False`) and the write options (`write=True`:
--expected-version, --idempotency-key) before its own arguments.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

from .._sync import Client

Handler = Callable[[Client, argparse.Namespace], Any]
Render = Callable[[Any], None]
STREAMED = object()  # what a command returns when it printed as it went


class CliError(Exception):
    """A failure sessionctl reports itself, in one line: `code` names its kind (the `code`
    of the --json error), `exit_code` is the process's exit status."""

    def __init__(self, message: str, code: str, exit_code: int = 1,
                 data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.message, self.code, self.exit_code, self.data = message, code, exit_code, data or {}


@dataclass(frozen=True)
class Arg:
    """One `add_argument(*flags, **options)`."""

    flags: tuple[str, ...]
    options: dict[str, Any] = field(default_factory=dict)

    def add_to(self, parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup) -> None:
        parser.add_argument(*self.flags, **self.options)


def arg(*flags: str, **options: Any) -> Arg:
    """An argument of a command, as argparse's add_argument takes it."""
    return Arg(flags, options)


@dataclass(frozen=True)
class OneOf:
    """Arguments of which at most one may be given."""

    args: tuple[Arg, ...]

    def add_to(self, parser: argparse.ArgumentParser) -> None:
        group = parser.add_mutually_exclusive_group()
        for one in self.args:
            one.add_to(group)


def one_of(*args: Arg) -> OneOf:
    return OneOf(args)


# An argument, a group, or a function adding arguments itself (say, another module's).
ArgSpec = Arg | OneOf | Callable[[argparse.ArgumentParser], None]


@dataclass(frozen=True)
class Command:
    name: str
    help: str
    handler: Handler
    render: Render | None
    sid: bool
    write: bool
    args: tuple[ArgSpec, ...]
    wire: dict[str, str] = field(default_factory=dict)

    def flag_for(self, name: str) -> str | None:
        """The flag (or argument) a wire field of this command's request comes from: its
        `wire` entry, else the `--flag` of the same name, if the command has one."""
        if name in self.wire:
            return self.wire[name]
        flag = "--" + name.replace("_", "-")
        flags = {f for spec in self.args if isinstance(spec, Arg) for f in spec.flags}
        flags |= {f for spec in self.args if isinstance(spec, OneOf)
                  for one in spec.args for f in one.flags}
        if self.write:
            flags |= {"--expected-version", "--idempotency-key"}
        return flag if flag in flags else None

    def in_flags(self, message: str) -> str:
        """A daemon's message about request fields, said in this command's flags."""
        def swap(m: re.Match[str]) -> str:
            return self.flag_for(m.group(2)) or m.group(0)
        return re.sub(r"(?<![\w.])(\$\.)?([a-z][a-z0-9_]*)(?![\w])", swap, message)


COMMANDS: dict[str, Command] = {}


def command(name: str, help: str, *, render: Render | None = None, sid: bool = True,
            write: bool = False, args: Sequence[ArgSpec] = (),
            wire: dict[str, str] | None = None) -> Callable[[Handler], Handler]:
    """Register a sessionctl command: its help, its arguments, and how `render` prints its
    result for people (None: as JSON). `wire` names the flag of each request field whose
    flag has another name, so the daemon's errors can be said in the command's words."""
    def register(handler: Handler) -> Handler:
        if name in COMMANDS:
            raise ValueError(f"sessionctl command {name!r} is declared twice")
        COMMANDS[name] = Command(name, help, handler, render, sid, write, tuple(args),
                                 dict(wire or {}))
        return handler
    return register


class Parser(argparse.ArgumentParser):
    """argparse, with its errors in one line (and in JSON under --json)."""

    def error(self, message: str) -> NoReturn:
        where = self.prog.removeprefix("sessionctl").strip()  # the command, if any
        raise CliError(f"{where + ': ' if where else ''}{message} (see {self.prog} --help)",
                       "usage", 2)


def build_parser(commands: Iterable[Command]) -> argparse.ArgumentParser:
    """The parser of `commands`, listed in `sessionctl --help` in this order."""
    p = Parser(prog="sessionctl", description="Talk to a sessiond daemon.")
    p.add_argument("--socket", help="daemon socket (default: $SESSIOND_SOCKET or the runtime dir)")
    p.add_argument("--json", action="store_true", help="print the JSON result")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for c in commands:
        sp = sub.add_parser(c.name, help=c.help, description=c.help)
        sp.add_argument("--json", action="store_true", default=argparse.SUPPRESS,
                        help="print the JSON result")
        if c.sid:
            sp.add_argument("id", help="session id or a unique prefix (>= 4 characters)")
        if c.write:
            sp.add_argument("--expected-version", type=int, help="refuse unless at this version")
            sp.add_argument("--idempotency-key", help="a repeat with this key appends nothing")
        for spec in c.args:
            if isinstance(spec, (Arg, OneOf)):
                spec.add_to(sp)
            else:
                spec(sp)
    return p


def full_id(client: Client, given: str) -> str:
    """Accept a whole id or a unique prefix of one."""
    if len(given) < 4:
        return given
    return client.resolve(given)


def write_opts(a: argparse.Namespace) -> dict[str, Any]:
    """The write options every `write=True` command takes."""
    return {"expected_version": a.expected_version, "idempotency_key": a.idempotency_key}

