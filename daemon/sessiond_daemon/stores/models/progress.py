"""The progress rule: progress_steps, one row per graph step (progress.recorded) of a
session, keyed by (session_id, version); progress.list pages through it. A fork gets its
source's rows up to the fork point (rows pointing at the source's events), as it gets its
messages: its versions up to there are its source's."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessiond_daemon.stores.models.ops import CopyRows, Insert, Op
from sessiond_schemas.events import Event, ProgressRecorded, SessionForked


def progress(events: Sequence[Event], payloads: Mapping[str, bytes]) -> list[Op]:
    ops: list[Op] = []
    rows: list[tuple[Any, ...]] = []
    for e in events:
        if isinstance(e.data, ProgressRecorded):
            rows.append((e.session_id, e.version, e.position))
        elif isinstance(e.data, SessionForked):
            if rows:
                ops.append(Insert("progress_steps", rows))
                rows = []
            source = e.data.from_
            ops.append(CopyRows("progress_steps", source.session_id, e.session_id,
                                source.version, "first"))
    if rows:
        ops.append(Insert("progress_steps", rows))
    return ops
