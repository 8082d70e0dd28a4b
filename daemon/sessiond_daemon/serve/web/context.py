"""The context read over HTTP (docs/http.md, "The context"): `GET /v1/stream/<id>?context`
answers what the model sees now (session.context: the last compaction's summary and the
messages after it) in one request, with `Stream-Next-Offset` at the version it was read
at, so a client resumes by tailing from there instead of replaying the stream."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import msgspec

from sessiond_daemon.serve.web import codec
from sessiond_daemon.serve.web.codec import HttpError

if TYPE_CHECKING:
    from sessiond_daemon.serve.web.streams import Request, Streams

_json = msgspec.json.Encoder()


def _int(r: Request, name: str) -> int | None:
    text = r.param(name)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise HttpError(400, f"{name} must be an integer, not {text[:20]!r}") from None


async def context_reply(streams: Streams, r: Request) -> tuple[dict[str, str], bytes]:
    """The headers and body of a 200 with the context as JSON (session.context's result:
    `version`, `compaction`, `summary`, `messages`, `total`, `next`); `limit` and
    `after_sequence` page it as over the socket."""
    for refused in ("offset", "live"):
        if r.param(refused) is not None:
            raise HttpError(400, f"a context read takes no {refused}: it answers from the"
                            " last compaction on; tail from its Stream-Next-Offset")
    await streams.view(r.name, r.caller, touch=True)  # 404 and 410 as every read
    params: dict[str, Any] = {"session_id": r.name}
    for name in ("limit", "after_sequence"):
        if (value := _int(r, name)) is not None:
            params[name] = value
    result = await streams.calls.call("session.context", params, r.caller)
    return ({"content-type": "application/json", "cache-control": "no-store",
             "stream-next-offset": codec.offset(result["version"])}, _json.encode(result))
