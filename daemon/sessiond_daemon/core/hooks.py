"""What the writer and the server tell an observer (Prometheus, serve/metrics.py): a commit,
a request answered, a connection opened. The default observer does nothing, so the hot path
pays one method call when metrics are off."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from sessiond_schemas.events import Event


class Subscribed(Protocol):
    """A connection's subscriptions, as an observer sees them: their cursors."""

    def cursors(self) -> Iterable[int]: ...


class Hooks:
    """What the daemon tells its metrics. These do nothing: metrics are off."""

    __slots__ = ()

    def clock(self) -> float:
        return 0.0

    def committed(self, commands: int, events: list[Event], seconds: float) -> None:
        pass

    def request(self, method: str, code: int, started: float) -> None:
        pass

    def connection(self, subscriptions: Subscribed) -> None:
        pass


NO_METRICS = Hooks()
