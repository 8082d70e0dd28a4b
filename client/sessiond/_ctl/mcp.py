"""`sessionctl mcp`: sessiond's MCP server on stdio, for an agent CLI's MCP config
(docs/mcp.md).

A relay, byte for byte: stdin to the daemon's MCP socket (beside its RPC socket), the
socket to stdout. The daemon serves the MCP session there (MCP's stdio framing:
newline-delimited JSON-RPC) as the uid it sees on the socket, so the tools see and do what
this user may. Nothing of MCP runs here; the `mcp` package is needed by the daemon only.
"""

from __future__ import annotations

import argparse
import contextlib
import errno
import os
import socket
import sys
import threading
from typing import Any

from sessiond_schemas.paths import default_socket, mcp_socket_path

from .._sync import Client
from .registry import CliError, command

CHUNK = 1 << 16


@command("mcp", "serve sessiond's MCP tools on stdio (for an agent CLI's MCP config)",
         sid=False)
def _mcp(c: Client, a: argparse.Namespace) -> Any:
    raise AssertionError("sessionctl mcp runs without the RPC client (cli.LOCAL)")


def run(a: argparse.Namespace) -> int:
    rpc = a.socket or default_socket()
    path = mcp_socket_path(rpc)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(path)
    except OSError as exc:
        sock.close()
        if exc.errno in (errno.ENOENT, errno.ECONNREFUSED) and os.path.exists(rpc):
            raise CliError(
                f"the daemon at {rpc} serves no MCP socket ({path}): it needs the mcp package"
                " where it runs: pip install 'sessiond[mcp]', then restart sessiond",
                "unreachable", 2, {"socket": path}) from exc
        raise CliError(f"cannot reach sessiond's MCP socket at {path}: {exc.strerror or exc}"
                       " (is sessiond running?)", "unreachable", 2, {"socket": path}) from exc
    with sock:
        # stdin to the socket in a thread (a blocking read of a pipe or a terminal); the
        # socket to stdout here. The client closing stdin ends our sending side; the
        # daemon then answers what is in flight and closes, which ends the relay.
        threading.Thread(target=_pump_in, args=(sock,), daemon=True).start()
        out = sys.stdout.buffer
        while data := sock.recv(CHUNK):
            try:
                out.write(data)
                out.flush()
            except BrokenPipeError:  # the client went away
                return 0
    return 0


def _pump_in(sock: socket.socket) -> None:
    with contextlib.suppress(OSError):
        while data := os.read(sys.stdin.fileno(), CHUNK):
            sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
