"""Configuration precedence, socket hygiene and a graceful drain."""

from __future__ import annotations

import os
import socket

import anyio
import pytest
from conftest import daemon_config, eventually

from sessiond import AsyncClient, SessiondError
from sessiond_daemon.serve import lifecycle
from sessiond_daemon.serve.config import ConfigError, default_config_file, default_db, load
from sessiond_schemas.paths import default_socket


class TestDefaults:
    def test_socket_precedence(self) -> None:
        """$SESSIOND_SOCKET, then $RUNTIME_DIRECTORY, then $XDG_RUNTIME_DIR, then /tmp."""
        env = {"SESSIOND_SOCKET": "/a.sock", "RUNTIME_DIRECTORY": "/run/sessiond",
               "XDG_RUNTIME_DIR": "/run/user/1"}
        assert default_socket(env) == "/a.sock"
        del env["SESSIOND_SOCKET"]
        assert default_socket(env) == "/run/sessiond/sessiond.sock"
        del env["RUNTIME_DIRECTORY"]
        assert default_socket(env) == "/run/user/1/sessiond/sessiond.sock"
        assert default_socket({}) == f"/tmp/sessiond-{os.getuid()}/sessiond.sock"

    def test_db_precedence(self) -> None:
        """$SESSIOND_DB, then $STATE_DIRECTORY, then $XDG_STATE_HOME, then ~/.local/state."""
        env = {"SESSIOND_DB": "/a.db", "STATE_DIRECTORY": "/var/lib/sessiond",
               "XDG_STATE_HOME": "/h/state"}
        assert default_db(env) == "/a.db"
        del env["SESSIOND_DB"]
        assert default_db(env) == "/var/lib/sessiond/sessiond.db"
        del env["STATE_DIRECTORY"]
        assert default_db(env) == "/h/state/sessiond/sessiond.db"
        assert default_db({}).endswith("/.local/state/sessiond/sessiond.db")

    def test_file_then_flags(self, tmp_path: os.PathLike[str]) -> None:
        """The TOML file sets values, flags override them, unknown keys are refused."""
        path = os.path.join(tmp_path, "sessiond.toml")
        with open(path, "w") as f:
            f.write('durability = "normal"\nmax_inflight = 8\nsocket_mode = "0660"\n')
        config = load(path, {"max_inflight": 16}, env={})
        assert (config.durability, config.max_inflight, config.socket_mode) == ("normal", 16, 0o660)
        assert load(None, {}, env={"SESSIOND_CONFIG": path}).durability == "normal"
        with open(path, "w") as f:
            f.write("colour = 1\n")
        with pytest.raises(ConfigError, match="colour"):
            load(path, {}, env={})
        with pytest.raises(ConfigError, match="cannot read"):
            load(os.path.join(tmp_path, "missing.toml"), {}, env={})

    def test_default_config_file_is_read_when_present(self, tmp_path: os.PathLike[str]) -> None:
        """Unnamed, the file is $CONFIGURATION_DIRECTORY's (systemd), else ~/.config's, if
        it exists."""
        home, etc = os.path.join(tmp_path, "home"), os.path.join(tmp_path, "etc")
        env = {"HOME": home, "CONFIGURATION_DIRECTORY": etc}
        assert default_config_file(env) is None
        assert load(None, {}, env=env).durability == "full"
        os.makedirs(os.path.join(home, ".config", "sessiond"))
        with open(os.path.join(home, ".config", "sessiond", "sessiond.toml"), "w") as f:
            f.write('durability = "normal"\n')
        assert default_config_file(env) is None  # systemd named a directory: only that one
        assert load(None, {}, env={"HOME": home}).durability == "normal"
        os.makedirs(etc)
        with open(os.path.join(etc, "sessiond.toml"), "w") as f:
            f.write("max_inflight = 7\n")
        assert load(None, {}, env=env).max_inflight == 7
        assert default_config_file({}) is None


@pytest.mark.anyio
class TestSocketHygiene:
    async def test_stale_socket_is_replaced(self, short_dir: str) -> None:
        """A socket file nobody answers on is removed and the daemon starts."""
        config = daemon_config(short_dir)
        assert config.socket
        stale = socket.socket(socket.AF_UNIX)
        stale.bind(config.socket)
        stale.close()  # the file stays, nobody listens
        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            await tg.start(lifecycle.run, config, stop)
            async with AsyncClient(config.socket) as c:
                assert (await c.ping()).pong
            stop.set()

    async def test_non_socket_path_is_left_alone(self, short_dir: str) -> None:
        """A regular file at the socket path is an error and is not deleted."""
        config = daemon_config(short_dir)
        assert config.socket
        with open(config.socket, "w") as f:
            f.write("precious")
        with pytest.raises(BaseException) as err:
            await lifecycle.run(config, anyio.Event())
        cause = err.value.exceptions[0] if isinstance(err.value, BaseExceptionGroup) else err.value
        assert "not a socket" in str(cause)
        with open(config.socket) as f:
            assert f.read() == "precious"


@pytest.mark.anyio
async def test_drain_keeps_every_acknowledged_write(short_dir: str) -> None:
    """Shutdown mid-load: every acknowledged append is stored; later calls are refused cleanly."""
    config = daemon_config(short_dir)
    stop = anyio.Event()
    acked: list[int] = []
    async with anyio.create_task_group() as tg:
        await tg.start(lifecycle.run, config, stop)
        async with AsyncClient(config.socket) as c:
            await c.create_session("drain")

            async def writer(n: int) -> None:
                for i in range(1000):
                    try:
                        r = await c.append_message("drain", "user", f"{n}-{i}")
                    except SessiondError:
                        return
                    acked.append(r.sequence)

            async with anyio.create_task_group() as writers:
                for n in range(4):
                    writers.start_soon(writer, n)
                await eventually(lambda: len(acked) >= 50, "50 acknowledged appends")
                stop.set()
    assert acked
    stop2 = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(lifecycle.run, config, stop2)
        async with AsyncClient(config.socket) as c:
            stored = {m.sequence for m in (await c.list_messages("drain", limit=1000)).messages}
            total = (await c.get_session("drain")).message_count
        stop2.set()
    assert set(acked) <= stored and len(stored) == total


@pytest.mark.anyio
async def test_exit_leaves_a_newer_daemons_socket(short_dir: str) -> None:
    """A daemon whose socket file was replaced does not delete the new one on exit."""
    config = daemon_config(short_dir)
    assert config.socket
    stop = anyio.Event()
    async with anyio.create_task_group() as tg:
        await tg.start(lifecycle.run, config, stop)
        os.unlink(config.socket)
        other = socket.socket(socket.AF_UNIX)
        other.bind(config.socket)  # another daemon's socket at the same path
        stop.set()
    try:
        assert os.path.exists(config.socket)
    finally:
        other.close()
