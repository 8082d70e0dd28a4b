"""The last minute of commits, as daemon.stats shows it (commands per batch, commit times)."""

from __future__ import annotations

import time
from collections import deque


class CommitWindow:
    """The last minute of commits (commands per batch, seconds per commit), for daemon.stats."""

    __slots__ = ("_commits",)
    SPAN_S = 60.0

    def __init__(self) -> None:
        self._commits: deque[tuple[float, int, float]] = deque()

    def add(self, commands: int, seconds: float) -> None:
        now_m = time.monotonic()
        self._commits.append((now_m, commands, seconds))
        self._trim(now_m)

    def figures(self) -> dict[str, float]:
        """Mean batch size, mean and max commit milliseconds over the last minute."""
        self._trim(time.monotonic())
        n = len(self._commits)
        if not n:
            return {"commit_batch_size": 0.0, "commit_latency_ms": 0.0,
                    "commit_latency_max_ms": 0.0}
        return {
            "commit_batch_size": round(sum(c for _, c, _ in self._commits) / n, 2),
            "commit_latency_ms": round(1000 * sum(s for _, _, s in self._commits) / n, 3),
            "commit_latency_max_ms": round(1000 * max(s for _, _, s in self._commits), 3),
        }

    def _trim(self, now_m: float) -> None:
        while self._commits and self._commits[0][0] < now_m - self.SPAN_S:
            self._commits.popleft()
