"""`sessionctl`: the command-line client; human tables by default, `--json` for scripts.

Each command is declared, with its arguments, next to its handler in `_ctl/` (admin,
sessions, executors, history); `_ctl/registry.py` builds the parser from them. Here:
running one, and reporting its failure in one line.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any, NoReturn

import msgspec

from sessiond_schemas.errors import INVALID_PARAMS, SessiondError

from ._ctl import admin, executors, history, http, mcp, migrate, registry, restore, sessions, web
from ._ctl.registry import COMMANDS, STREAMED, CliError
from ._sync import Client
from ._wire import ConnectionLostError

__all__ = ["CliError", "build_parser", "main"]

# The modules declaring the commands (importing them registers them), in the order
# `sessionctl --help` lists them; each module's commands in the order it declares them.
SECTIONS = (admin, migrate, http, mcp, web, sessions, executors, history, restore)
# Commands that run here without a daemon: name -> runner (its return is the exit status).
LOCAL = {"migrate": migrate.run, "http-token": http.run, "mcp": mcp.run}


def build_parser() -> argparse.ArgumentParser:
    order = [section.__name__ for section in SECTIONS]
    return registry.build_parser(
        sorted(COMMANDS.values(), key=lambda c: order.index(c.handler.__module__)))


def _fail(message: str, code: int | str, exit_code: int, data: dict[str, Any] | None,
          as_json: bool) -> NoReturn:
    """Print one error line on stderr (a JSON object under --json) and exit."""
    if as_json:
        print(json.dumps({"error": {"code": code, "message": message, "data": data or {}}}),
              file=sys.stderr)
    else:
        print(f"sessionctl: {' '.join(message.split())}", file=sys.stderr)
    sys.exit(exit_code)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else argv
    as_json = "--json" in argv[:argv.index("--")] if "--" in argv else "--json" in argv
    try:
        args = build_parser().parse_args(argv)
    except CliError as exc:
        _fail(exc.message, exc.code, exc.exit_code, exc.data, as_json)
    chosen = COMMANDS[args.command]
    if args.command in LOCAL:
        try:
            sys.exit(LOCAL[args.command](args))
        except CliError as exc:
            _fail(exc.message, exc.code, exc.exit_code, exc.data, args.json)
    client = Client(args.socket)
    try:
        client.connect()
    except SessiondError as exc:  # no daemon (its message says where and what to do),
        # or not one we may talk to
        _fail(exc.message, "unreachable", 2, {"socket": client.socket_path}, args.json)
    except OSError as exc:
        _fail(f"cannot reach sessiond at {client.socket_path}: {exc}", "unreachable", 2,
              {"socket": client.socket_path}, args.json)
    try:
        result = chosen.handler(client, args)
    except BrokenPipeError:  # our reader (say, `head`) has what it wanted
        _reader_gone()
        return
    except KeyboardInterrupt:  # Ctrl-C: the user's choice, not a failure to explain
        print(file=sys.stderr)
        sys.exit(130)
    except CliError as exc:
        _fail(exc.message, exc.code, exc.exit_code, exc.data, args.json)
    except (ConnectionLostError, ConnectionError) as exc:  # the daemon went away
        _fail(f"lost the connection to sessiond at {client.socket_path}: {exc}",
              "unreachable", 2, {"socket": client.socket_path}, args.json)
    except SessiondError as exc:
        message = exc.message
        if exc.code == INVALID_PARAMS:  # it names request fields: say the flags instead
            message = chosen.in_flags(message)
        _fail(message, exc.code, 1, exc.data, args.json)
    except OSError as exc:  # a local file or terminal, not the daemon
        _fail(f"{exc.filename or 'sessionctl'}: {exc.strerror or exc}", "file_error", 1,
              {"path": exc.filename} if exc.filename else None, args.json)
    finally:
        client.close()
    if result is STREAMED:
        return
    try:
        if args.json or chosen.render is None:
            sys.stdout.write(msgspec.json.encode(result).decode() + "\n")
        else:
            chosen.render(result)
        sys.stdout.flush()
    except BrokenPipeError:  # `sessionctl output ID | head -3`: not an error either
        _reader_gone()


def _reader_gone() -> None:
    """stdout's reader has closed it: what is left to write goes nowhere, quietly (the
    interpreter's own flush at exit would otherwise print a traceback)."""
    os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())


if __name__ == "__main__":
    main()
