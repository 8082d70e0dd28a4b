"""The conversation's rules: the message index (message.list; a truncation removes what
came before it), the fork links and a fork's shares of its source's conversation, and the
checkpoints (checkpoint.get/list, session.resume; a save again of a checkpoint_id hands
the payload a fork shares on before the row is replaced)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessiond_daemon.stores.models.ops import (
    DeleteWhere,
    ForkShares,
    HandOnPayloads,
    Insert,
    Op,
    TrimHistory,
)
from sessiond_schemas.events import (
    CheckpointSaved,
    Data,
    Event,
    HistoryTrimmed,
    MessageAppended,
    MessagesTruncated,
    SessionForked,
    Unread,
)


def checkpoint_id(data: Data) -> Any:
    """The checkpoint_id of a checkpoint.saved event's data, an Unread one's too (what its
    stored body names, if anything: an import or a migration looks its payload up by it,
    and the fold then says what is wrong with it)."""
    if isinstance(data, CheckpointSaved):
        return data.checkpoint_id
    return data.body.get("checkpoint_id") if isinstance(data, Unread) \
        and isinstance(data.body, dict) else None


def conversation(events: Sequence[Event], payloads: Mapping[str, bytes]) -> list[Op]:
    """Messages, truncations and forks in event order, then the batch's checkpoints."""
    ops: list[Op] = []
    messages: list[tuple[Any, ...]] = []
    checkpoints: list[tuple[Any, ...]] = []
    for e in events:
        d = e.data
        if isinstance(d, MessageAppended):
            messages.append((e.session_id, d.sequence, e.position))
        elif isinstance(d, CheckpointSaved):
            checkpoints.append((e.session_id, d.checkpoint_id, e.position, e.version,
                                d.node_id, d.resume_from, e.recorded_at,
                                d.size, payloads[e.event_id]))
        elif isinstance(d, MessagesTruncated):
            if messages:
                ops.append(Insert("messages", messages))
                messages = []
            ops.append(DeleteWhere("messages", (("session_id", e.session_id),),
                                   ("sequence", d.from_sequence)))
        elif isinstance(d, HistoryTrimmed):
            if messages:
                ops.append(Insert("messages", messages))
                messages = []
            ops.append(TrimHistory(e.session_id, d.through_version))
        elif isinstance(d, SessionForked):
            if messages:
                ops.append(Insert("messages", messages))
                messages = []
            ops += fork_links([e])
            ops.append(ForkShares(e.session_id, d.from_.session_id, d.from_.version,
                                  int(d.state.get("message_count", 0))))
    if messages:
        ops.append(Insert("messages", messages))
    if checkpoints:
        ops.append(HandOnPayloads([(c[0], c[1]) for c in checkpoints]))
        ops.append(Insert("checkpoints", checkpoints, "latest"))
    return ops


def fork_links(forked: Sequence[Event]) -> list[Op]:
    """The forks index's rows of session.forked events: the link to the source."""
    rows = [(e.session_id, e.data.from_.session_id, e.data.from_.version,
             e.recorded_at, e.position) for e in forked if isinstance(e.data, SessionForked)]
    return [Insert("forks", rows, "latest")] if rows else []


def relink(forked: Sequence[Event], *, first: bool) -> list[Op]:
    """daemon.reindex's rebuild of the forks index from every session.forked event, a
    chunk at a time (`first`: the chunk that empties the index before it)."""
    return [*([DeleteWhere("forks", ())] if first else []), *fork_links(forked)]
