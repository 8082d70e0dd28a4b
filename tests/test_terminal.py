"""sessionctl on an 80×24 terminal, in tmux: `top` fits the real height (rows are dropped,
never the footer), `list` and `events` fit 80 columns with ids that still resolve, and
`watch` says when its daemon is gone and when it has caught up again; and the errors
people see name the flags they typed."""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys

import anyio
import pytest
from conftest import Daemon, Tmux
from test_top import CLI, row

from sessiond import AsyncClient
from sessiond_schemas.errors import SessiondError

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]

WIDTH, HEIGHT = 80, 24


async def ctl(daemon: Daemon, *args: str, check: bool = True,
              env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """sessionctl on the daemon's socket; COLUMNS in `env` sets the width rich draws to."""
    cmd = [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, *args]
    result = await anyio.run_process(cmd, check=False, env={**os.environ, **(env or {})})
    done = subprocess.CompletedProcess(cmd, result.returncode, result.stdout.decode(),
                                       result.stderr.decode())
    if check and done.returncode != 0:
        raise AssertionError(f"{args} exited {done.returncode}: {done.stderr}")
    return done


async def screen_of(tmux: Tmux, name: str, command: list[str]) -> None:
    """Start `command` in a new 80×24 tmux window named `name`."""
    await tmux.run("new-session", "-d", "-s", name, "-x", str(WIDTH), "-y", str(HEIGHT),
                   "-e", "TERM=xterm-256color", "-e", f"COLUMNS={WIDTH}",
                   f"{shlex.join(command)}; echo EXITED-$?; sleep 60")


class TestTopFitsTheScreen:
    async def test_ten_sessions_and_five_actors_keep_the_footer(
            self, daemon: Daemon, client: AsyncClient, tmux: Tmux) -> None:
        """27 lines of content on a 24-line screen: rows go, the head lines, the key help
        and the filter prompt stay on screen."""
        for i in range(10):
            sid = f"busy-{i}"
            await client.create_session(sid, actor_name=f"team/a{i % 5}", namespace="prod")
            for n in range(i + 1):
                await client.append_message(sid, "user", f"m{n}")
            await client.record_tokens(sid, input_tokens=10 * (i + 1), estimated_cost=0.01)
        await screen_of(tmux, "top", [*CLI, "--socket", daemon.socket, "top"])
        text = await tmux.wait("the frame", lambda s: "q quit" in s
                               and row(s, "busy-9") is not None)
        lines = text.splitlines()
        assert len(lines) <= HEIGHT and all(len(x) <= WIDTH for x in lines)
        assert lines[0].startswith("sessiond top")
        assert "busiest sessions" in text and "spend by actor" in text
        assert row(text, "team/a4") is not None  # the top spender (sessions 4 and 9)
        shown = [w[0] for w in map(str.split, lines) if w and w[0].startswith("busy-")]
        assert shown[0] == "busy-9" and 1 <= len(shown) < 10  # the busiest first; some dropped
        await tmux.keys("/", "a", "3")  # the prompt is typed where it can be seen
        await tmux.wait("the prompt", lambda s: "filter (actor or namespace): a3" in s)
        await tmux.keys("Enter")
        text = await tmux.wait("the filtered view", lambda s: "filter: a3" in s)
        assert {x.split()[0] for x in text.splitlines()
                if x.split()[:1] and x.split()[0].startswith("busy-")} == {"busy-8", "busy-3"}
        assert "q quit" in text
        await tmux.keys("q")
        await tmux.wait("top to quit", lambda s: "EXITED-0" in s)


class TestListAndEventsFit:
    async def test_ids_are_cut_to_prefixes_that_resolve(
            self, daemon: Daemon, client: AsyncClient, tmux: Tmux) -> None:
        """Four ids alike for 16 characters: each is shown by the shortest prefix no other
        starts with, and `show` takes it; created is a short age; --wide keeps them whole."""
        ids = [f"01HZY3K7Q8WABCDE{c}XYZXYZXYZ0" for c in "FGHJ"]
        for sid in ids:
            await client.create_session(sid, task="a task long enough to be cut at eighty"
                                        " columns, since it goes on and on and on",
                                        actor_name="team/someone-with-a-long-name")
        await screen_of(tmux, "list", [*CLI, "--socket", daemon.socket, "list"])
        text = await tmux.wait("the list", lambda s: "EXITED-0" in s, "list")
        lines = [x for x in text.splitlines() if x.strip().startswith("01HZY")]
        assert len(lines) == 4, text
        assert all(len(x) <= WIDTH for x in text.splitlines())
        shown = [x.split()[0] for x in lines]
        assert sorted(shown) == sorted(i[:17] for i in ids)
        assert all(x.split()[-1] == "ago" for x in lines), lines  # "3s ago", not a timestamp
        for prefix, sid in zip(sorted(shown), sorted(ids), strict=True):
            done = await ctl(daemon, "--json", "show", prefix)
            assert f'"session_id":"{sid}"' in done.stdout
        wide = await ctl(daemon, "list", "--wide", env={"COLUMNS": "200"})
        assert all(sid in wide.stdout for sid in ids)

    async def test_events_and_tokens_fit_80_columns(self, daemon: Daemon,
                                                    client: AsyncClient) -> None:
        await client.create_session("ev-80", task="t")
        await client.append_message("ev-80", "user", "x" * 300)
        await client.record_tokens("ev-80", input_tokens=1200, output_tokens=310,
                                   estimated_cost=0.004)
        env = {"COLUMNS": "80"}
        events = await ctl(daemon, "events", "ev-80", env=env)
        lines = events.stdout.splitlines()
        assert len(lines) == 3 and all(len(x) <= WIDTH for x in lines), lines
        assert "message.appended" in lines[1] and "#0 user: xxx" in lines[1]
        tokens = await ctl(daemon, "tokens", "ev-80", "--input", "5", env=env)
        lines = tokens.stdout.splitlines()
        assert all(len(x) <= WIDTH for x in lines), lines
        assert "token_usage.input_tokens: 1205" in lines  # a value per line, never wrapped


class TestWatchSaysWhatHappens:
    async def test_reconnecting_and_caught_up(self, short_dir: str, tmux: Tmux) -> None:
        """The daemon goes: watch says it is reconnecting; it comes back: watch says it
        caught up, and shows what was written while it was away, then what is new."""
        sock, db = os.path.join(short_dir, "s"), os.path.join(short_dir, "w.db")

        async def start() -> subprocess.Popen[bytes]:
            proc = subprocess.Popen([sys.executable, "-m", "sessiond_daemon", "--socket", sock,
                                     "--db", db, "--log-level", "error"])
            with anyio.fail_after(60):
                while True:
                    try:
                        async with AsyncClient(sock) as c:
                            await c.ping()
                        return proc
                    except (OSError, SessiondError):
                        assert proc.poll() is None, "the daemon exited"
                        await anyio.sleep(0.02)

        proc = await start()
        try:
            async with AsyncClient(sock) as c:
                await c.create_session("w1")
            await screen_of(tmux, "watch", [*CLI, "--socket", sock, "watch", "--from-start"])
            await tmux.wait("the first event", lambda s: "session.created" in s, "watch")
            proc.send_signal(signal.SIGTERM)
            proc.wait()
            text = await tmux.wait("reconnecting", lambda s: "reconnecting" in s, "watch")
            assert "lost the daemon at" in text
            proc = await start()
            async with AsyncClient(sock) as c:
                await c.append_message("w1", "user", "after the restart")
            text = await tmux.wait("caught up", lambda s: "caught up at" in s
                                   and "#0 user: after the" in s, "watch")
            assert text.count("session.created") == 1  # nothing handed out twice
            assert all(len(x) <= WIDTH for x in text.splitlines())
            async with AsyncClient(sock) as c:  # and it follows live after catching up
                await c.append_message("w1", "user", "live again")
            await tmux.wait("the live event", lambda s: "live again" in s, "watch")
        finally:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
                proc.wait()


class TestErrorsInTheFlagsTyped:
    async def test_list_since_takes_durations(self, daemon: Daemon,
                                              client: AsyncClient) -> None:
        await client.create_session("since-1")
        done = await ctl(daemon, "--json", "list", "--since", "7d")
        assert '"since-1"' in done.stdout
        bad = await ctl(daemon, "list", "--since", "last tuesday", check=False)
        assert bad.returncode == 2 and "--since" in bad.stderr and "7d" in bad.stderr

    async def test_a_refused_field_is_named_by_its_flag(self, daemon: Daemon,
                                                        client: AsyncClient) -> None:
        await client.create_session("flags-1")
        bad = await ctl(daemon, "tokens", "flags-1", "--input", "-5", check=False)
        assert bad.returncode == 1 and "--input" in bad.stderr, bad.stderr
        assert "input_tokens" not in bad.stderr
        bad = await ctl(daemon, "list", "--limit", "0", check=False)
        assert bad.returncode == 1 and "--limit" in bad.stderr, bad.stderr

    async def test_a_refused_transition_lists_the_allowed_ones(
            self, daemon: Daemon, client: AsyncClient) -> None:
        await client.create_session("tr-1")
        bad = await ctl(daemon, "transition", "tr-1", "pending", check=False)
        assert bad.returncode == 1
        assert "cannot move from active to pending" in bad.stderr
        assert "paused, completed, failed, cancelled, killed" in bad.stderr


class TestLogLinesOnATerminal:
    async def test_they_wrap_between_fields_never_inside_a_word(self, short_dir: str,
                                                                 tmux: Tmux) -> None:
        """The daemon on an 80-column terminal (console logs): a record's line breaks only
        between its key=value fields, each continuation line indented; never mid-word."""
        sock = os.path.join(short_dir, "a-socket-with-a-rather-long-name.sock")
        db = os.path.join(short_dir, "a-database-with-a-long-name-too.db")
        await screen_of(tmux, "daemon", [sys.executable, "-m", "sessiond_daemon", "--socket",
                                         sock, "--db", db, "--log-level", "info"])
        text = await tmux.wait("the start's log lines", lambda s: sock in s.replace("\n", "")
                               or "listening" in s, window="daemon")
        await anyio.sleep(1)  # the rest of the start's lines
        text = await tmux.screen("daemon")
        await tmux.keys("C-c", window="daemon")
        lines = [x for x in text.splitlines() if x.strip()]
        assert any(x.startswith("    ") for x in lines), text  # something did wrap
        for line in lines:
            assert len(line) <= WIDTH, line
            assert line[:2] == "20" or line.startswith("    "), text  # a record, or its rest
