"""A store that fails on cue: it wraps a real store and implements the same Protocol.

Faults are injected through the store interface, never by patching a store's private
methods, so they work on any store (SQLite, PostgreSQL):
  - `fail_commits(rule)`: before a commit, `rule(batch, n)` (n: 1 for the first commit
    since) returns an exception to raise instead of committing, or None to go on;
  - `break_commits_midway(rule)`: for the batches `rule` picks, the real store gets the
    batch with one event repeated at its end, so it fails inside its own transaction
    after writing the batch's rows, and must roll all of them back (a real driver error);
  - `report_moved(rule)`: for the batches `rule` answers with a `Moved`, the commit writes
    nothing and returns it, as a shared store does when another host wrote first;
  - `after_commits(rule, hook)`: for the batches `rule` picks, the commit lands and then
    awaits `hook()` before it returns: its events are readable while the writer has not
    heard yet (as during a slow checkpoint after COMMIT, or an answer slow to come back);
  - `before_commits(rule, hook)`: for the batches `rule` picks, the commit awaits `hook()`
    before anything is written: the commit is in flight meanwhile, and if the hook raises
    it fails with nothing written;
  - `fail_reads(name, exc, times)`: the read method `name` raises `exc` the next times;
  - `before_reads(name, hook)`: the read method `name` awaits `hook()` first, each time
    (a hook that writes through a client makes a write come between a read and the
    write planned from it);
  - `after_reads(name, hook)`: the read method `name` reads, then awaits `hook()` before
    it returns what it read (a write between a read and its answer: the answer is old).
`heal()` ends every fault. Everything else goes to the real store.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Awaitable, Callable
from typing import Any

from sessiond_daemon.serve import lifecycle
from sessiond_daemon.serve.config import Config
from sessiond_daemon.stores.interface import Batch, Capabilities, Moved, Store

CommitRule = Callable[[Batch, int], BaseException | None]


class FaultyStore:
    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self._commit_rule: CommitRule | None = None
        self._midway: Callable[[Batch], bool] | None = None
        self._moved: Callable[[Batch], Moved | None] | None = None
        self._after: tuple[Callable[[Batch], bool], Callable[[], Awaitable[None]]] | None = None
        self._before_commit: tuple[Callable[[Batch], bool],
                                   Callable[[], Awaitable[None]]] | None = None
        self._reads: dict[str, tuple[BaseException, int]] = {}
        self._before: dict[str, Callable[[], Awaitable[None]]] = {}
        self._after_reads: dict[str, Callable[[], Awaitable[None]]] = {}
        self.commits = 0  # commits asked for since the last rule was set
        self.failed = 0  # commits refused by a rule, or broken midway

    # --- the faults ------------------------------------------------------------------

    def fail_commits(self, rule: CommitRule) -> None:
        self._commit_rule, self.commits = rule, 0

    def break_commits_midway(self, rule: Callable[[Batch], bool]) -> None:
        self._midway, self.commits = rule, 0

    def report_moved(self, rule: Callable[[Batch], Moved | None]) -> None:
        self._moved, self.commits = rule, 0

    def after_commits(self, rule: Callable[[Batch], bool],
                      hook: Callable[[], Awaitable[None]]) -> None:
        self._after, self.commits = (rule, hook), 0

    def before_commits(self, rule: Callable[[Batch], bool],
                       hook: Callable[[], Awaitable[None]]) -> None:
        """Await `hook` before a commit `rule` picks is written: the commit is in flight
        meanwhile; if the hook raises, the commit fails with nothing written."""
        self._before_commit, self.commits = (rule, hook), 0

    def fail_reads(self, name: str, exc: BaseException, times: int = 1) -> None:
        self._reads[name] = (exc, times)

    def before_reads(self, name: str, hook: Callable[[], Awaitable[None]]) -> None:
        self._before[name] = hook

    def after_reads(self, name: str, hook: Callable[[], Awaitable[None]]) -> None:
        self._after_reads[name] = hook

    def heal(self) -> None:
        self._commit_rule = self._midway = self._moved = self._after = None
        self._before_commit = None
        self._reads.clear()
        self._before.clear()
        self._after_reads.clear()

    # --- the Protocol ----------------------------------------------------------------

    @property
    def capabilities(self) -> Capabilities:
        """The inner store's, but its size through this store (so `fail_reads("db_bytes")`
        fails it, as a read of a database server can fail)."""
        caps = self.inner.capabilities
        return dataclasses.replace(caps, size=self) if caps.size is not None else caps

    async def commit(self, batch: Batch) -> Moved | None:
        self.commits += 1
        if self._before_commit is not None and self._before_commit[0](batch):
            await self._before_commit[1]()
        if self._commit_rule is not None:
            exc = self._commit_rule(batch, self.commits)
            if exc is not None:
                self.failed += 1
                raise exc
        if self._moved is not None and (moved := self._moved(batch)) is not None:
            return moved
        if self._midway is not None and batch.events and self._midway(batch):
            self.failed += 1
            broken = dataclasses.replace(batch, events=[*batch.events, batch.events[0]])
            return await self.inner.commit(broken)
        moved = await self.inner.commit(batch)
        if self._after is not None and moved is None and self._after[0](batch):
            await self._after[1]()
        return moved

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self.inner, name)
        if name in self._before:
            hook = self._before[name]

            async def after_hook(*args: Any, **kwargs: Any) -> Any:
                await hook()
                return await attr(*args, **kwargs)
            return after_hook
        if name in self._after_reads:
            later = self._after_reads[name]

            async def read_then_hook(*args: Any, **kwargs: Any) -> Any:
                found = await attr(*args, **kwargs)
                await later()
                return found
            return read_then_hook
        if name not in self._reads:
            return attr

        async def failing(*args: Any, **kwargs: Any) -> Any:
            exc, times = self._reads[name]
            if times <= 1:
                del self._reads[name]
            else:
                self._reads[name] = (exc, times - 1)
            raise exc
        return failing


def for_session(session_id: str, exc: BaseException) -> CommitRule:
    """Fail every commit whose batch writes events of `session_id`."""
    def rule(batch: Batch, n: int) -> BaseException | None:
        return exc if any(e.session_id == session_id for e in batch.events) else None
    return rule


def touches(session_id: str) -> Callable[[Batch], bool]:
    return lambda batch: any(e.session_id == session_id for e in batch.events)


def nth(n: int, exc: BaseException) -> CommitRule:
    """Fail the n-th commit from now (1: the next one), only that one."""
    return lambda batch, count: exc if count == n else None


def faulty(made: list[FaultyStore]) -> Callable[[Config], FaultyStore]:
    """A daemon's store factory (running_daemon's store_factory): its usual store, wrapped;
    each store made is appended to `made`, for the test to set faults on."""
    def factory(config: Config) -> FaultyStore:
        store = FaultyStore(lifecycle.default_store(config))
        made.append(store)
        return store
    return factory
