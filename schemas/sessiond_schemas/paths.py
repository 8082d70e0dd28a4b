"""Where the socket is by default: the contract's order of precedence (daemon and client)."""

from __future__ import annotations

import os
from collections.abc import Mapping


def default_socket(env: Mapping[str, str] = os.environ) -> str:
    """Return the socket path used when no flag names one."""
    if env.get("SESSIOND_SOCKET"):
        return env["SESSIOND_SOCKET"]
    if env.get("RUNTIME_DIRECTORY"):
        return os.path.join(env["RUNTIME_DIRECTORY"].split(":")[0], "sessiond.sock")
    if env.get("XDG_RUNTIME_DIR"):
        return os.path.join(env["XDG_RUNTIME_DIR"], "sessiond", "sessiond.sock")
    return f"/tmp/sessiond-{os.getuid()}/sessiond.sock"


def http_token_path(socket_path: str, *, peer: bool = False) -> str:
    """The HTTP face's bearer token file (the peer token's with `peer`): beside the socket."""
    name = "sessiond.http-peer-token" if peer else "sessiond.http-token"
    return os.path.join(os.path.dirname(os.path.abspath(socket_path)), name)


def http_listen_path(socket_path: str) -> str:
    """Where the daemon writes the HTTP face's bound addresses (a JSON list): beside the
    socket, so `sessionctl web` can build the page's URL."""
    return os.path.join(os.path.dirname(os.path.abspath(socket_path)), "sessiond.http-listen")
