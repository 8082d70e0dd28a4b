"""The blocking client: the async client run on a private event loop thread."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any

from anyio.from_thread import BlockingPortal, start_blocking_portal

from ._async import AsyncClient


class Client:
    """Blocking twin of AsyncClient: the same methods, called without await.

    `with Client() as c: c.ping()`.
    """

    def __init__(self, socket_path: str | None = None) -> None:
        self._async = AsyncClient(socket_path)
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._session_cm: AbstractContextManager[AsyncClient] | None = None

    @property
    def socket_path(self) -> str:
        return self._async.socket_path

    def connect(self) -> None:
        """Start the private event loop and connect to the daemon."""
        self._portal_cm = start_blocking_portal(backend="asyncio")
        self._portal = self._portal_cm.__enter__()
        # The async client's task group must be entered and left by one task.
        self._session_cm = self._portal.wrap_async_context_manager(self._async)
        try:
            self._session_cm.__enter__()
        except BaseException:
            self._session_cm = None
            self.close()
            raise

    def close(self) -> None:
        """Disconnect and stop the private event loop."""
        if self._session_cm is not None:
            self._session_cm.__exit__(None, None, None)
        if self._portal_cm is not None:
            self._portal_cm.__exit__(None, None, None)
        self._portal = self._portal_cm = self._session_cm = None

    def __enter__(self) -> Client:
        self.connect()
        return self

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None,
                 tb: TracebackType | None) -> None:
        self.close()

    def _run(self, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        if self._portal is None:
            self.connect()
        assert self._portal is not None
        return self._portal.call(functools.partial(fn, *args, **kwargs))


def _blocking(name: str) -> Callable[..., Any]:
    target = getattr(AsyncClient, name)

    @functools.wraps(target)
    def method(self: Client, *args: Any, **kwargs: Any) -> Any:
        return self._run(getattr(self._async, name), *args, **kwargs)

    return method


for _name, _fn in inspect.getmembers(AsyncClient, inspect.iscoroutinefunction):
    if not _name.startswith("_") and _name not in ("connect", "aclose", "__aenter__", "__aexit__"):
        setattr(Client, _name, _blocking(_name))
