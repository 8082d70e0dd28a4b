"""How sessions look as Durable Streams: offsets, content types, chunks, cursors, errors.

An offset is a session version, zero-padded to 20 digits (2^63 has 19), so offsets sort
as strings do; "the data after offset N" is the events after version N. A generic
stream's bytes are its `stream.chunk` events; a typed session's messages are its events.
"""

from __future__ import annotations

import base64
import random
import re
import time
from typing import Any

import msgspec

from sessiond_schemas.errors import SessiondError
from sessiond_schemas.state import MAX_TTL_S
from sessiond_schemas.streams import KEY, MEDIA_TYPE, epoch

JSON = "application/json"
OCTETS = "application/octet-stream"
SOURCE = "durable-streams"  # session.created `source` of a generic stream
META = KEY  # its metadata key: sessiond_schemas.streams.StreamSettings
_WIDTH = 20
# What parse_offset takes: ours, and the reference server's shape (digits_digits), whose
# first part is read as the version (the suite forks at a constructed zero offset).
_OFFSET = re.compile(r"^([0-9]{1,20})(?:_[0-9]{1,20})?$")
_TTL = re.compile(r"^(0|[1-9][0-9]{0,17})$")
MAX_ITEMS = 10_000  # items of one append, as events.append takes
_SESSION_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$")
_TEXTUAL = re.compile(
    r"^(text/.*|application/(json|ndjson|x-ndjson|xml|javascript|x-www-form-urlencoded)"
    r"|application/.*\+(json|xml))$")
# Long-poll cursors (protocol section 10.1): 20-second intervals since 2024-10-09.
_CURSOR_EPOCH_S = 1728432000
_CURSOR_INTERVAL_S = 20
_encoder = msgspec.json.Encoder()
_decoder = msgspec.json.Decoder()


class HttpError(Exception):
    """A request the protocol refuses: an HTTP status, a sentence, and headers to add."""

    def __init__(self, status: int, message: str, headers: dict[str, str] | None = None,
                 code: int | None = None, data: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.status, self.message = status, message
        self.headers = headers or {}
        self.code, self.data = code, data or {}

    def body(self) -> bytes:
        error: dict[str, Any] = {"message": self.message}
        if self.code is not None:
            error |= {"code": self.code, "data": self.data}
        return _encoder.encode({"error": error})


# The contract's error codes (schemas/errors.py) as HTTP statuses.
_STATUS = {-32700: 400, -32600: 400, -32602: 400, -32001: 404, -32002: 409, -32003: 409,
           -32004: 409, -32005: 413, -32006: 403, -32007: 409, -32008: 429, -32010: 503,
           -32011: 409, -32012: 503, -32013: 409, -32015: 410}


def from_rpc(exc: SessiondError) -> HttpError:
    """A JSON-RPC error as the HTTP error that says the same (its code and data kept)."""
    headers = {}
    if exc.code == -32008:
        headers["retry-after"] = str(max(1, int(exc.data.get("retry_after_ms", 1000)) // 1000))
    return HttpError(_STATUS.get(exc.code, 500), exc.message, headers, exc.code, exc.data)


def offset(version: int) -> str:
    return f"{version:0{_WIDTH}d}"


def parse_offset(text: str | None, tail: int) -> int:
    """The version after which to read: -1 (or none) is the start, `now` the tail."""
    if text is None or text == "-1":
        return 0
    if text == "now":
        return tail
    matched = _OFFSET.fullmatch(text)
    if not matched or int(matched.group(1)) >= 2**63:
        raise HttpError(400, f"malformed offset {text[:40]!r}: use -1, now or an offset"
                        " this server returned")
    return int(matched.group(1))


def session_id(name: str) -> str:
    if not _SESSION_ID.fullmatch(name):
        raise HttpError(400, f"stream name {name[:80]!r} is not a session id: 1-128 of"
                        " A-Z a-z 0-9 _ . : -, starting with a letter or digit")
    return name




def check_content_type(content_type: str) -> str:
    """A stream's content type: a media type with parameters, at most 255 characters."""
    value = content_type.strip()
    if len(value) > 255 or not MEDIA_TYPE.match(value):
        raise HttpError(400, f"not a media type: {content_type[:80]!r}")
    return value


def media_type(content_type: str | None) -> str:
    return (content_type or "").split(";")[0].strip().lower()


def textual(content_type: str) -> bool:
    return bool(_TEXTUAL.match(media_type(content_type)))


def sse_base64(content_type: str) -> bool:
    """SSE carries text/* and JSON as they are, everything else as base64 (section 5.8)."""
    mt = media_type(content_type)
    return not (mt.startswith("text/") or mt == JSON)


def is_json(content_type: str) -> bool:
    return media_type(content_type) == JSON


def chunk_events(content_type: str, body: bytes, *, seq: str | None,
                 creating: bool) -> list[dict[str, Any]]:
    """The stream.chunk events a body appends: one per JSON message (a top-level array
    is flattened one level), else one for the whole body."""
    if is_json(content_type):
        if creating and not body.strip():
            return []
        try:
            value = _decoder.decode(body)
        except (msgspec.DecodeError, RecursionError) as exc:
            raise HttpError(400, f"the body is not valid JSON: {exc}") from exc
        messages = value if isinstance(value, list) else [value]
        if not messages and not creating:
            raise HttpError(400, "an empty JSON array appends nothing (section 9.1.3)")
        _at_most(len(messages))
        chunks = [{"text": _encoder.encode(m).decode()} for m in messages]
    elif not body:
        chunks = []
    elif textual(content_type) and b"\0" not in body:  # NUL is kept as bytes (base64)
        try:
            chunks = [{"text": body.decode()}]
        except UnicodeDecodeError:
            chunks = [{"base64": base64.b64encode(body).decode()}]
    else:
        chunks = [{"base64": base64.b64encode(body).decode()}]
    if seq is not None and chunks:
        chunks[-1]["seq"] = seq
    return [{"type": "stream.chunk", "data": c} for c in chunks]


def chunk_bytes(data: dict[str, Any]) -> bytes:
    """A stored chunk's bytes. Never raises on what is stored: a base64 text an older
    release let through unpadded is read as if padded."""
    text = data.get("text")
    if isinstance(text, str):
        return text.encode()
    coded = data.get("base64") or ""
    try:
        return base64.b64decode(coded + "=" * (-len(coded) % 4))
    except (ValueError, TypeError):
        return b""


def _at_most(count: int) -> None:
    """An append of more items than events.append takes is 413, before any is built."""
    if count > MAX_ITEMS:
        raise HttpError(413, f"one append takes at most {MAX_ITEMS} messages, not {count}")


def typed_events(body: bytes) -> list[dict[str, Any]]:
    """A typed session's POST: one {type, data} event, or an array of them."""
    try:
        value = _decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise HttpError(400, f"the body is not valid JSON: {exc}") from exc
    items = value if isinstance(value, list) else [value]
    if not items:
        raise HttpError(400, "an empty JSON array appends nothing (section 9.1.3)")
    _at_most(len(items))
    return items


def check_ttl(ttl: str | None, expires_at: str | None) -> tuple[int | None, str | None]:
    """Validate Stream-TTL and Stream-Expires-At (section 5.1); at most one of them."""
    if ttl is not None and expires_at is not None:
        raise HttpError(400, "give Stream-TTL or Stream-Expires-At, not both")
    if ttl is not None and not _TTL.fullmatch(ttl):
        raise HttpError(400, f"Stream-TTL must be a whole number of seconds: {ttl[:40]!r}")
    if expires_at is not None:
        try:
            when = epoch(expires_at)
        except (ValueError, OverflowError) as exc:
            raise HttpError(400, f"Stream-Expires-At must be an RFC 3339 time:"
                            f" {expires_at[:60]!r} ({exc})") from exc
        if when - time.time() > MAX_TTL_S:
            raise HttpError(400, f"Stream-Expires-At is more than {MAX_TTL_S} s (ten years)"
                            " away")
    if ttl is not None and int(ttl) > MAX_TTL_S:
        raise HttpError(400, f"Stream-TTL is more than {MAX_TTL_S} s (ten years)")
    return (int(ttl) if ttl is not None else None), expires_at


def cursor(client: str | None) -> str:
    """A live response's Stream-Cursor: the current interval, and always past the client's."""
    now = int((time.time() - _CURSOR_EPOCH_S) // _CURSOR_INTERVAL_S)
    if client is not None and client.isdigit() and len(client) < 19 and int(client) >= now:
        return str(int(client) + random.randint(1, 180))
    return str(now)


def encode(value: Any) -> bytes:
    return _encoder.encode(value)
