"""The neutral row operations the read-model rules emit and each store's executor runs
inside its commit, in list order (after the batch's events are inserted).

(Plain slotted dataclasses, not frozen: one is built per model per batch, and a frozen
one's __init__ costs twice as much; nothing changes an op once a rule returned it.)

Rows point at events by the position the writer numbered them with
(`batch.events[i].position`): only an `Insert`'s rows carry one, in their table's
`event_column`. A store that takes positions in the commit (`Batch.renumber`) adds the
shift to that column; no other op carries a position. docs/architecture.md ("To add a
read model") says where a new one goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

# What an Insert does with a row whose key is taken:
#   error:  nothing special (plain INSERT: a conflict fails the commit; it is a bug)
#   first:  the stored row stays (the first write wins)
#   latest: the new row replaces it (the last write wins)
#   newer:  the new row replaces it when its position is greater (rows shared by sessions,
#           which several writers may write: never replaced by an older event)
Keep = Literal["error", "first", "latest", "newer"]


@dataclass(slots=True)
class Insert:
    """Rows into a table, in its TABLES columns order, applied in order."""

    table: str
    rows: list[tuple[Any, ...]]
    keep: Keep = "error"


@dataclass(slots=True)
class DeleteWhere:
    """The rows whose columns equal `where`'s values (and, if given, whose `at_least`
    column is at least its value); every row when neither is given (a rebuild)."""

    table: str
    where: tuple[tuple[str, Any], ...]
    at_least: tuple[str, int] | None = None


@dataclass(slots=True)
class CopyRows:
    """A session's rows with version <= upto_version, copied as the target's (columns in
    `blank` as empty bytes)."""

    table: str
    source: str
    target: str
    upto_version: int
    keep: Keep = "error"
    blank: tuple[str, ...] = ()


@dataclass(slots=True)
class ForkShares:
    """A fork's conversation as its source's was at the fork point: the messages (those the
    source re-appended after it found by walking up through sources) and the checkpoint
    rows (their payloads shared, not copied). Nothing when the source's history has no
    such version (the source is gone: verify reports it)."""

    target: str
    source: str
    version: int
    message_count: int  # claimed by the fork's view: filters stored rows, sizes nothing


@dataclass(slots=True)
class HandOnPayloads:
    """Before these (session_id, checkpoint_id) checkpoint rows are replaced by a new save:
    a fork row sharing one's payload gets the bytes, so forks still find them."""

    rows: list[tuple[str, str]]


@dataclass(slots=True)
class ForgetSessions:
    """Before deleted sessions' log rows go: their payloads shared by other sessions' rows
    are handed on, then their rows leave every read-model table keyed by session."""

    session_ids: list[str]


@dataclass(slots=True)
class TrimHistory:
    """Retention (session.trimmed): a session's own events up to `version` leave the log,
    with the read models' rows that point at them (their full-text rows too: each store's
    executor takes those out first) and the snapshots before `version` (the one at it
    stays: the fold goes on from it). Rows a fork shares from its source are not its own
    (their positions are before its first event) and stay."""

    session_id: str
    version: int


Op = (Insert | DeleteWhere | CopyRows | ForkShares | HandOnPayloads | ForgetSessions
      | TrimHistory)
