"""The read models, defined once for every store.

Each feature's index rule is a pure function from a batch's events (in order) and its
checkpoint payloads to neutral row operations (ops.py) on the tables of tables.py; each
store runs them inside its commit with its executor (sqlite/executor.py,
postgres/executor.py), whose SQL is written once in sql.py and rendered per driver.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Final

from sessiond_daemon.stores.models.agents import runner, scoped_state
from sessiond_daemon.stores.models.conversation import conversation
from sessiond_daemon.stores.models.graphs import graphs
from sessiond_daemon.stores.models.ops import ForgetSessions, Op
from sessiond_daemon.stores.models.progress import progress
from sessiond_daemon.stores.models.search_text import search_rows
from sessiond_schemas.events import Event

Rule = Callable[[Sequence[Event], Mapping[str, bytes]], list[Op]]

# Every read model's rule, in the order their ops run (their tables are disjoint).
RULES: tuple[Rule, ...] = (search_rows, graphs, scoped_state, conversation, progress, runner)
NO_PAYLOADS: Final[Mapping[str, bytes]] = {}


def ops_of(events: Sequence[Event], payloads: Mapping[str, bytes] = NO_PAYLOADS,
           rules: Sequence[Rule] = RULES) -> list[Op]:
    """The row operations that keep these read models (by default, every one) in step
    with these events."""
    ops: list[Op] = []
    for rule in rules:
        ops += rule(events, payloads)
    return ops


def forget(session_ids: Sequence[str]) -> list[Op]:
    """The row operations of deleting these sessions (before their log rows go)."""
    return [ForgetSessions(list(session_ids))] if session_ids else []
