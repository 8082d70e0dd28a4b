"""The HTTP face put together: its listeners, tokens, streams and app, run in the
daemon's task group (lifecycle.py starts it when http_listen or metrics_listen is set)."""

from __future__ import annotations

import json
import os
import socket
import stat
from collections.abc import Awaitable, Callable
from functools import partial

import structlog
from anyio.abc import SocketAttribute, SocketListener, TaskGroup

from sessiond_daemon.core.writer import Writer
from sessiond_daemon.serve.config import Config, ConfigError
from sessiond_daemon.serve.methods import MethodTable
from sessiond_daemon.serve.server import Server
from sessiond_daemon.serve.web import listen
from sessiond_daemon.serve.web.app import App, Metrics, Settings
from sessiond_daemon.serve.web.auth import Tokens
from sessiond_daemon.serve.web.calls import Calls
from sessiond_daemon.serve.web.streams import Streams
from sessiond_daemon.serve.web.view import WebView
from sessiond_schemas.paths import http_listen_path, write_private

log = structlog.get_logger("sessiond.http")

MAX_SCRAPES = 32  # connections metrics_listen keeps open at once (it has no peer check)
BindUnix = Callable[[str], Awaitable[SocketListener]]


def check_config(config: Config) -> None:
    """Refuse (ConfigError) an http_listen or metrics_listen address that cannot be served."""
    for address in [*config.http_listen, *filter(None, [config.metrics_listen])]:
        try:
            listen.parse(address, allow_remote=config.http_allow_remote)
        except listen.ListenError as exc:
            raise ConfigError(str(exc)) from exc


def settings_of(config: Config) -> Settings:
    return Settings(max_body_bytes=config.max_request_bytes,
                    send_timeout_s=config.http_send_timeout_s,
                    cors_origins=frozenset(config.http_cors_origins),
                    allowed_hosts=frozenset(h.lower() for h in config.http_allowed_hosts),
                    allowed_uids=frozenset(config.allowed_uids),
                    allowed_gids=frozenset(config.allowed_gids))


class Face:
    """The HTTP listeners of one daemon."""

    def __init__(self, config: Config, table: MethodTable, server: Server, writer: Writer,
                 metrics: Metrics | None) -> None:
        assert config.socket
        self.config = config
        calls = Calls(table, lambda: server.grants, lambda: server.draining,
                      lambda: server.limits.max_page_bytes)
        self.view = WebView(calls)
        self.streams = Streams(calls, writer, long_poll_s=config.http_long_poll_s,
                               sse_close_s=config.http_sse_close_s,
                               on_tail=server.count_subscriptions)
        # A rotated token, or a reload that lets a peer in no more, ends every live tail:
        # the clients reconnect, and who may is decided again (docs/security.md).
        self.tokens = Tokens(config.socket, on_change=self.streams.stop)
        self.streams.on_idle = self.tokens.refresh
        self.metrics = metrics
        self.budget = server.budget  # the daemon's memory budget, shared with the socket
        self._settings = settings_of(config)
        self._bound: list[tuple[str, os.stat_result]] = []

    def reload(self, config: Config) -> None:
        old, self._settings = self._settings, settings_of(config)
        new = self._settings
        if (old.allowed_uids, old.allowed_gids) != (new.allowed_uids, new.allowed_gids):
            self.streams.stop()
        if self.config.http_listen and (old.allowed_uids - new.allowed_uids
                                        or old.allowed_gids - new.allowed_gids):
            # A peer let in no more knew the peer token: it is replaced (the peers still
            # allowed are handed the new one: sessionctl http-token --peer).
            self.tokens.rotate_peer()
            log.info("http.peer_token_rotated", reason="a peer's access was revoked")

    async def start(self, tg: TaskGroup, bind_unix: BindUnix) -> None:
        """Open every listener and serve it in `tg` (the tokens are made first)."""
        config = self.config
        if config.http_listen:
            self.tokens.create()
            app = App(self.streams, self.tokens, self.metrics, lambda: self._settings,
                      view=self.view)
            bound = await self._serve(tg, app, config.http_listen, bind_unix,
                                      config.http_max_connections)
            assert config.socket
            # Where the HTTP face listens, for `sessionctl web`.
            write_private(http_listen_path(config.socket), json.dumps(bound).encode() + b"\n")
        if config.metrics_listen is not None:
            scrape = App(None, None, self.metrics, lambda: self._settings, metrics_only=True)
            await self._serve(tg, scrape, [config.metrics_listen], bind_unix, MAX_SCRAPES)

    async def _serve(self, tg: TaskGroup, app: App, addresses: list[str],
                     bind_unix: BindUnix, max_connections: int) -> list[str]:
        """Serve `app` on each address; return them as bound (a port 0 made real)."""
        sockets: list[socket.socket] = []
        bound: list[str] = []
        for address in addresses:
            where = listen.parse(address, allow_remote=self.config.http_allow_remote)
            if isinstance(where, str):
                listener = await bind_unix(where)
                raw = listener.extra(SocketAttribute.raw_socket)
                sockets.append(socket.socket(fileno=os.dup(raw.fileno())))
                await listener.aclose()
                self._bound.append((where, os.lstat(where)))
            else:
                sockets.append(listen.tcp_socket(*where))
            host, port = sockets[-1].getsockname()[:2] if not isinstance(where, str) else ("", 0)
            bound.append(address if isinstance(where, str)
                         else f"[{host}]:{port}" if ":" in host else f"{host}:{port}")
            log.info("http.listening", listen=bound[-1])
        config = self.config
        guard = listen.guard_of(self.budget, head_timeout_s=config.http_head_timeout_s,
                                body_timeout_s=config.http_body_timeout_s,
                                max_connections=max_connections,
                                per_peer=config.http_max_connections_per_peer)
        await tg.start(partial(listen.serve, app, sockets,
                               idle_timeout_s=config.http_idle_timeout_s,
                               max_connections=max_connections, graceful_s=1.0, guard=guard))
        return bound

    def stop(self) -> None:
        """The daemon is draining: end the live tails (their responses complete)."""
        self.streams.stop()

    def close(self) -> None:
        """Remove our Unix socket files (never one another daemon has put there since)."""
        for path, bound in self._bound:
            try:
                st = os.lstat(path)
            except FileNotFoundError:
                continue
            if stat.S_ISSOCK(st.st_mode) and (st.st_dev, st.st_ino) == (bound.st_dev,
                                                                         bound.st_ino):
                os.unlink(path)
