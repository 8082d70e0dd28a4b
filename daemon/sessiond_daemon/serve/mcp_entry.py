"""Where the MCP server (serve/mcp.py) is reached from, without importing the `mcp` SDK
until a client comes: the daemon starts as fast with the extra `mcp` as without it.

- `McpLoader`: the MCP server of one daemon, built at the first use (its import, a few
  hundred milliseconds of pydantic and starlette, runs in a thread, not on the loop).
- `start_socket`: the MCP socket beside the RPC socket (paths.mcp_socket_path), bound
  before the daemon says it is ready when the SDK is installed, and served here: the
  peer's uid (SO_PEERCRED) is let in as on the RPC socket, then handed to the server.
"""

from __future__ import annotations

import contextlib
import importlib
import os
from collections import Counter
from collections.abc import Awaitable, Callable
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

import anyio
import msgspec
import structlog
from anyio.abc import SocketAttribute, SocketListener, SocketStream, TaskGroup, TaskStatus

from sessiond_daemon import host
from sessiond_daemon.serve.methods import MethodTable
from sessiond_daemon.serve.server import Peer, peer_of
from sessiond_daemon.serve.server import Server as RpcServer
from sessiond_daemon.serve.web.calls import Calls
from sessiond_schemas.errors import INVALID_REQUEST, PERMISSION_DENIED
from sessiond_schemas.paths import mcp_socket_path

if TYPE_CHECKING:
    from sessiond_daemon.serve.mcp import McpServer

log = structlog.get_logger("sessiond.mcp")

MAX_CONNECTIONS = 64  # MCP socket connections served at once; more wait to be accepted
# Of those, what one uid other than the owner's (or root's) may hold, and all such uids
# together, so that peers cannot take them all: a connection past either is refused
# (-32006) and the owner's always find room.
PEER_CONNECTIONS = MAX_CONNECTIONS // 4
PEERS_CONNECTIONS = MAX_CONNECTIONS * 3 // 4
# An MCP message is a tool call (a query, ids, a cursor): a line longer than this is
# refused, so that what unfinished lines hold is bounded (the RPC socket's budget does
# not see this socket).
MAX_MESSAGE_BYTES = 1 << 20
NOT_INSTALLED = ("MCP needs the mcp package where the daemon runs:"
                 " pip install 'sessiond[mcp]', then restart sessiond")


def sdk_installed() -> bool:
    """Whether the `mcp` SDK (the extra `mcp`) can be imported, without importing it."""
    return all(find_spec(name) is not None for name in ("mcp", "mcp_types", "starlette"))


class McpLoader:
    """The MCP server over `calls`, built once, at the first `get`."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self._server: McpServer | None = None
        self._lock = anyio.Lock()

    async def get(self) -> McpServer:
        if self._server is None:
            async with self._lock:
                if self._server is None:
                    module: Any = await anyio.to_thread.run_sync(
                        importlib.import_module, "sessiond_daemon.serve.mcp")
                    self._server = module.McpServer(self.calls)
        assert self._server is not None
        return self._server


def calls_of(table: MethodTable, rpc: RpcServer) -> Calls:
    """The method table with the RPC socket's checks, read at each call (a reload changes
    the grants): as the HTTP face calls it."""
    return Calls(table, lambda: rpc.grants, lambda: rpc.draining,
                 lambda: rpc.limits.max_page_bytes)


async def start_socket(tg: TaskGroup, table: MethodTable, rpc: RpcServer, socket_path: str,
                       bind: Callable[[str], Awaitable[SocketListener]]
                       ) -> tuple[str, os.stat_result] | None:
    """Serve the MCP socket beside `socket_path` in `tg`; the path bound and its stat (to
    remove it at the end), or None: no SDK, no named RPC socket (systemd's unnamed one),
    or a path that cannot be bound (said in the log: the daemon serves on without it)."""
    if not sdk_installed():
        log.info("mcp.off", reason="the mcp package is not installed (the extra sessiond[mcp])")
        return None
    if not os.path.exists(socket_path):
        return None
    path = mcp_socket_path(socket_path)
    try:
        listener = await bind(path)
    except Exception as exc:  # a path too long, another daemon's socket: no MCP socket
        log.warning("mcp.socket_not_bound", path=path, error=str(exc))
        return None
    bound = os.lstat(path)

    def allowed(peer: Peer) -> bool:  # as the RPC socket lets peers in (reloads change it)
        return (peer.uid in (os.getuid(), 0) or peer.uid in rpc.allowed_uids
                or peer.gid in rpc.allowed_gids)

    loader = McpLoader(calls_of(table, rpc))
    held: Counter[int] = Counter()  # connections by uid (the owner's and root's too)

    async def connection(stream: SocketStream) -> None:
        try:
            peer = peer_of(stream.extra(SocketAttribute.raw_socket))
            async with stream:
                if not allowed(peer):
                    log.warning("mcp.peer_refused", uid=peer.uid, pid=peer.pid)
                    await refuse(stream, f"uid {peer.uid} may not use this daemon", peer)
                    return
                owners = (os.getuid(), 0)
                peers = sum(n for uid, n in held.items() if uid not in owners)
                if peer.uid not in owners and (held[peer.uid] >= PEER_CONNECTIONS
                                               or peers >= PEERS_CONNECTIONS):
                    await refuse(stream, f"the MCP socket serves uid {peer.uid}"
                                 f" {PEER_CONNECTIONS} connections at most, and peers"
                                 f" {PEERS_CONNECTIONS} together: try again later", peer)
                    return
                held[peer.uid] += 1
                try:
                    server = await loader.get()
                    await server.connection(stream, peer, allowed,
                                            min(MAX_MESSAGE_BYTES,
                                                rpc.limits.max_request_bytes))
                finally:
                    held[peer.uid] -= 1
        except Exception:  # one connection's bug must not end the accept loop
            log.exception("mcp.connection_failed")

    async def serve(*, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        task_status.started()
        async with listener:
            await host.accept_forever(listener, connection, what="mcp",
                                      slots=anyio.Semaphore(MAX_CONNECTIONS))

    await tg.start(serve)
    log.info("mcp.listening", socket=path)
    return path, bound


async def refuse(stream: SocketStream, message: str, peer: Peer | None) -> None:
    """Say why a connection ends (a JSON-RPC error without an id), as the RPC socket does:
    -32006 for a peer not let in, else -32600."""
    error: dict[str, Any] = {"code": PERMISSION_DENIED if peer else INVALID_REQUEST,
                             "message": message}
    if peer is not None:
        error["data"] = {"uid": peer.uid}
    line = msgspec.json.encode({"jsonrpc": "2.0", "id": None, "error": error})
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError,
                             anyio.EndOfStream, OSError), anyio.move_on_after(1):
        await stream.send(line + b"\n")
        # Closing on unread input resets the connection, and the client would lose this
        # answer: end our side, then discard its input for a moment (as server.py does).
        await stream.send_eof()
        while await stream.receive():
            pass
