"""The export document: one session's events, view and checkpoints, with a checksum."""

from __future__ import annotations

import hashlib
import hmac
from typing import Any, Final

import msgspec

from .bounds import NonNegInt
from .events import Event, canonical_data, moved
from .state import SessionState

FORMAT: Final = "sessiond.export"
FORMAT_VERSION: Final = 1
_canonical = msgspec.json.Encoder(order="sorted")


def canonical(value: Any) -> bytes:
    """The canonical JSON of `value`: sorted keys, no spaces, UTF-8 (what hashes cover)."""
    return _canonical.encode(value)


def chain_hash(prev_hash: str, event: Event, data_json: bytes | msgspec.Raw | None = None) -> str:
    """Hash an event onto its session's chain (position excluded: it changes on import).

    The hash covers the canonical JSON of {session_id, version, event_id, type,
    schema_version, recorded_at, data, meta}. `data` sorts first, so the body is built as
    `{"data":` + the data's canonical JSON + the rest: pass `data_json` (the data's
    canonical JSON) when it is at hand; without it the stored JSON is made canonical."""
    if data_json is None:
        data_json = canonical_data(event)
    rest = _canonical.encode({
        "session_id": event.session_id, "version": event.version, "event_id": event.event_id,
        "type": event.type, "schema_version": event.schema_version,
        "recorded_at": event.recorded_at, "meta": event.meta,
    })
    digest = hashlib.sha256(prev_hash.encode())
    for part in (b'{"data":', data_json, b",", memoryview(rest)[1:]):
        digest.update(part)
    return digest.hexdigest()


# Hash versions (docs/protocol.md, "Hash versions"). Version 1, a bare sha256 hex digest
# (`chain_hash`), covers the data itself and no key: events of earlier releases, and the
# importers' documents, keep it. Version 2, "2:<data digest>:<link>:<seal>", covers a
# digest of the data (so that the data can be erased while the chain still holds), and a
# keyed seal: `link` is the public chain (sha256 over the previous event's whole hash and
# the envelope with the data digest in the data's place), `seal` a MAC of the link with
# the host (or fleet) key (keyed BLAKE2b): only the key's holder makes a seal that checks.
V2: Final = "2:"


def data_digest(data_json: bytes | msgspec.Raw) -> str:
    """sha256 hex of an event's canonical data JSON (what a version-2 hash commits to)."""
    return hashlib.sha256(data_json).hexdigest()


def _link(prev_hash: str, event: Event, digest: str) -> str:
    body = _canonical.encode({
        "data_digest": digest, "session_id": event.session_id, "version": event.version,
        "event_id": event.event_id, "type": event.type,
        "schema_version": event.schema_version, "recorded_at": event.recorded_at,
        "meta": event.meta,
    })
    return hashlib.sha256(prev_hash.encode() + body).hexdigest()


def seal(key: bytes, link: str) -> str:
    """The seal of a chain link: BLAKE2b-256 in its keyed (MAC) mode, RFC 7693 (half the
    cost of an HMAC-SHA256 here)."""
    return hashlib.blake2b(link.encode(), key=key, digest_size=32).hexdigest()


def chain_link(prev_hash: str, event: Event, key: bytes | None,
               data_json: bytes | msgspec.Raw | None = None) -> str:
    """The hash of a new event: version 2 sealed with `key`, or version 1 without one.
    `data_json` is the data's canonical JSON when at hand."""
    if key is None:
        return chain_hash(prev_hash, event, data_json)
    digest = data_digest(canonical_data(event) if data_json is None else data_json)
    link = _link(prev_hash, event, digest)
    return f"{V2}{digest}:{link}:{seal(key, link)}"


def split_v2(value: str) -> tuple[str, str, str] | None:
    """A version-2 hash's data digest, link and seal; None for another version."""
    if not value.startswith(V2):
        return None
    parts = value[len(V2):].split(":")
    return (parts[0], parts[1], parts[2]) if len(parts) == 3 else None


def link_ok(prev_hash: str, event: Event) -> bool:
    """Whether the event's hash follows from the previous one and its content, by the
    public algorithm of its version (no key: integrity alone). A version-2 link covers the
    data's digest, not the data: an erasure (not built yet) can check an erased event's
    link on the digest alone."""
    parts = split_v2(event.hash)
    if parts is None:
        return chain_hash(prev_hash, event) == event.hash
    digest, link, _ = parts
    if data_digest(canonical_data(event)) != digest:
        return False
    return _link(prev_hash, event, digest) == link


def sealed_by(event: Event, key: bytes) -> bool:
    """Whether the event's hash is version 2 with a seal made with `key`."""
    parts = split_v2(event.hash)
    return parts is not None and hmac.compare_digest(parts[2], seal(key, parts[1]))


def canonical_event(event: Event) -> bytes:
    """The canonical JSON of a whole event, its data made canonical (rows an older daemon
    stored kept their keys' order): what a document's checksum covers of it."""
    return _canonical.encode(moved(event, data_json=msgspec.Raw(canonical_data(event))))


class CheckpointPayload(msgspec.Struct, kw_only=True):
    checkpoint_id: str
    payload: Any


class ExportDocument(msgspec.Struct, kw_only=True):
    format: str
    format_version: NonNegInt
    exported_at: str
    session: SessionState | None  # None: built by an importer; the daemon folds the view
    events: list[Event]
    checkpoints: list[CheckpointPayload]
    checksum: str


def checksum(document: dict[str, Any]) -> str:
    """sha256 over the canonical JSON (sorted keys, no spaces, UTF-8) without `checksum`."""
    body = {k: v for k, v in document.items() if k != "checksum"}
    return "sha256:" + hashlib.sha256(_canonical.encode(body)).hexdigest()
