"""The export document: one session's events, view and checkpoints, with a checksum."""

from __future__ import annotations

import hashlib
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
