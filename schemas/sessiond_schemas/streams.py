"""A Durable Streams stream's settings: its session's `metadata.stream` (docs/http.md).

The HTTP face writes them (at PUT, at a fork, at a soft delete) and reads them on every
request; any caller with the grant may write them too (session.create's metadata, an
events.append of metadata.updated). So the daemon checks them where they are written
(features/service.py): a value the face could not serve is -32602 there, never a 500 on
the face later. The face reads them with the same Struct, and treats a value that does
not fit (written before this check) as no settings at all.
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Annotated, Any

import msgspec

from .bounds import NonNegInt
from .state import MAX_TTL_S

KEY = "stream"  # the metadata key
_TOKEN = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
MEDIA_TYPE = re.compile(rf"^{_TOKEN}/{_TOKEN}"
                        r"(\s*;\s*[A-Za-z0-9!#$&^_.+-]+=(\"[^\"\\\x00-\x1f]*\"|[A-Za-z0-9!#$&^_.+-]+))*$")
RFC3339 = re.compile(
    r"^\d{4}-\d{2}-\d{2}[Tt ]\d{2}:\d{2}:\d{2}(\.\d+)?([Zz]|[+-]\d{2}:\d{2})$")


def epoch(text: str) -> float:
    """An RFC 3339 time's seconds since the epoch (ValueError if it is no time)."""
    if not RFC3339.match(text):
        raise ValueError("not of the form 2026-01-02T03:04:05Z")
    return datetime.fromisoformat(text.upper().replace("Z", "+00:00")).timestamp()


class Fork(msgspec.Struct, forbid_unknown_fields=True):
    offset: NonNegInt
    sub: NonNegInt


MAX_SAFE = 2**53 - 1  # producer epochs and sequence numbers (JavaScript's safe integers)
MAX_PRODUCERS = 1024  # producers a snapshot keeps, the most recent
Safe = Annotated[int, msgspec.Meta(ge=0, le=MAX_SAFE)]


class Writers(msgspec.Struct, forbid_unknown_fields=True):
    """A snapshot of the stream's Stream-Seq and idempotent producers as of `version`
    (the face writes one every so many versions, so that it reads them back from here and
    the events after it, not from the whole history). `producers`: (hash of the id,
    epoch, seq, whether that append closed the stream), the most recent last; a list, so
    that a merge patch replaces it whole."""

    version: NonNegInt
    last_seq: Annotated[str, msgspec.Meta(max_length=1 << 16)] | None = None
    producers: Annotated[list[tuple[Annotated[str, msgspec.Meta(max_length=64)], Safe, Safe,
                                    bool]], msgspec.Meta(max_length=MAX_PRODUCERS)] = []


class StreamSettings(msgspec.Struct, forbid_unknown_fields=True, omit_defaults=True):
    """Each field optional (a merge patch's null removes one)."""

    content_type: Annotated[str, msgspec.Meta(min_length=1, max_length=255)] | None = None
    ttl_s: Annotated[int, msgspec.Meta(ge=0, le=MAX_TTL_S)] | None = None
    expires_at: Annotated[str, msgspec.Meta(max_length=64)] | None = None
    fork: Fork | None = None
    deleted: bool | None = None
    writers: Writers | None = None

    def __post_init__(self) -> None:
        if self.content_type is not None and not MEDIA_TYPE.match(self.content_type):
            raise ValueError("`content_type` must be a media type, e.g. text/plain")
        if self.expires_at is not None:
            try:
                epoch(self.expires_at)
            except (ValueError, OverflowError) as exc:
                raise ValueError(f"`expires_at` must be an RFC 3339 time: {exc}") from exc


def settings(value: Any) -> StreamSettings:
    """`metadata.stream` as settings (msgspec.ValidationError if it does not fit)."""
    return msgspec.convert(value, StreamSettings)
