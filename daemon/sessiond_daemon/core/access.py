"""Per-method authorization: what an allowed peer of another uid may call (docs/security.md)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any, Literal

from sessiond_schemas import rpc
from sessiond_schemas.errors import PermissionDeniedError

# What another allowed user may call unless the config grants more: session data only.
# Create, append (events that add to a history, never remove from it), read, subscribe.
DEFAULT_PEER_METHODS: frozenset[str] = frozenset({
    "daemon.ping",
    # create and append
    "session.create", "session.transition", "session.resume", "message.append",
    "message.append_many", "tokens.record", "progress.record", "checkpoint.save",
    "memory.update", "events.append", "graph.put", "graph.put_writes", "graph.copy",
    "session.compact",  # a summary added: the history before it stays
    # read
    "session.get", "session.resolve", "session.list", "session.states", "session.export",
    "message.list", "progress.list", "checkpoint.get", "checkpoint.list", "events.read",
    "session.output", "session.trajectory", "graph.get", "graph.list", "state.get",
    "graph.delta_history", "session.context",
    # search and fork (a fork adds a session; daemon.reindex stays the owner's)
    "session.search", "session.forks", "session.fork",
    # subscribe
    "events.subscribe", "events.unsubscribe",
})
# The forms of default methods that take something out of a view: a grant of their own
# each, withheld by default as message.pop and message.clear are. session.import with
# on_conflict=replace deletes a history; memory.update with a null value deletes a memory
# key; graph.put of a checkpoint_id the thread holds replaces what graph.get serves.
PEER_UID = -1  # the uid an HTTP peer token's requests are checked (and recorded) as
IMPORT_REPLACE = "session.import:replace"
MEMORY_DELETE = "memory.update:delete"
GRAPH_REPLACE = "graph.put:replace"
# events.append of a metadata.updated of `stream`: the HTTP face's settings of a stream
# (its content type, TTL, expiry, soft delete), which only the face writes for a peer.
STREAM_SETTINGS = "events.append:stream"
REMOVING_FORMS = {IMPORT_REPLACE: "session.import", MEMORY_DELETE: "memory.update",
                  GRAPH_REPLACE: "graph.put", STREAM_SETTINGS: "events.append"}
ALL = "*"
GRANTABLE: tuple[str, ...] = (*sorted(rpc.METHODS), *sorted(REMOVING_FORMS), ALL)
Grant = Literal[GRANTABLE]  # type: ignore[valid-type]  # config: checked at load


@dataclass(frozen=True, slots=True)
class Grants:
    """The methods other allowed peers may call; the daemon's uid and root call all."""

    methods: frozenset[str] = DEFAULT_PEER_METHODS

    @classmethod
    def of(cls, granted: Iterable[str]) -> Grants:
        """The default set plus what the config's `peer_methods` grants."""
        extra = set(granted)
        if ALL in extra:
            extra |= {*rpc.METHODS, *REMOVING_FORMS}
        extra |= {REMOVING_FORMS[g] for g in extra if g in REMOVING_FORMS}
        return cls(DEFAULT_PEER_METHODS | extra)

    def check(self, method: str, uid: int, grant: str | None = None) -> None:
        """Refuse (-32006, naming the method) a call the peer is not granted. `grant`: what
        the call needs when not its method (the method table's `grant` says)."""
        if uid in (os.getuid(), 0):
            return
        grant = grant or method
        if grant not in self.methods:
            how = _HOW.get(grant, "")
            who = "the HTTP peer token" if uid == PEER_UID else f"uid {uid}"
            raise PermissionDeniedError(
                f"{who} may not call {method}{how}: not granted to other users"
                f" (grant it with peer_methods = [\"{grant}\"])",
                {"uid": uid, "method": method, "grant": grant})


_HOW = {IMPORT_REPLACE: " with on_conflict=replace",
        MEMORY_DELETE: " with a null value (it deletes a memory key)",
        GRAPH_REPLACE: " with a checkpoint_id the thread already holds (it replaces the"
                       " checkpoint graph.get serves)",
        STREAM_SETTINGS: " with a metadata.updated of `stream` (an HTTP stream's settings:"
                         " its TTL and expiry)"}


def import_grant(p: rpc.SessionImportParams) -> str:
    """session.import with on_conflict=replace needs a grant of its own."""
    return IMPORT_REPLACE if p.on_conflict == "replace" else "session.import"


def deletes_keys(patch: Any) -> bool:
    """Whether a JSON merge patch (RFC 7386) deletes a key: a null value at any depth of
    its objects (iterative: as deep as the decoder allows)."""
    stack = [patch]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            for value in item.values():
                if value is None:
                    return True
                stack.append(value)
    return False


def memory_grant(p: rpc.MemoryUpdateParams) -> str:
    """memory.update deleting a key (a null value) needs a grant of its own."""
    return MEMORY_DELETE if deletes_keys(p.patch) else "memory.update"


def append_grant(p: rpc.EventsAppendParams) -> str:
    """events.append of a memory.updated that deletes a key: as memory.update's; of a
    metadata.updated of `stream` (a stream's settings, which decide when it expires): a
    grant of its own."""
    if any(e.type == "metadata.updated" and isinstance(e.data, dict)
           and isinstance(e.data.get("patch"), dict) and "stream" in e.data["patch"]
           for e in p.events):
        return STREAM_SETTINGS
    return MEMORY_DELETE if any(e.type == "memory.updated" and isinstance(e.data, dict)
                                and deletes_keys(e.data.get("patch"))
                                for e in p.events) else "events.append"


# The caller of the request being served, for a grant that depends on what is stored (the
# server sets it before each handler runs).
caller: ContextVar[tuple[Grants, int] | None] = ContextVar("caller", default=None)


def is_peer() -> bool:
    """Whether the request being served is another user's (not the daemon's uid or root)."""
    found = caller.get()
    return found is not None and found[1] not in (os.getuid(), 0)


def require(method: str, grant: str) -> None:
    """Inside a handler: refuse (-32006) the call if its caller is not granted `grant`."""
    found = caller.get()
    if found is not None:
        found[0].check(method, found[1], grant)
