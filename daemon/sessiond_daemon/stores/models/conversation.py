"""The conversation's rules: the message index (message.list; a truncation removes what
came before it), the fork links and a fork's shares of its source's conversation, and the
checkpoints (checkpoint.get/list, session.resume; a save again of a checkpoint_id hands
the payload a fork shares on before the row is replaced)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from sessiond_daemon.stores.models.ops import DeleteWhere, ForkShares, HandOnPayloads, Insert, Op
from sessiond_schemas.events import Event


def conversation(events: Sequence[Event], payloads: Mapping[str, bytes]) -> list[Op]:
    """Messages, truncations and forks in event order, then the batch's checkpoints."""
    ops: list[Op] = []
    messages: list[tuple[Any, ...]] = []
    checkpoints: list[tuple[Any, ...]] = []
    for e in events:
        t = e.type
        if t == "message.appended":
            messages.append((e.session_id, e.data["sequence"], e.position))
        elif t == "checkpoint.saved":
            d = e.data
            checkpoints.append((e.session_id, d["checkpoint_id"], e.position, e.version,
                                d.get("node_id"), d.get("resume_from"), e.recorded_at,
                                d["size"], payloads[e.event_id]))
        elif t == "messages.truncated":
            if messages:
                ops.append(Insert("messages", messages))
                messages = []
            ops.append(DeleteWhere("messages", (("session_id", e.session_id),),
                                   ("sequence", e.data["from_sequence"])))
        elif t == "session.forked":
            if messages:
                ops.append(Insert("messages", messages))
                messages = []
            source = e.data["from"]
            ops += fork_links([e])
            ops.append(ForkShares(e.session_id, source["session_id"], source["version"],
                                  int(e.data["state"].get("message_count", 0))))
    if messages:
        ops.append(Insert("messages", messages))
    if checkpoints:
        ops.append(HandOnPayloads([(c[0], c[1]) for c in checkpoints]))
        ops.append(Insert("checkpoints", checkpoints, "latest"))
    return ops


def fork_links(forked: Sequence[Event]) -> list[Op]:
    """The forks index's rows of session.forked events: the link to the source."""
    rows = [(e.session_id, e.data["from"]["session_id"], e.data["from"]["version"],
             e.recorded_at, e.position) for e in forked]
    return [Insert("forks", rows, "latest")] if rows else []


def relink(forked: Sequence[Event], *, first: bool) -> list[Op]:
    """daemon.reindex's rebuild of the forks index from every session.forked event, a
    chunk at a time (`first`: the chunk that empties the index before it)."""
    return [*([DeleteWhere("forks", ())] if first else []), *fork_links(forked)]
