"""sessionctl restore: a session written back into an agent CLI's own transcript folder."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from .._sync import Client
from .registry import STREAMED, CliError, arg, command, full_id


@command("restore", "write a session back as a Claude Code or Codex transcript, where"
         " `claude --resume` / `codex resume` find it (never over an existing file)", args=[
             arg("--format", required=True, choices=["claude-code", "codex"]),
             arg("--to", metavar="DIR",
                 help="the CLI's root (default: $CLAUDE_CONFIG_DIR/projects or"
                      " ~/.claude/projects; $CODEX_HOME/sessions or ~/.codex/sessions)")])
def _restore(c: Client, a: argparse.Namespace) -> Any:
    from ..importers.restore import restore

    sid = full_id(c, a.id)
    try:
        result = restore(c, sid, a.format, a.to)
    except FileExistsError as exc:
        raise CliError(f"{exc.args[0]} exists: a restore never overwrites a file (move it"
                       " away, or restore --to another folder)", "file_error", 1,
                       {"file": exc.args[0]}) from None
    except OSError as exc:
        raise CliError(f"cannot write the transcript: {exc}", "file_error", 1) from None
    except ValueError as exc:
        raise CliError(str(exc), "file_error", 1) from None
    if a.json:
        return result.as_item()
    print(f"restored {sid} to {result.file} ({result.lines} lines, {result.original} as the"
          " CLI wrote them)")
    for note in result.left_out:
        print(f"  left out: {note}", file=sys.stderr)
    return STREAMED
