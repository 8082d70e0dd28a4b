"""The MCP server (docs/mcp.md), on the official `mcp` SDK: the tools of mcp_tools.py,
served two ways, with the same grants as every other face.

- `/mcp` on the HTTP face (Streamable HTTP, stateless, JSON responses; also under the
  capability prefix `/t/<token>/mcp`): the face's app authenticates the request (a Unix
  peer's uid, or a bearer token) and hands it here with its caller.
- The MCP socket, beside the RPC socket (`sessiond.mcp.sock` beside `sessiond.sock`;
  mcp_entry.py binds it and lets peers in): newline-delimited JSON-RPC, MCP's stdio
  framing, one MCP session a connection, whose caller is the peer's uid (SO_PEERCRED).
  `sessionctl mcp` relays a CLI's stdio to it.

This module imports the SDK; mcp_entry.py loads it at the first client.

Either way each tool runs as its caller through `Calls` (the socket's checks: grants,
draining, page budget), so a peer's agent sees and does only what the peer may.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

import anyio
import mcp_types as types
import msgspec
import structlog
from anyio.abc import SocketStream
from anyio.streams.buffered import BufferedByteReceiveStream
from mcp.server.lowlevel import Server
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.message import ServerMessageMetadata, SessionMessage
from starlette.requests import Request

from sessiond_daemon.features.service import VERSION
from sessiond_daemon.serve.mcp_entry import refuse
from sessiond_daemon.serve.mcp_tools import Tools
from sessiond_daemon.serve.server import Peer
from sessiond_daemon.serve.web.calls import Caller, Calls
from sessiond_schemas.errors import INTERNAL_ERROR, SessiondError
from sessiond_schemas.events import new_id

log = structlog.get_logger("sessiond.mcp")
logging.getLogger("mcp").setLevel(logging.WARNING)  # the SDK's per-request info lines

CALLER = "sessiond.mcp.caller"  # the ASGI scope key of the HTTP request's caller

INSTRUCTIONS = (
    "sessiond keeps the sessions of every agent on this host (and Claude Code and Codex"
    " transcripts imported into it). Search them with search_sessions when a problem may"
    " have been met before; read what a session did with read_messages.")


# Tool calls answered at once, on every transport and connection together: each reads a
# page of the daemon's (a few MiB at most) before cutting it to an answer, and the SDK
# starts a task per request, so what MCP holds is bounded here, whatever clients pipeline.
CALLS_AT_ONCE = 8


class McpServer:
    """The MCP server of one daemon: its tools, and both transports."""

    def __init__(self, calls: Calls) -> None:
        self.tools = Tools(calls)
        self.calls_at_once = anyio.Semaphore(CALLS_AT_ONCE)
        self.listing = [types.Tool(
            name=t.name, title=t.title, description=t.description,
            input_schema=t.input_schema,
            annotations=types.ToolAnnotations(read_only_hint=t.read_only,
                                              destructive_hint=False,
                                              idempotent_hint=t.read_only,
                                              open_world_hint=False))
            for t in self.tools.all.values()]
        self.server: Server[Any] = Server(
            "sessiond", version=VERSION, title="sessiond: every agent session on this host",
            instructions=INSTRUCTIONS, on_list_tools=self._list_tools,
            on_call_tool=self._call_tool)

    async def _list_tools(self, ctx: Any, params: types.PaginatedRequestParams | None
                          ) -> types.ListToolsResult:
        return types.ListToolsResult(tools=self.listing)

    async def _call_tool(self, ctx: Any, params: types.CallToolRequestParams
                         ) -> types.CallToolResult:
        caller = _caller_of(ctx.request)
        if params.name not in self.tools.all:
            return _failed(f"no tool {params.name!r}: the tools are"
                           f" {', '.join(self.tools.all)}")
        try:
            async with self.calls_at_once:
                answer = await self.tools.call(params.name, dict(params.arguments or {}),
                                               caller)
        except SessiondError as exc:
            # Said to the model as a tool's error, with the contract's code (-32006: the
            # caller is not granted the method the tool calls).
            log.info("mcp.tool_refused", tool=params.name, code=exc.code, uid=caller.uid)
            return _failed(f"error {exc.code}: {exc.message}")
        except Exception:  # a bug: logged under an id, never its text to the model
            error_id = new_id()
            log.exception("mcp.internal_error", error_id=error_id, tool=params.name)
            return _failed(f"error {INTERNAL_ERROR}: internal error (error_id {error_id})")
        text = types.TextContent(type="text", text=_encode(answer))
        return types.CallToolResult(content=[text])

    # --- Streamable HTTP: one stateless exchange a request ----------------------------

    async def http(self, scope: dict[str, Any], receive: Any, send: Any, caller: Caller,
                   max_body_bytes: int) -> None:
        """Answer one HTTP request to /mcp as `caller` (the face authenticated it)."""
        manager = StreamableHTTPSessionManager(app=self.server, json_response=True,
                                               stateless=True,
                                               max_request_body_size=max_body_bytes)
        async with manager.run():
            await manager.handle_request({**scope, CALLER: caller}, receive, send)

    # --- the MCP socket: one MCP session a connection ---------------------------------

    async def connection(self, stream: SocketStream, peer: Peer,
                         allowed: Callable[[Peer], bool], max_line_bytes: int) -> None:
        """Serve one MCP session on a connection of the MCP socket, as `peer` (let in
        already; asked again at each message: a reload may revoke)."""
        caller = Caller(peer.uid, peer.pid)
        metadata = ServerMessageMetadata(request_context=caller)
        lines = BufferedByteReceiveStream(stream)
        to_server, from_client = anyio.create_memory_object_stream[
            SessionMessage | Exception](0)
        to_client, from_server = anyio.create_memory_object_stream[SessionMessage](0)

        async def read() -> None:
            async with to_server:
                while True:
                    try:
                        line = await lines.receive_until(b"\n", max_line_bytes)
                    except anyio.DelimiterNotFound:
                        await refuse(stream, f"a message may hold at most"
                                      f" {max_line_bytes} bytes (max_request_bytes)",
                                      None)
                        return
                    except (anyio.IncompleteRead, anyio.EndOfStream,
                            anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return
                    if not allowed(peer):  # access revoked by a reload
                        await refuse(stream, f"uid {peer.uid} may not use this daemon:"
                                      " access revoked by a reload", peer)
                        return
                    try:
                        message = types.jsonrpc_message_adapter.validate_json(
                            line, by_name=False)
                    except Exception as exc:  # the SDK answers it as a parse error
                        await to_server.send(exc)
                        continue
                    await to_server.send(SessionMessage(message, metadata=metadata))

        async def write() -> None:
            async with from_server:
                async for out in from_server:
                    data = out.message.model_dump_json(by_alias=True, exclude_unset=True)
                    try:
                        await stream.send(data.encode() + b"\n")
                    except (anyio.BrokenResourceError, anyio.ClosedResourceError):
                        return

        log.debug("mcp.connected", uid=peer.uid, pid=peer.pid)
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            tg.start_soon(write)
            await self.server.run(from_client, to_client,
                                  self.server.create_initialization_options())
            tg.cancel_scope.cancel()


def _caller_of(request: Any) -> Caller:
    """Who a tool call comes from: the socket's peer, or the HTTP request's caller (set by
    `http`). Never anyone by default: a message with neither is refused."""
    if isinstance(request, Caller):
        return request
    if isinstance(request, Request) and isinstance(request.scope.get(CALLER), Caller):
        return request.scope[CALLER]  # type: ignore[no-any-return]
    raise RuntimeError("an MCP request without a caller")


def _failed(message: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=message)],
                                is_error=True)


def _encode(answer: dict[str, Any]) -> str:
    return msgspec.json.encode(answer).decode()
