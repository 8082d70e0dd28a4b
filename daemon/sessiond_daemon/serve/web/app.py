"""The HTTP face's ASGI app: who is asking, which route, and the protocol's headers.

Routes (docs/http.md): `/v1/stream/<session id>` (the Durable Streams protocol, streams.py),
`/metrics` (Prometheus) and `/mcp` (the MCP server, docs/mcp.md). On a Unix socket the
peer's uid decides, as on the RPC socket; on TCP a bearer token, in an `Authorization:
Bearer` header or as the capability prefix `/t/<token>` of the path (for clients that
take only a base URL).

Before either, on every listener (`hosts.py`): a request whose Host is not loopback's, the
listener's own address or one of `http_allowed_hosts` is refused (403: a DNS-rebinding
page's, or a proxy's that passes it on), and so is a write (any method but GET, HEAD and
OPTIONS) whose Origin is neither the face's own nor one of `http_cors_origins`.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any
from urllib.parse import parse_qsl, unquote

import anyio
import structlog

from sessiond_daemon.serve.mcp_entry import NOT_INSTALLED, McpLoader, sdk_installed
from sessiond_daemon.serve.server import Peer
from sessiond_daemon.serve.web import hosts
from sessiond_daemon.serve.web.auth import Tokens
from sessiond_daemon.serve.web.calls import Caller
from sessiond_daemon.serve.web.codec import (
    HttpError,
    from_rpc,
    session_id,
    sse_base64,
)
from sessiond_daemon.serve.web.listen import ABORT, PEER
from sessiond_daemon.serve.web.streams import Reply, Request, Streams, offset_within
from sessiond_daemon.serve.web.view import EXPORT_PREFIX, WebView
from sessiond_schemas.errors import SessiondError

log = structlog.get_logger("sessiond.http")

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Metrics = Callable[[str | None], Awaitable[tuple[bytes, str]]]

STREAM_PREFIX = "/v1/stream/"
MCP_PATH = "/mcp"  # the MCP server, Streamable HTTP (docs/mcp.md)
# A stream's content type is its writer's choice (text/html, say): a sandbox with no
# sources keeps a browser that opens a stream URL from running what it holds.
_SECURITY = [(b"x-content-type-options", b"nosniff"),
             (b"cross-origin-resource-policy", b"same-origin"),
             (b"content-security-policy", b"default-src 'none'; sandbox")]
_EXPOSED = ("stream-next-offset, stream-cursor, stream-up-to-date, stream-closed, etag,"
            " stream-ttl, stream-expires-at, stream-sse-data-encoding, producer-epoch,"
            " producer-seq, producer-expected-seq, producer-received-seq, location")
_ALLOWED_HEADERS = ("authorization, content-type, stream-seq, stream-ttl, stream-expires-at,"
                    " stream-closed, stream-forked-from, stream-fork-offset,"
                    " stream-fork-sub-offset, producer-id, producer-epoch, producer-seq,"
                    " if-none-match")


@dataclass(slots=True)
class Settings:
    max_body_bytes: int
    send_timeout_s: float
    cors_origins: frozenset[str]
    allowed_hosts: frozenset[str]  # http_allowed_hosts, lower case
    allowed_uids: frozenset[int]
    allowed_gids: frozenset[int]


class App:
    """One ASGI app for every HTTP listener; `metrics_only` for --metrics-listen's."""

    def __init__(self, streams: Streams | None, tokens: Tokens | None, metrics: Metrics | None,
                 settings: Callable[[], Settings], *, metrics_only: bool = False,
                 view: WebView | None = None) -> None:
        self.streams, self.tokens, self.metrics = streams, tokens, metrics
        self.view = view  # the web view's page and /rpc
        self.settings = settings  # read per request: SIGHUP reloads some
        self.metrics_only = metrics_only
        # /mcp: the MCP server, loaded at its first request (none without the SDK)
        self.mcp = McpLoader(view.calls) if view is not None and sdk_installed() else None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            return
        settings = self.settings()
        origin = _header(scope, b"origin")
        cors = origin if origin is not None and (
            origin in settings.cors_origins or "*" in settings.cors_origins) else None

        async def reply(r: Reply) -> None:
            headers = r.headers
            if r.status not in (204, 304) and scope["method"] != "HEAD":
                headers = {**headers, "content-length": str(len(r.body))}
            await _timed(scope, settings, send, _start(r.status, headers, cors))
            await _timed(scope, settings, send, {"type": "http.response.body", "body": (
                b"" if scope["method"] == "HEAD" or r.status in (204, 304) else r.body)})

        try:
            hosts.check(scope, _header(scope, b"host"), origin, settings.allowed_hosts,
                        settings.cors_origins)
            await self._route(scope, receive, send, settings, cors, reply)
        except HttpError as exc:
            await reply(Reply(exc.status, {"content-type": "application/json",
                                           **exc.headers}, exc.body()))
        except SessiondError as exc:
            e = from_rpc(exc)
            await reply(Reply(e.status, {"content-type": "application/json", **e.headers},
                              e.body()))
        except anyio.get_cancelled_exc_class():
            raise
        except _Aborted:
            pass

    async def _route(self, scope: Scope, receive: Receive, send: Send, settings: Settings,
                     cors: str | None, reply: Callable[[Reply], Awaitable[None]]) -> None:
        path: str = scope["path"]
        method: str = scope["method"]
        if self.metrics_only:
            if path not in ("/metrics", "/"):
                raise HttpError(404, "the metrics are at /metrics")
            await self._metrics(scope, method, reply)
            return
        if method == "OPTIONS":  # a preflight; without an allowed origin it grants nothing
            # It carries no credentials (a browser never sends Authorization on one), so it
            # is answered before the caller is known; what it says is the same to anyone.
            await reply(Reply(204, {
                "access-control-allow-methods": "GET, HEAD, POST, PUT, DELETE, OPTIONS",
                "access-control-allow-headers": _ALLOWED_HEADERS,
                "access-control-max-age": "600"}))
            return
        if path == "/favicon.ico" and method in ("GET", "HEAD"):
            # What a browser asks of every host it shows a page of, without the token in
            # the path: no icon, and no 401 (and its log line) for each page.
            await reply(Reply(204, {"cache-control": "max-age=86400"}))
            return
        caller, mount, path = self._authenticate(scope, path, settings)
        if path == "/metrics":
            if caller.uid != os.getuid():
                raise HttpError(403, "the metrics are the owner's (use the owner's token)")
            await self._metrics(scope, method, reply)
            return
        if path == MCP_PATH:
            if self.mcp is None:
                raise HttpError(404, NOT_INSTALLED)
            # The MCP server (serve/mcp.py), answering as the caller authenticated here.
            server = await self.mcp.get()
            await server.http(scope, receive, partial(_timed, scope, settings, send), caller,
                              settings.max_body_bytes)
            return
        if self.view is not None and path.startswith(EXPORT_PREFIX) and method == "GET":
            # A session's export document, streamed a page at a time (its bytes as the
            # daemon encodes them: a browser re-encoding JSON would change 1.0 to 1).
            parts = self.view.export(session_id(unquote(path[len(EXPORT_PREFIX):])), caller)
            first = await anext(parts)  # a refusal (404, 403) before the response starts
            await _timed(scope, settings, send, _start(200, {
                "content-type": "application/json", "cache-control": "no-store",
                "content-disposition": "attachment"}, cors))
            await _timed(scope, settings, send, {"type": "http.response.body", "body": first,
                                                 "more_body": True})
            async for part in parts:
                await _timed(scope, settings, send, {"type": "http.response.body",
                                                     "body": part, "more_body": True})
            await _timed(scope, settings, send, {"type": "http.response.body", "body": b""})
            return
        if self.view is not None and self.view.serves(path):
            body = await _body(receive, settings.max_body_bytes) if method == "POST" else b""
            await reply(await self.view.handle(method, path, _headers(scope), body, caller))
            return
        if not path.startswith(STREAM_PREFIX) or self.streams is None:
            raise HttpError(404, f"no such route: streams are at {STREAM_PREFIX}<session id>")
        name = session_id(unquote(path[len(STREAM_PREFIX):]))
        body = await _body(receive, settings.max_body_bytes) if method in ("PUT", "POST") \
            else b""
        request = Request(method=method, name=name, query=parse_qsl(
            scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True),
            headers=_headers(scope), body=body, caller=caller,
            mount=f"{scope.get('scheme', 'http')}://{_header(scope, b'host') or 'localhost'}"
                  f"{mount}")
        streams = self.streams
        if method == "GET" and request.param("live") == "sse":
            await self._sse(scope, receive, send, settings, cors, request)
            return
        handlers = {"GET": streams.get, "HEAD": streams.head, "PUT": streams.put,
                    "POST": streams.post, "DELETE": streams.delete}
        handler = handlers.get(method)
        if handler is None:
            raise HttpError(405, f"{method} is not a stream operation", {
                "allow": "GET, HEAD, POST, PUT, DELETE"})
        if method == "GET" and request.param("live") == "long-poll":
            result: list[Reply] = []
            await _until_disconnect(receive, lambda: _collect(handler(request), result))
            if result:
                await reply(result[0])
            return
        await reply(await handler(request))

    def _authenticate(self, scope: Scope, path: str, settings: Settings
                      ) -> tuple[Caller, str, str]:
        """The caller, the mount prefix, and the path under it; or 401/403."""
        peer: Peer | None = scope.get(PEER)
        mount, token = "", None
        if path.startswith("/t/"):
            token, _, rest = path[3:].partition("/")
            mount, path = f"/t/{token}", "/" + rest
        else:
            auth = _header(scope, b"authorization") or ""
            if auth[:7].lower() == "bearer ":
                token = auth[7:].strip()
        if peer is not None:  # a Unix socket: the peer's uid, as on the RPC socket
            if not (peer.uid in (os.getuid(), 0) or peer.uid in settings.allowed_uids
                    or peer.gid in settings.allowed_gids):
                raise HttpError(403, f"uid {peer.uid} may not use this daemon")
            return Caller(peer.uid, peer.pid), mount, path
        if token is None:
            raise HttpError(401, "a token is needed: Authorization: Bearer <token>, or the"
                            " path prefix /t/<token> (sessionctl http-token prints it)",
                            {"www-authenticate": "Bearer"})
        uid = self.tokens.uid_of(token) if self.tokens is not None else None
        if uid is None:
            log.warning("http.token_refused", client=str(scope.get("client")))
            raise HttpError(403, "the token is not this daemon's (rotated?); ask sessionctl"
                            " http-token for the current one")
        return Caller(uid), mount, path

    async def _metrics(self, scope: Scope, method: str,
                       reply: Callable[[Reply], Awaitable[None]]) -> None:
        if self.metrics is None:
            raise HttpError(404, "metrics are off: they need prometheus-client"
                            " (pip install 'sessiond[metrics]')")
        if method not in ("GET", "HEAD"):
            raise HttpError(405, "the metrics are read with GET", {"allow": "GET, HEAD"})
        body, content_type = await self.metrics(_header(scope, b"accept"))
        await reply(Reply(200, {"content-type": content_type}, body))

    async def _sse(self, scope: Scope, receive: Receive, send: Send, settings: Settings,
                   cors: str | None, request: Request) -> None:
        assert self.streams is not None
        if request.param("offset") is None:
            raise HttpError(400, "live=sse needs an offset (-1 for the start, now)")
        view = await self.streams.view(request.name, request.caller)
        offset_within(request.param("offset"), view)  # 400 before the stream starts
        headers = {"content-type": "text/event-stream", "cache-control": "no-cache, no-store"}
        if sse_base64(view.content_type):
            headers["stream-sse-data-encoding"] = "base64"
        await _timed(scope, settings, send, _start(200, headers, cors))

        async def chunk(data: bytes) -> None:
            await _timed(scope, settings, send, {"type": "http.response.body", "body": data,
                                                 "more_body": True})

        try:
            await _until_disconnect(receive, lambda: self.streams.sse(request, chunk)
                                    if self.streams else _nothing())
        except (HttpError, SessiondError) as exc:  # mid-stream: end it, say why in the log
            log.info("http.sse_ended", reason=str(exc)[:200])
        await _timed(scope, settings, send, {"type": "http.response.body", "body": b""})


class _Aborted(Exception):
    """The client did not read for send_timeout_s: its connection was dropped."""


async def _nothing() -> None:
    pass


async def _collect(work: Awaitable[Reply], into: list[Reply]) -> None:
    into.append(await work)


async def _until_disconnect(receive: Receive, work: Callable[[], Awaitable[None]]) -> None:
    """Run `work` until it returns or the client disconnects; its error is raised as is."""
    failed: list[BaseException] = []
    async with anyio.create_task_group() as tg:
        async def watch() -> None:
            while (await receive())["type"] != "http.disconnect":
                pass
            tg.cancel_scope.cancel()

        tg.start_soon(watch)
        try:
            await work()
        except Exception as exc:  # not inside the group's ExceptionGroup
            failed.append(exc)
        tg.cancel_scope.cancel()
    if failed:
        raise failed[0]


async def _timed(scope: Scope, settings: Settings, send: Send, message: dict[str, Any]) -> None:
    """Send, or drop the connection of a client that has not read for send_timeout_s (its
    unread bytes stay bounded by the transport's high-water mark meanwhile)."""
    with anyio.move_on_after(settings.send_timeout_s) as scope_:
        await send(message)
    if scope_.cancelled_caught:
        log.info("http.client_not_reading", client=str(scope.get("client")))
        scope[ABORT]()
        raise _Aborted


async def _body(receive: Receive, limit: int) -> bytes:
    parts: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            raise _Aborted
        part = message.get("body", b"")
        size += len(part)
        if size > limit:
            raise HttpError(413, f"the body is over {limit} bytes (max_request_bytes)")
        parts.append(part)
        if not message.get("more_body"):
            return b"".join(parts)


def _start(status: int, headers: dict[str, str], cors: str | None) -> dict[str, Any]:
    raw = [(k.encode("latin-1"), v.encode("latin-1", errors="replace"))
           for k, v in headers.items()]
    # The web view's page sends a policy of its own (view.py): the sandbox would stop its
    # script, and a browser enforces every policy it is sent.
    raw += [h for h in _SECURITY if h[0] != b"content-security-policy"
            or "content-security-policy" not in headers]
    if cors is not None:
        raw += [(b"access-control-allow-origin", cors.encode("latin-1")),
                (b"access-control-expose-headers", _EXPOSED.encode()), (b"vary", b"origin")]
    return {"type": "http.response.start", "status": status, "headers": raw}


def _headers(scope: Scope) -> dict[str, str]:
    return {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}


def _header(scope: Scope, name: bytes) -> str | None:
    for k, v in scope["headers"]:
        if k.lower() == name:
            return str(v.decode("latin-1"))
    return None
