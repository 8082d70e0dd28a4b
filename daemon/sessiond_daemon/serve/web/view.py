"""The web view: its page (`/ui/`, static files shipped in `ui/`) and the JSON-RPC it reads
with (`POST /rpc`: the socket's contract, with the caller's grants, over HTTP).

The page is plain HTML, CSS and one ES module, written here and served as they are: no
build step, no third-party script. It reads with `/rpc` and follows a session over the
Durable Streams SSE tail; it writes only from its labelled buttons (fork, end, delete),
and those calls pass the same grants as any other.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from importlib import resources
from typing import Any

import msgspec

from sessiond_daemon.serve.web.calls import Caller, Calls
from sessiond_daemon.serve.web.codec import HttpError
from sessiond_daemon.serve.web.streams import Reply
from sessiond_schemas.errors import (
    INVALID_REQUEST,
    METHOD_NOT_FOUND,
    PARSE_ERROR,
    SessiondError,
)

UI_PREFIX = "/ui"
RPC_PATH = "/rpc"
EXPORT_PREFIX = "/ui/export/"  # + a session id: its export document, as a download
_TYPES = {"html": "text/html; charset=utf-8", "css": "text/css; charset=utf-8",
          "js": "text/javascript; charset=utf-8"}
# The page may load only itself and talk only to its own origin; nothing may frame it.
_POLICY = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:;"
           " connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")


class _Request(msgspec.Struct, forbid_unknown_fields=True):
    jsonrpc: str
    method: str
    id: int | str | None = None
    params: dict[str, Any] = {}


_decode = msgspec.json.Decoder(_Request).decode
_encode = msgspec.json.Encoder().encode


def _files() -> dict[str, bytes]:
    folder = resources.files(__package__).joinpath("ui")
    return {f.name: f.read_bytes() for f in folder.iterdir()
            if f.is_file() and f.name.rpartition(".")[2] in _TYPES}


class WebView:
    """Serves the page and /rpc for the HTTP face's app."""

    def __init__(self, calls: Calls) -> None:
        self.calls = calls
        self.files = _files()  # read once: a few tens of KB

    @staticmethod
    def serves(path: str) -> bool:
        return path in ("/", UI_PREFIX, RPC_PATH) or path.startswith(UI_PREFIX + "/")

    async def handle(self, method: str, path: str, headers: dict[str, str], body: bytes,
                     caller: Caller) -> Reply:
        if path == RPC_PATH:
            if method != "POST":
                raise HttpError(405, "/rpc takes a JSON-RPC request by POST", {"allow": "POST"})
            if headers.get("content-type", "").split(";")[0].strip() != "application/json":
                # A page of another origin cannot send this without a CORS preflight.
                raise HttpError(415, "/rpc takes content-type: application/json")
            return Reply(200, {"content-type": "application/json", "cache-control": "no-store"},
                         await self.rpc(body, caller))
        if method not in ("GET", "HEAD"):
            raise HttpError(405, "the web view is read with GET", {"allow": "GET, HEAD"})
        if path in ("/", UI_PREFIX):  # relative links need the trailing slash
            return Reply(308, {"location": "ui/"})
        name = path[len(UI_PREFIX) + 1:] or "index.html"
        data = self.files.get(name)
        if data is None:
            raise HttpError(404, f"the web view has no file {name!r}")
        return Reply(200, {"content-type": _TYPES[name.rpartition(".")[2]],
                           "content-security-policy": _POLICY, "cache-control": "no-cache",
                           "x-frame-options": "DENY", "referrer-policy": "no-referrer"}, data)

    async def export(self, session_id: str, caller: Caller) -> AsyncIterator[bytes]:
        """The session's export document, one part per page of session.export, put
        together as sessionctl export puts it (the clients' ExportDocument): the same JSON.
        """
        page = await self.calls.call("session.export", {"session_id": session_id}, caller)
        if "next_cursor" not in page:  # the whole document in one answer
            yield _encode(page)
            return
        head = {k: page[k] for k in ("format", "format_version", "exported_at")}
        into, first = "events", True
        part = [_encode(head)[:-1] + b',"events":[']
        while True:
            for key in ("events", "checkpoints"):
                if page[key] and into != key:
                    part.append(b'],"checkpoints":[')
                    into, first = key, True
                for item in page[key]:
                    part.append((b"" if first else b",") + _encode(item))
                    first = False
            if page["next_cursor"] is None:
                part.append((b"" if into == "checkpoints" else b'],"checkpoints":[') + b"],"
                            + _encode({"session": page["session"],
                                       "checksum": page["checksum"]})[1:])
                yield b"".join(part)
                return
            yield b"".join(part)
            part = []
            page = await self.calls.call("session.export", {
                "session_id": session_id, "cursor": page["next_cursor"]}, caller)

    async def rpc(self, body: bytes, caller: Caller) -> bytes:
        """One JSON-RPC 2.0 request (no batches) run as `caller`; the response's bytes."""
        try:
            req = _decode(body)
        except msgspec.ValidationError as exc:
            return _error(None, INVALID_REQUEST, f"invalid request: {exc}")
        except msgspec.DecodeError as exc:
            return _error(None, PARSE_ERROR, f"parse error: {exc}")
        if req.jsonrpc != "2.0":
            return _error(req.id, INVALID_REQUEST, 'invalid request: jsonrpc must be "2.0"')
        m = self.calls.table.get(req.method)
        if m is None or m.handler is None:  # a subscription lives on its connection
            return _error(req.id, METHOD_NOT_FOUND, f"method not found over HTTP: {req.method}"
                          + (" (a subscription needs a connection: follow a session with its"
                             " stream's SSE tail)" if m is not None else ""))
        try:
            result = await self.calls.call(req.method, req.params, caller)
        except SessiondError as exc:
            return _error(req.id, exc.code, exc.message, exc.data)
        return _encode({"jsonrpc": "2.0", "id": req.id, "result": result})


def _error(rid: Any, code: int, message: str, data: Any = None) -> bytes:
    error: dict[str, Any] = {"code": code, "message": message}
    if data is not None:
        error["data"] = data
    return _encode({"jsonrpc": "2.0", "id": rid, "error": error})
