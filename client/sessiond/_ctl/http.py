"""`sessionctl http-token [--rotate] [--peer]`: the HTTP face's bearer token (docs/http.md).

The token is a file beside the daemon's socket (0600, made at each start); this prints
it, or replaces it with a new one, which the daemon reads at the next request. No daemon
is contacted: only the user who can write the runtime directory can rotate.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from sessiond_schemas.paths import (
    default_socket,
    http_token_path,
    older_names,
    write_http_token,
)

from .._sync import Client
from .registry import CliError, arg, command


@command("http-token", "print the HTTP face's bearer token (or --rotate it)", sid=False,
         args=[arg("--rotate", action="store_true",
                   help="replace it with a new one (the old one stops working at once)"),
               arg("--peer", action="store_true",
                   help="the peer token (grants of another allowed user), not the owner's")])
def _http_token(c: Client, a: argparse.Namespace) -> Any:
    raise AssertionError("sessionctl http-token runs without a daemon (cli.LOCAL)")


def run(a: argparse.Namespace) -> int:
    path = http_token_path(a.socket or default_socket(), peer=a.peer)
    if not a.rotate:  # a daemon of an earlier release: sessiond.http-token, whatever the socket
        path = next((p for p in older_names(path) if os.path.exists(p)), path)
    try:
        if a.rotate:
            token = write_http_token(path)
        else:
            with open(path, encoding="ascii") as f:
                token = f.read().strip()
    except FileNotFoundError as exc:
        raise CliError(f"no HTTP token at {path}: is the daemon running with http_listen?",
                       "file_error", 1, {"file": path}) from exc
    except OSError as exc:
        raise CliError(f"cannot {'write' if a.rotate else 'read'} {path}: {exc.strerror}",
                       "file_error", 1, {"file": path}) from exc
    print(json.dumps({"token": token, "file": path}) if a.json else token)
    return 0
