"""Per-method authorization: what an allowed peer of another uid may call (docs/security.md)."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

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
    # read
    "session.get", "session.resolve", "session.list", "session.states", "session.export",
    "message.list", "progress.list", "checkpoint.get", "checkpoint.list", "events.read",
    "session.output", "session.trajectory", "graph.get", "graph.list", "state.get",
    "graph.delta_history",
    # search and fork (a fork adds a session; daemon.reindex stays the owner's)
    "session.search", "session.forks", "session.fork",
    # subscribe
    "events.subscribe", "events.unsubscribe",
})
# session.import with on_conflict=replace deletes a history: a grant of its own.
IMPORT_REPLACE = "session.import:replace"
ALL = "*"
GRANTABLE: tuple[str, ...] = (*sorted(rpc.METHODS), IMPORT_REPLACE, ALL)
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
            extra |= {*rpc.METHODS, IMPORT_REPLACE}
        if IMPORT_REPLACE in extra:
            extra.add("session.import")
        return cls(DEFAULT_PEER_METHODS | extra)

    def check(self, method: str, uid: int, grant: str | None = None) -> None:
        """Refuse (-32006, naming the method) a call the peer is not granted. `grant`: what
        the call needs when not its method (the method table's `grant` says)."""
        if uid in (os.getuid(), 0):
            return
        grant = grant or method
        if grant not in self.methods:
            how = " with on_conflict=replace" if grant == IMPORT_REPLACE else ""
            raise PermissionDeniedError(
                f"uid {uid} may not call {method}{how}: not granted to other users"
                f" (grant it with peer_methods = [\"{grant}\"])",
                {"uid": uid, "method": method, "grant": grant})


def import_grant(p: rpc.SessionImportParams) -> str:
    """session.import with on_conflict=replace needs a grant of its own."""
    return IMPORT_REPLACE if p.on_conflict == "replace" else "session.import"
