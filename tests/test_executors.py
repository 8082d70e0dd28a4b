"""The executor runner: fake agent CLIs (tests/executors) through a real daemon."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from conftest import daemon_config, running_daemon, wait_for_daemon, wait_until

from sessiond import AsyncClient
from sessiond_schemas.errors import (
    InvalidParamsError,
    InvalidTransitionError,
    OverloadedError,
)

# Child processes and their pipes, whatever the store: the PostgreSQL variants run in the
# fleet run.
pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]

FAKES = Path(__file__).resolve().parent / "executors"
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "executors"
TOOL = [sys.executable, str(FAKES / "tool.py")]


@pytest.fixture
def daemon_overrides() -> dict[str, Any]:
    return {"kill_grace_s": 0.5, "max_processes": 4, "max_line_bytes": 1000}


async def finished(client: AsyncClient, sid: str, timeout: float = 30) -> Any:
    """Wait until the session's turn has ended: the status leaves active in the same write
    that records the exit. Status changes are followed from the session's first version (a
    version that exists), and only those after the state read count."""
    with anyio.fail_after(timeout):  # a guard against a hang, not a timing assertion
        state = await client.get_session(sid)
        if state.status != "active":
            return state
        async with client.subscribe(sid, from_version=1,
                                    types=["session.status_changed"]) as events:
            async for event in events:
                if event.version > state.version and event.data.to != "active":
                    break
        return await client.get_session(sid)


async def first_output(client: AsyncClient, sid: str) -> str:
    """Wait for the session's first output line, as the daemon stores it."""
    with anyio.fail_after(30):
        async with client.subscribe(sid, from_version=1, types=["process.output"]) as events:
            async for event in events:
                return str(event.data.line)
    raise AssertionError(f"the subscription to {sid} ended")


async def outputs(client: AsyncClient, enough: dict[str, int]) -> None:
    """Wait until each session in `enough` has stored at least that many output lines."""
    counts = dict.fromkeys(enough, 0)
    with anyio.fail_after(30):
        async with client.subscribe(from_position=0, types=["process.output"]) as events:
            async for event in events:
                counts[event.session_id] = counts.get(event.session_id, 0) + 1
                if all(counts[sid] >= n for sid, n in enough.items()):
                    return


async def exited(pidfd: int) -> None:
    """Wait until the process behind `pidfd` has exited (it need not be our child)."""
    try:
        with anyio.fail_after(30):
            await anyio.wait_readable(pidfd)
    finally:
        os.close(pidfd)


async def events_of(client: AsyncClient, sid: str, kind: str) -> list[Any]:
    page = await client.read_events(sid, types=[kind], limit=1000)
    return [e.fields() for e in page.events]  # as stored


def gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


async def returns_once_killed(wait: Callable[[], Awaitable[None]],
                              proc: subprocess.Popen[bytes]) -> None:
    """`wait()` blocks while `proc` runs, and returns once it is killed."""
    done = anyio.Event()

    async def waiter() -> None:
        await wait()
        done.set()

    try:
        async with anyio.create_task_group() as tg:
            tg.start_soon(waiter)
            await anyio.wait_all_tasks_blocked()
            assert not done.is_set()
            proc.kill()
            with anyio.fail_after(30):
                await done.wait()
    finally:
        proc.kill()
        proc.wait()


class TestAdapters:
    async def test_codex_turn_then_resume(self, client: AsyncClient, tmp_path: Path) -> None:
        """codex: messages, tokens, steps and every line in order; inject resumes the thread."""
        state = await client.spawn([str(FAKES / "codex"), "exec", "--json", "fix the bug"],
                                   adapter="codex", task="fix the bug", cwd=str(tmp_path),
                                   model="gpt-5-codex", session_id="codex-1")
        assert (state.status, state.turn, state.adapter) == ("active", 1, "codex")
        assert state.pid and state.working_dir == str(tmp_path)
        state = await finished(client, "codex-1")
        assert state.status == "completed" and state.error is None
        assert state.exit_code == 0
        assert (state.token_usage.input_tokens, state.token_usage.output_tokens) == (24763, 122)
        messages = (await client.list_messages("codex-1")).messages
        assert [(m.role, m.content) for m in messages] == [
            ("user", "fix the bug"), ("assistant", "I updated src/app.py to handle empty input.")]
        recorded = (FIXTURES / "codex_turn1.jsonl").read_text().splitlines()
        assert (await client.output("codex-1")).lines == recorded
        exited = await events_of(client, "codex-1", "process.exited")
        assert exited[0]["lines"] == len(recorded) and exited[0]["truncated_lines"] == 0
        steps = await client.trajectory("codex-1")
        assert [s.type for s in steps] == ["user", "reasoning", "command", "file_change",
                                           "todo_list", "message"]
        assert steps[2].details["output"] == "README.md\nsrc\n"

        state = await client.inject("codex-1", "now add a test")
        assert (state.status, state.turn) == ("active", 2)
        state = await finished(client, "codex-1")
        assert state.status == "completed"
        last = (await client.list_messages("codex-1")).messages[-2:]
        assert [(m.role, m.content) for m in last] == [
            ("user", "now add a test"),
            ("assistant", "resumed 0199a213-81c0-7800-8aa1-bbab2a035a53: now add a test")]
        started = await events_of(client, "codex-1", "process.started")
        assert started[1]["argv"][1:] == ["exec", "--json", "-m", "gpt-5-codex", "resume",
                                          "0199a213-81c0-7800-8aa1-bbab2a035a53", "now add a test"]
        assert (await client.output("codex-1", turn=1)).lines == recorded
        assert state.token_usage.input_tokens == 24763 + 10

    async def test_claude_turn_then_resume(self, client: AsyncClient) -> None:
        """claude: task on stdin, assistant and tool messages, cost; inject uses --resume."""
        await client.spawn([str(FAKES / "claude"), "-p", "--output-format", "stream-json",
                            "--verbose"], adapter="claude", task="what is here?",
                           session_id="claude-1")
        state = await finished(client, "claude-1")
        assert state.status == "completed", state.error
        assert (state.token_usage.input_tokens, state.token_usage.output_tokens) == (12, 95)
        assert state.token_usage.estimated_cost == pytest.approx(0.0123)
        messages = (await client.list_messages("claude-1")).messages
        assert [(m.role, m.content, m.tool_call_id) for m in messages] == [
            ("user", "what is here?", None),
            ("assistant", "Let me look at the files.", None),
            ("tool", "README.md\nsrc", "toolu_01"),
            ("assistant", "The repository has a README and a src folder.", None)]
        recorded = (FIXTURES / "claude_turn1.jsonl").read_text().splitlines()
        assert (await client.output("claude-1", stream="stdout")).lines == recorded
        types = [s.type for s in await client.trajectory("claude-1")]
        assert types == ["user", "message", "tool_call", "tool_result", "message", "result"]

        await client.inject("claude-1", "and the tests?")
        state = await finished(client, "claude-1")
        assert state.status == "completed"
        assert (await client.list_messages("claude-1")).messages[-1].content == (
            "resumed 8f0c6a52-6a7e-4a4f-9d0e-2b0f3f1c9a11: and the tests?")

    async def test_jsonl_events_pass_through_and_bad_lines_stay_output(
            self, client: AsyncClient) -> None:
        """jsonl: valid events are stored as sent; junk and refused events stay raw output."""
        await client.spawn([*TOOL, "jsonl"], task="plan it", session_id="jsonl-1")
        state = await finished(client, "jsonl-1")
        assert state.status == "completed"
        messages = (await client.list_messages("jsonl-1")).messages
        assert [m.content for m in messages] == ["plan it", "got: plan it", "Planning done."]
        assert state.memory == {"plan": ["a", "b"]}
        assert (await client.session_state_dict("jsonl-1"))["progress"]["path"] == ["plan", "act"]
        assert (state.token_usage.input_tokens, state.token_usage.output_tokens) == (100, 20)
        problems = await events_of(client, "jsonl-1", "problem.recorded")
        assert [p["type"] for p in problems] == ["message.appended", "session.created"]
        stdout = (await client.output("jsonl-1", stream="stdout")).lines
        assert stdout[1:] == (FIXTURES / "jsonl_turn.jsonl").read_text().splitlines()
        assert (await client.output("jsonl-1", stream="stderr")).lines == [
            "fake jsonl executor: done"]
        # A follow-up turn reruns the command with the message on stdin.
        await client.inject("jsonl-1", "go on")
        state = await finished(client, "jsonl-1")
        assert (await client.list_messages("jsonl-1")).messages[-1].content == "got: go on"
        assert state.turn == 2


class TestOutcomes:
    @pytest.mark.parametrize(("mode", "status", "error"), [
        ("error_with_reply", "completed",
         "Completed with error: stream disconnected before completion"),
        ("error_only", "failed", "model overloaded"),
    ])
    async def test_seed_rules_for_errors(self, client: AsyncClient, mode: str, status: str,
                                         error: str) -> None:
        """An error with an assistant reply still completes, with the error kept; without, fails."""
        sid = f"codex-{mode}"
        await client.spawn([str(FAKES / "codex"), "exec", "--json", "x"], adapter="codex",
                           env={"FAKE_MODE": mode}, session_id=sid)
        state = await finished(client, sid)
        assert (state.status, state.error, state.exit_code) == (status, error, 1)

    async def test_nonzero_exit_without_reply_fails(self, client: AsyncClient) -> None:
        await client.spawn([*TOOL, "fail"], session_id="fail-1")
        state = await finished(client, "fail-1")
        assert (state.status, state.error, state.exit_code) == ("failed", "exited with code 3", 3)
        assert (await client.output("fail-1")).lines == ["starting", "boom: something went wrong"]
        steps = await client.trajectory("fail-1")
        assert steps[-1].type == "exit" and steps[-1].summary == "exit code 3"

    @pytest.mark.parametrize(("argv", "cwd", "error"), [
        (["no-such-agent-cli-xyz", "run"], None,
         "executable not found on the daemon's PATH: no-such-agent-cli-xyz (searched PATH="
         f"{os.environ.get('PATH')}; the caller's PATH is not used: give an absolute path,"
         " or PATH in env)"),
        (["/nonexistent/bin/agent"], None, "executable not found: /nonexistent/bin/agent"),
        (["true"], "/nonexistent/dir", "working directory does not exist: /nonexistent/dir"),
    ])
    async def test_what_cannot_start_is_a_failed_session(self, client: AsyncClient, argv: list[str],
                                                         cwd: str | None, error: str) -> None:
        """No such program or directory: the session exists, failed, with the reason."""
        state = await client.spawn(argv, cwd=cwd)
        assert (state.status, state.error, state.pid) == ("failed", error, None)
        assert (await client.ping()).pong  # the daemon is fine

    async def test_bad_spawn_params_are_refused(self, client: AsyncClient) -> None:
        with pytest.raises(InvalidParamsError, match="cwd must be an absolute path") as info:
            await client.spawn(["true"], cwd="relative/dir")
        assert info.value.data["path"] == "$.cwd"
        with pytest.raises(InvalidParamsError, match="argv"):
            await client.spawn([])
        with pytest.raises(InvalidParamsError, match="adapter"):
            await client.spawn(["true"], adapter="gemini")

    async def test_inject_while_running_and_too_many(self, client: AsyncClient) -> None:
        """A running turn refuses inject (-32003); past max_processes, spawn gets -32008."""
        for i in range(4):
            await client.spawn([*TOOL, "quiet"], session_id=f"q{i}")
        with pytest.raises(InvalidTransitionError, match="is running turn 1"):
            await client.inject("q0", "hello?")
        with pytest.raises(OverloadedError, match="max_processes"):
            await client.spawn([*TOOL, "quiet"])
        await client.create_session("plain")
        await client.transition("plain", "completed")
        with pytest.raises(InvalidParamsError, match="no executor"):
            await client.inject("plain", "hello")
        for i in range(4):
            assert (await client.kill(f"q{i}")).status == "killed"
        with pytest.raises(InvalidTransitionError):
            await client.kill("q0")  # killed is final


class TestLimits:
    async def test_kill_ends_a_process_that_ignores_sigterm_and_its_children(
            self, client: AsyncClient) -> None:
        """SIGTERM is ignored by both; after the grace period SIGKILL ends the group."""
        state = await client.spawn([*TOOL, "stubborn"], session_id="stub")
        child = json.loads(await first_output(client, "stub"))["child"]
        state = await client.kill("stub")
        assert (state.status, state.error) == ("killed", "Manually killed")
        exited = await events_of(client, "stub", "process.exited")
        assert exited[0]["signal"] == signal.SIGKILL
        assert gone(state.pid) and gone(child)

    @pytest.mark.fleet
    async def test_a_flood_is_throttled_and_every_line_kept_in_order(
            self, client: AsyncClient) -> None:
        """5,000 lines fast, one of 50,000 bytes, one unterminated: all there, the long one cut."""
        await client.spawn([*TOOL, "flood", "5000", "50000"], session_id="flood")
        state = await finished(client, "flood", timeout=120)
        assert state.status == "completed"
        lines = (await client.output("flood")).lines
        assert lines[:5000] == [f"line {i}" for i in range(5000)]
        assert lines[5000] == "x" * 1000 + " …[truncated 49000 bytes]"
        assert lines[5001] == "last line without a newline"
        exited = await events_of(client, "flood", "process.exited")
        assert (exited[0]["lines"], exited[0]["truncated_lines"]) == (5002, 1)

    async def test_children_left_holding_the_pipes_are_ended(self, client: AsyncClient) -> None:
        """The leader exits, a child keeps stdout open: the turn still ends, the child with it."""
        await client.spawn([*TOOL, "leftover"], session_id="left")
        state = await finished(client, "left")
        assert state.status == "completed"
        child = json.loads((await client.output("left")).lines[0])["child"]
        assert gone(child)


class TestShutdownAndRestart:
    async def test_stopping_the_daemon_ends_executors_as_failed(self, short_dir: str) -> None:
        config = daemon_config(short_dir, kill_grace_s=0.5)
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            state = await c.spawn([*TOOL, "stubborn"], session_id="s")
            pid = state.pid
        async with running_daemon(config) as d, AsyncClient(d.socket) as c:
            state = await c.get_session("s")
            assert (state.status, state.error) == ("failed", "daemon stopped; executor terminated")
            assert gone(pid)
            # A failed executor session takes a follow-up turn.
            assert (await c.inject("s", "again")).turn == 2
            await c.kill("s")

    async def test_sigkilled_daemon_recovers_executors(self, short_dir: str) -> None:
        """After SIGKILL: acknowledged lines are all kept; a lost process fails the session,
        a surviving one is reported with its pid and can still be killed."""
        sock, db = os.path.join(short_dir, "k.sock"), os.path.join(short_dir, "k.db")
        argv = [sys.executable, "-m", "sessiond_daemon", "--socket", sock, "--db", db,
                "--log-level", "error", "--kill-grace-s", "0.5"]
        proc = subprocess.Popen(argv)
        try:
            async with await connect(sock, proc) as c:
                await c.spawn([*TOOL, "slow", "10000", "0.01"], session_id="slow")
                quiet = await c.spawn([*TOOL, "quiet"], session_id="quiet")
                alone = await c.spawn([*TOOL, "quiet"], session_id="alone")
                await outputs(c, {"slow": 20, "quiet": 3, "alone": 3})
                acked = (await c.output("slow")).lines
                slow_pid = (await c.get_session("slow")).pid
                slow_exit = os.pidfd_open(slow_pid)  # still the daemon's child: surely it
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            # Its stdout has no reader now: the next write kills the slow executor.
            await exited(slow_exit)
            proc = subprocess.Popen(argv)
            async with await connect(sock, proc) as c:
                slow = await c.get_session("slow")
                assert (slow.status, slow.error) == (
                    "failed", "daemon restarted; executor process lost")
                lines = (await c.output("slow")).lines
                assert lines[:len(acked)] == acked
                assert lines == [f"tick {i}" for i in range(len(lines))]
                q = await c.get_session("quiet")
                assert q.status == "active" and q.pid == quiet.pid
                assert f"still running as pid {quiet.pid}" in (q.error or "")
                assert not gone(quiet.pid)
                state = await c.kill("quiet")
                assert state.status == "killed" and gone(quiet.pid)
                detached = await events_of(c, "quiet", "process.detached")
                assert detached == [{"pid": quiet.pid, "turn": 1, "alive": True,
                                     "reason": q.error}]
                # One that ends by itself: its pidfd tells the daemon, which records it.
                assert (await c.get_session("alone")).status == "active"
                os.kill(alone.pid, signal.SIGKILL)
                state = await finished(c, "alone")
                assert (state.status, state.error) == (
                    "failed", "executor process lost after a daemon restart; its exit status"
                    " is unknown")
                assert await events_of(c, "alone", "process.exited") == [
                    {"pid": alone.pid, "turn": 1}]
        finally:
            proc.terminate()
            proc.wait(timeout=30)


async def connect(sock: str, proc: subprocess.Popen[bytes]) -> AsyncClient:
    """Wait until the daemon (another process) answers; return a client for `async with`."""
    wait_for_daemon(sock, proc)  # blocks this loop, which serves nothing meanwhile
    return AsyncClient(sock)


class TestHandles:
    """The runner's proof before a signal (processes.Handle), and its waits, on real
    processes."""

    def test_a_reused_pid_is_never_signalled(self) -> None:
        """A leader whose pid now names another session leader (a later start time): neither
        the group nor that process is signalled."""
        from sessiond_daemon.features.executors.processes import Handle, start_time

        other = subprocess.Popen(["sleep", "300"], start_new_session=True)
        try:
            ticks = start_time(other.pid)
            assert ticks is not None
            ours = Handle(other.pid, ticks - 1)  # "our" leader started earlier: reaped
            assert not ours.leader_alive() and not ours.group_alive()
            ours.signal(signal.SIGKILL)
            assert not gone(other.pid)
        finally:
            other.kill()
            other.wait()

    def test_a_child_is_signalled_through_its_pidfd_until_reaped(self) -> None:
        """A live child: its group is signalled; once reaped, nothing is."""
        from sessiond_daemon.features.executors.processes import Handle

        child = subprocess.Popen(["sleep", "300"], start_new_session=True)
        handle = Handle.of_child(child.pid)
        try:
            assert handle.pidfd is not None and handle.leader_alive() and handle.running()
            handle.signal(signal.SIGTERM)
            assert child.wait(timeout=30) == -signal.SIGTERM
            assert not handle.leader_alive() and not handle.group_alive()
            handle.signal(signal.SIGKILL)  # nothing to reach, nothing raised
        finally:
            handle.close()
            child.kill()
            child.wait()

    async def test_a_group_is_waited_for_until_its_last_member_exits(self) -> None:
        """The leader's exit comes through its pidfd, a member's through its own: the wait
        ends with the member, not with the leader."""
        from sessiond_daemon.features.executors.processes import Handle

        leader = subprocess.Popen(
            [sys.executable, "-c", "import subprocess, sys;"
             " print(subprocess.Popen(['sleep', '300']).pid, flush=True); sys.stdin.read()"],
            start_new_session=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        assert leader.stdin is not None and leader.stdout is not None
        member = int(leader.stdout.readline())
        handle = Handle.of_child(leader.pid)
        assert handle.pidfd is not None
        gone_now = anyio.Event()

        async def wait() -> None:
            await handle.wait_group_gone()
            gone_now.set()

        try:
            async with anyio.create_task_group() as tg:
                tg.start_soon(wait)
                leader.stdin.close()
                assert leader.wait(timeout=30) == 0
                await exited(os.dup(handle.pidfd))  # the loop has seen the leader's exit
                await anyio.wait_all_tasks_blocked()
                assert not gone_now.is_set() and not gone(member)
                os.kill(member, signal.SIGKILL)
                with anyio.fail_after(30):
                    await gone_now.wait()
        finally:
            handle.close()
            leader.stdout.close()
            if not gone(member):
                os.kill(member, signal.SIGKILL)

    async def test_an_adopted_process_is_proven_then_waited_for(self) -> None:
        """A process a previous daemon recorded (not our child, its SESSIOND_* variables,
        its start time, this boot) is proven, and its exit comes through the pidfd the
        proof opened."""
        from sessiond_daemon.features.executors.processes import Handle, boot_id, start_time, stat

        env = {**os.environ, "SESSIOND_SESSION_ID": "adopted", "SESSIOND_TURN": "2"}
        proc = subprocess.Popen(["sleep", "300"], start_new_session=True, env=env)
        try:
            # Popen returns once exec has begun, a moment before the kernel has set up the
            # new program's environment: wait for it, as any adopted process has long had.
            def environ() -> bytes:
                with open(f"/proc/{proc.pid}/environ", "rb") as f:
                    return f.read()

            wait_until(environ, "the child's environment")
            record = {"pid": proc.pid, "start_time": start_time(proc.pid), "turn": 2,
                      "boot_id": boot_id()}
            assert Handle.of_record({**record, "turn": 1}, "adopted") is None
            assert Handle.of_record(record, "another") is None
            handle = Handle.of_record(record, "adopted")
            ours = [e for e in environ().split(b"\0") if e.startswith(b"SESSIOND_")]
            assert handle is not None, (record, stat(proc.pid), ours)
            assert handle.pidfd is not None and handle.running()
            try:
                await returns_once_killed(handle.wait_exit, proc)
            finally:
                handle.close()
        finally:
            proc.kill()
            proc.wait()

    async def test_without_a_pidfd_the_exit_is_polled(self) -> None:
        """No pidfd (pidfd_open missing): the leader's /proc entry is looked at, slowly, and
        its start time still proves it."""
        from sessiond_daemon.features.executors.processes import Handle, start_time

        proc = subprocess.Popen(["sleep", "300"], start_new_session=True)
        handle = Handle(proc.pid, start_time(proc.pid))
        assert handle.pidfd is None and handle.running()
        await returns_once_killed(handle.wait_group_gone, proc)
