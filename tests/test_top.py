"""`sessionctl top` against a real daemon with a live load: in tmux (send-keys drives it,
capture-pane reads it), and --once / --json --once for scripts."""

from __future__ import annotations

import json
import os
import shlex
import sys
from collections.abc import Callable

import anyio
import pytest
from conftest import Daemon, Tmux

from sessiond import AsyncClient

# A terminal UI over the client: its PostgreSQL variants run in the fleet run.
pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]

CLI = [sys.executable, "-c", "from sessiond.cli import main; main()"]


async def load(c: AsyncClient) -> None:
    """alice: created, 5 messages, tokens (7 events); bob: created, tokens (2 events)."""
    await c.create_session("alice-1", actor_name="team/alice", namespace="prod")
    await c.create_session("bob-1", actor_name="team/bob", namespace="dev")
    for i in range(5):
        await c.append_message("alice-1", "user", f"hello {i}")
    await c.record_tokens("alice-1", input_tokens=100, output_tokens=50, estimated_cost=0.25)
    await c.record_tokens("bob-1", input_tokens=30, output_tokens=20, estimated_cost=0.1)


def row(screen: str, first: str) -> list[str] | None:
    """The words of the first screen line that starts with `first`."""
    for line in screen.splitlines():
        words = line.split()
        if words and words[0] == first:
            return words
    return None


class TestLive:
    @pytest.mark.fleet
    async def test_screen_follows_the_load_and_the_keys_work(
            self, daemon: Daemon, client: AsyncClient, tmux: Tmux) -> None:
        """Numbers on screen match the load, live; s sorts, / filters, Enter opens a
        session's timeline, Esc goes back, q quits."""
        await load(client)
        command = shlex.join([*CLI, "--socket", daemon.socket, "top"])
        await tmux.run("new-session", "-d", "-s", "top", "-x", "80", "-y", "32",
                       "-e", "TERM=xterm-256color", f"{command}; echo TOP-EXITED; sleep 60")

        def spend(actor: str, *figures: str) -> Callable[[str], bool]:
            return lambda s: row(s, actor) == [actor, *figures]

        screen = await tmux.wait("alice's spend", spend("team/alice", "150", "0.2500",
                                                        "150", "0.2500"))
        assert row(screen, "team/bob") == ["team/bob", "50", "0.1000", "50", "0.1000"]
        assert row(screen, "alice-1") == ["alice-1", "team/alice", "prod", "active", "7",
                                          "0.12", "150", "0.2500"]
        assert row(screen, "bob-1") == ["bob-1", "team/bob", "dev", "active", "2", "0.03",
                                        "50", "0.1000"]
        assert "sessions 2: active 2" in screen
        assert all(len(line) <= 80 for line in screen.splitlines())

        # A live load: bob overtakes alice in events (8 to 7) and tokens (550 to 150).
        for i in range(4):
            await client.append_message("bob-1", "assistant", f"live {i}")
        await client.record_tokens("bob-1", input_tokens=500, estimated_cost=0.05)
        await client.transition("bob-1", "completed")
        screen = await tmux.wait("bob's live events", lambda s: (row(s, "bob-1") or [""])[4:5]
                                 == ["8"] and "completed 1" in s)
        assert row(screen, "bob-1") == ["bob-1", "team/bob", "dev", "completed", "8", "0.13",
                                        "550", "0.1500"]
        assert row(screen, "team/bob") == ["team/bob", "550", "0.1500", "550", "0.1500"]
        assert "sessions 2: active 1  completed 1" in screen
        lines = screen.splitlines()
        assert lines.index(next(x for x in lines if x.split()[:1] == ["bob-1"])) < \
            lines.index(next(x for x in lines if x.split()[:1] == ["alice-1"]))

        # s: events/s -> tokens 1h -> cost 1h, where alice (0.25) comes before bob (0.15).
        await tmux.keys("s")
        await tmux.wait("the tokens sort", lambda s: "sort: tokens 1h" in s)
        await tmux.keys("s")
        screen = await tmux.wait("the cost sort", lambda s: "sort: cost 1h" in s)
        busiest = [x.split()[0] for x in screen.splitlines()
                   if x.split()[:1] in (["alice-1"], ["bob-1"])]
        assert busiest == ["alice-1", "bob-1"]

        # /: only what matches the actor or namespace stays.
        await tmux.keys("/", "d", "e", "v")
        await tmux.wait("the filter prompt", lambda s: "filter (actor or namespace): dev" in s)
        await tmux.keys("Enter")
        screen = await tmux.wait("the filtered view", lambda s: "filter: dev" in s
                                 and row(s, "alice-1") is None)
        assert row(screen, "bob-1") is not None and row(screen, "team/alice") is None

        # Enter: the selected (only) session's live timeline; a new event shows up in it.
        await tmux.keys("Enter")
        await tmux.wait("bob's timeline", lambda s: "timeline bob-1" in s)
        await client.transition("bob-1", "active", reason="again")
        screen = await tmux.wait("the live event", lambda s: "completed -> active" in s)
        assert "#3 assistant: live 3" in screen
        assert "+500 in +0 out $0.0500" in screen
        await tmux.keys("Escape")
        await tmux.wait("the overview again", lambda s: "busiest sessions" in s)

        await tmux.keys("q")
        await tmux.wait("top to quit", lambda s: "TOP-EXITED" in s)


class TestOnce:
    async def test_once_prints_a_frame(self, daemon: Daemon, client: AsyncClient) -> None:
        await load(client)
        done = await anyio.run_process([*CLI, "--socket", daemon.socket, "top", "--once"],
                                       env={**os.environ, "COLUMNS": "80"})
        screen = done.stdout.decode()
        assert row(screen, "team/alice") == ["team/alice", "150", "0.2500", "150", "0.2500"]
        assert row(screen, "alice-1")[4] == "7"  # type: ignore[index]
        assert "sessions 2: active 2" in screen
        assert all(len(line) <= 80 for line in screen.splitlines())

    async def test_json_once_has_the_same_figures(self, daemon: Daemon,
                                                  client: AsyncClient) -> None:
        await load(client)
        await client.create_session("carol-1", actor_name="team/carol", namespace="dev")
        await client.transition("carol-1", "paused")
        done = await anyio.run_process([*CLI, "--socket", daemon.socket, "--json", "top",
                                        "--once", "--filter", "team/"])
        f = json.loads(done.stdout)
        assert f["sessions_by_status"] == {"active": 2, "paused": 1}
        assert f["daemon"]["sessions"] == 3 and f["daemon"]["events"] == 11
        assert f["daemon"]["queue"] == 0 and f["daemon"]["queue_capacity"] == 4096
        assert f["daemon"]["batch_size"] >= 1 and f["daemon"]["commit_latency_ms"] > 0
        assert f["executors_running"] == 0
        assert [(r["session_id"], r["events_1m"], r["tokens_1h"]) for r in f["busiest"]] == [
            ("alice-1", 7, 150), ("carol-1", 2, 0), ("bob-1", 2, 50)]  # ties: latest first
        assert f["actors"] == [
            {"actor": "team/alice", "tokens_1m": 150, "cost_1m": 0.25, "tokens_1h": 150,
             "cost_1h": 0.25},
            {"actor": "team/bob", "tokens_1m": 50, "cost_1m": 0.1, "tokens_1h": 50,
             "cost_1h": 0.1}]
        assert f["filter"] == "team/" and f["sort"] == "events"

    async def test_without_a_terminal_it_says_so(self, daemon: Daemon) -> None:
        """No TTY (a pipe, cron, CI): the live view would draw nowhere; it refuses."""
        done = await anyio.run_process([*CLI, "--socket", daemon.socket, "top"], check=False)
        assert done.returncode == 2 and b"--once" in done.stderr

    async def test_json_without_once_is_refused(self, daemon: Daemon) -> None:
        done = await anyio.run_process([*CLI, "--socket", daemon.socket, "--json", "top"],
                                       check=False)
        assert done.returncode == 2 and b"needs --once" in done.stderr


CLAUDE_CODE = os.path.join(os.path.dirname(__file__), "fixtures", "transcripts", "claude-code",
                           "projects", "-home-dev-shop",
                           "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d.jsonl")


class TestWindowsByEventTime:
    async def test_old_usage_imported_after_new_is_in_no_window(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """A Claude Code transcript of 2025 imported after this minute's usage: its tokens
        are not last hour's spend, nor its events last minute's, whatever their order."""
        await load(client)
        imported = await anyio.run_process([*CLI, "--socket", daemon.socket, "import",
                                            "--format", "claude-code", CLAUDE_CODE])
        assert imported.returncode == 0
        done = await anyio.run_process([*CLI, "--socket", daemon.socket, "--json", "top",
                                        "--once"])
        f = json.loads(done.stdout)
        assert sorted((a["actor"], a["tokens_1h"]) for a in f["actors"]) == [
            ("team/alice", 150), ("team/bob", 50)]
        assert {r["session_id"] for r in f["busiest"]} == {"alice-1", "bob-1"}


class TestExecutorsLine:
    def test_another_hosts_executor_is_said_to_be_its(self) -> None:
        """Fleet `top --once` on host B: its own count (0), and a running executor it
        knows of from the events, with the host that runs it, not a bare `(-)`."""
        from sessiond._top_model import Model
        from sessiond.top import executors_line
        from sessiond_schemas.events import event_from_builtins

        model = Model()
        model.add(event_from_builtins({
            "position": 1, "session_id": "01M94QXM6MHN", "version": 2, "event_id": "e",
            "type": "process.started", "schema_version": 1,
            "recorded_at": "2026-01-01T00:00:00Z", "meta": {}, "hash": "",
            "data": {"pid": 4242, "argv": ["codex"], "turn": 1, "host": "alpha"}}))

        class Stats:
            sessions = events = last_position = connections = subscriptions = 0
            uptime_s = appends_per_s = 0.0
            write_queue_depth = db_bytes = 0
            write_queue_capacity = commit_batch_size = commit_latency_ms = None
            commit_latency_max_ms = sessions_by_status = None
            executors_running = 0

        line = executors_line(model.figures(Stats(), 0.0))
        assert line == ("executors running here 0; in the events:"
                        " 01M94QXM6MHN (pid 4242 on alpha)")
