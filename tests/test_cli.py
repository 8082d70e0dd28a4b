"""`sessionctl` as a user runs it: a separate process against a real daemon."""

from __future__ import annotations

import io
import json
import os
import sqlite3
import subprocess
import sys
import tempfile
from typing import Any

import anyio
import pytest
from conftest import Daemon, as_user

from sessiond import AsyncClient, SessiondError

# Each sessionctl call is a new process: the PostgreSQL variants run in the fleet run.
pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]


async def ctl(daemon: Daemon, *args: str, stdin: str | None = None,
              check: bool = True, columns: int | None = None,
              ) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, *args]
    env = {**os.environ, "COLUMNS": str(columns)} if columns else None
    result = await anyio.run_process(cmd, input=stdin.encode() if stdin is not None else None,
                                     check=False, env=env)
    done = subprocess.CompletedProcess(cmd, result.returncode, result.stdout.decode(),
                                       result.stderr.decode())
    if check and done.returncode != 0:
        raise AssertionError(f"{args} exited {done.returncode}: {done.stderr}")
    return done


async def ctl_json(daemon: Daemon, *args: str, stdin: str | None = None) -> Any:
    return json.loads((await ctl(daemon, *args, "--json", stdin=stdin)).stdout)


class TestSessionctl:
    async def test_ping_human_and_json(self, daemon: Daemon) -> None:
        """ping prints a readable answer, and JSON with --json."""
        assert "pong" in (await ctl(daemon, "ping")).stdout
        assert (await ctl_json(daemon, "ping"))["pong"] is True

    async def test_session_workflow(self, daemon: Daemon, client: AsyncClient) -> None:
        """create, append (argument and stdin), tokens, progress, show, list, messages by prefix."""
        created = await ctl_json(daemon, "create", "--task", "demo", "--actor", "me/bot",
                                 "--metadata", '{"k": 1}')
        sid = created["session_id"]
        prefix = sid[:10]
        await ctl(daemon, "append", prefix, "user", "from an argument")
        await ctl(daemon, "append", prefix, "assistant", stdin="from stdin\nsecond line")
        await ctl(daemon, "append", prefix, "tool", "ok", "--tool-call-id", "c1")
        await ctl(daemon, "tokens", prefix, "--input", "10", "--output", "3", "--cost", "0.2")
        await ctl(daemon, "progress", prefix, "plan", "--retries", "1", "--edge", "a->plan")
        await ctl(daemon, "memory", prefix, '{"x": {"y": 1}}')
        state = await client.get_session(sid)
        assert state.message_count == 3 and state.metadata == {"k": 1}
        assert state.last_message is not None and state.last_message.tool_call_id == "c1"
        assert state.token_usage.input_tokens == 10
        whole = await client.session_state_dict(sid)
        assert whole["progress"]["path"] == ["plan"]
        assert whole["metrics"]["edges_traversed"] == ["a->plan"]
        assert state.memory == {"x": {"y": 1}}
        msgs = await ctl_json(daemon, "messages", prefix)
        assert [m["content"] for m in msgs["messages"]][1] == "from stdin\nsecond line"
        shown = await ctl(daemon, "show", prefix)
        assert sid in shown.stdout and "demo" in shown.stdout and "degraded" in shown.stdout
        listed = await ctl(daemon, "list")
        assert "me/bot" in listed.stdout
        listed_json = await ctl_json(daemon, "list", "--status", "active")
        assert listed_json["sessions"][0]["session_id"] == sid
        assert (await ctl(daemon, "resolve", prefix)).stdout.strip() == sid
        assert "message.appended" in (await ctl(daemon, "events", prefix)).stdout
        past = await ctl_json(daemon, "show", prefix, "--at-version", "2")
        assert past["message_count"] == 1

    async def test_transitions_checkpoints_and_delete(self, daemon: Daemon,
                                                      client: AsyncClient) -> None:
        """transition, checkpoint save/get/list, resume, append-many, events-append and delete."""
        await client.create_session("cli-flow")
        await ctl(daemon, "checkpoint-save", "cli-flow", '{"step": 3}', "--node", "n3",
                  "--checkpoint-id", "cp1")
        assert (await ctl_json(daemon, "checkpoint-get", "cli-flow"))["payload"] == {"step": 3}
        assert "cp1" in (await ctl(daemon, "checkpoints", "cli-flow")).stdout
        await ctl(daemon, "transition", "cli-flow", "failed", "--error", "boom")
        resumed = await ctl_json(daemon, "resume", "cli-flow", "--checkpoint", "cp1")
        assert resumed["resume"]["resume_from"] == "n3" and resumed["state"]["status"] == "active"
        lines = "\n".join(json.dumps({"role": "user", "content": f"m{i}"}) for i in range(3))
        appended = await ctl_json(daemon, "append-many", "cli-flow", stdin=lines)
        assert appended["first_sequence"] == 0
        events = json.dumps([{"type": "plan.linked", "data": {"plan_id": "p9"}}])
        await ctl(daemon, "events-append", "cli-flow", stdin=events)
        state = await client.get_session("cli-flow")
        assert state.message_count == 3 and state.linked_plan_ids == ["p9"]
        shown = await ctl(daemon, "ttl", "cli-flow", "3600")
        assert "3600 s idle" in shown.stdout
        assert (await client.get_session("cli-flow")).ttl_s == 3600
        assert (await ctl_json(daemon, "ttl", "cli-flow", "none"))["ttl_s"] is None
        await ctl(daemon, "delete", "cli-flow")
        assert (await client.list_sessions()).sessions == []

    async def test_errors_exit_non_zero(self, daemon: Daemon, client: AsyncClient) -> None:
        """Contract errors exit 1 with the daemon's message; no daemon exits 2."""
        await client.create_session("cli-err")
        bad = await ctl(daemon, "transition", "cli-err", "pending", check=False)
        assert bad.returncode == 1 and "cannot move from active to pending" in bad.stderr
        blank = await ctl(daemon, "append", "cli-err", "user", "   ", check=False)
        assert blank.returncode == 1 and "content" in blank.stderr
        js = await ctl(daemon, "show", "nope-nope", "--json", check=False)
        assert js.returncode == 1 and json.loads(js.stderr)["error"]["code"] == -32001
        stale = await ctl(daemon, "append", "cli-err", "user", "x", "--expected-version", "9",
                          check=False)
        assert stale.returncode == 1 and "wrong expected version" in stale.stderr
        gone = await anyio.run_process(
            [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket + ".x", "ping"],
            check=False)
        assert gone.returncode == 2 and b"no sessiond at" in gone.stderr
        assert gone.stderr.count(b"is it running") == 1  # said once


class TestZeroConfig:
    async def test_sessiond_starts_with_no_flags(self, short_dir: str) -> None:
        """`sessiond` with no flags puts socket and db in the user's dirs; `sessionctl ping`
        answers."""
        env = {k: v for k, v in os.environ.items() if not k.startswith("SESSIOND_")}
        env.update(XDG_RUNTIME_DIR=os.path.join(short_dir, "run"),
                   XDG_STATE_HOME=os.path.join(short_dir, "state"))
        env.pop("RUNTIME_DIRECTORY", None)
        env.pop("STATE_DIRECTORY", None)
        sock = os.path.join(short_dir, "run", "sessiond", "sessiond.sock")
        db = os.path.join(short_dir, "state", "sessiond", "sessiond.db")
        proc = await anyio.open_process([sys.executable, "-m", "sessiond_daemon"], env=env)
        try:
            with anyio.fail_after(30):
                while True:
                    ping = await anyio.run_process([sys.executable, "-m", "sessiond.cli", "ping"],
                                                   env=env, check=False)
                    if ping.returncode == 0:
                        break
                    assert proc.returncode is None, "sessiond exited early"
                    await anyio.sleep(0.05)
            assert b"pong" in ping.stdout
            assert os.path.exists(db)
            assert oct(os.stat(os.path.dirname(sock)).st_mode & 0o777) == "0o700"
            assert oct(os.stat(sock).st_mode & 0o777) == "0o600"
            second = await anyio.run_process([sys.executable, "-m", "sessiond_daemon"], env=env,
                                             check=False)
            assert second.returncode == 75  # another daemon answers on the socket
        finally:
            proc.terminate()
            with anyio.fail_after(30):
                assert await proc.wait() == 0
        assert not os.path.exists(sock)  # removed on a clean exit


class TestExecutorCommands:
    async def test_spawn_output_trajectory_inject_kill(self, daemon: Daemon, client: AsyncClient,
                                                       tmp_path: Any) -> None:
        """spawn -- CMD runs in the caller's directory; output, trajectory, inject and kill by
        prefix."""
        fakes = os.path.join(os.path.dirname(__file__), "executors")
        spawned = await ctl(daemon, "--json", "spawn", "--adapter", "codex", "--id", "cli-codex",
                            "--task", "fix it", "--",
                            os.path.join(fakes, "codex"), "exec", "--json", "fix it")
        state = json.loads(spawned.stdout)
        assert state["status"] == "active" and state["adapter"] == "codex"
        assert state["working_dir"] == os.getcwd()
        with anyio.fail_after(30):
            while (await client.get_session("cli-codex")).status == "active":
                await anyio.sleep(0.02)
        out = (await ctl(daemon, "output", "cli-c")).stdout.splitlines()
        assert json.loads(out[0])["type"] == "thread.started" and len(out) == 10
        steps = (await ctl(daemon, "trajectory", "cli-c")).stdout
        assert "reasoning" in steps and "file_change" in steps
        full = await ctl_json(daemon, "trajectory", "cli-c", "--full")
        assert full[0] == {"type": "user", "summary": "fix it", "details": {}, "turn": 1}
        await ctl(daemon, "inject", "cli-c", stdin="and now?")
        with anyio.fail_after(30):
            while (await client.get_session("cli-codex")).status == "active":
                await anyio.sleep(0.02)
        assert (await client.get_session("cli-codex")).turn == 2

        quiet = [sys.executable, os.path.join(fakes, "tool.py"), "quiet"]
        await ctl(daemon, "spawn", "--id", "cli-quiet", "--cwd", str(tmp_path), "--", *quiet)
        killed = await ctl_json(daemon, "kill", "cli-q")
        assert killed["status"] == "killed"
        refused = await ctl(daemon, "spawn", "--adapter", "codex", check=False)
        assert refused.returncode != 0 and "give the command after --" in refused.stderr


def one_line(text: str) -> str:
    """The single line of an error; no traceback."""
    assert "Traceback" not in text, text
    lines = text.strip().splitlines()
    assert len(lines) == 1, text
    return lines[0]


class TestUserErrors:
    async def test_bad_json_is_one_line(self, daemon: Daemon, client: AsyncClient) -> None:
        """Bad JSON in an argument, on stdin or in a file: one line naming it, exit 2."""
        await client.create_session("cli-json")
        bad = await ctl(daemon, "checkpoint-save", "cli-json", "{step: 3}", check=False)
        assert bad.returncode == 2 and "payload is not valid JSON" in one_line(bad.stderr)
        bad = await ctl(daemon, "checkpoint-save", "cli-json", "-", stdin="{", check=False)
        assert bad.returncode == 2 and "payload is not valid JSON" in one_line(bad.stderr)
        bad = await ctl(daemon, "events-append", "cli-json", stdin="[{type: 1}]", check=False)
        assert bad.returncode == 2 and "standard input is not valid JSON" in one_line(bad.stderr)
        bad = await ctl(daemon, "append-many", "cli-json",
                        stdin='{"role": "user", "content": "a"}\n{oops}\n', check=False)
        assert bad.returncode == 2 and "standard input line 2" in one_line(bad.stderr)
        bad = await ctl(daemon, "memory", "cli-json", "{x", check=False)
        assert bad.returncode == 2 and "not valid JSON" in one_line(bad.stderr)
        bad = await ctl(daemon, "create", "--metadata", "nope", "--json", check=False)
        error = json.loads(one_line(bad.stderr))["error"]
        assert bad.returncode == 2 and error["code"] == "usage" and "--metadata" in error["message"]
        bad = await ctl(daemon, "events-append", "cli-json", "--json", stdin="[1,", check=False)
        error = json.loads(one_line(bad.stderr))["error"]
        assert error["code"] == "bad_json" and error["data"]["line"] == 1
        assert (await client.get_session("cli-json")).version == 1  # nothing was written

    async def test_local_file_errors_say_what_they_are(self, daemon: Daemon,
                                                       client: AsyncClient,
                                                       short_dir: str) -> None:
        """A missing output directory or a directory given as a file is a file error (1),
        not "cannot reach sessiond"; with --json the error is JSON."""
        await client.create_session("cli-file")
        missing = await ctl(daemon, "export", "cli-file", "-o", "/missing/dir/x.json", check=False)
        line = one_line(missing.stderr)
        assert missing.returncode == 1 and "cannot reach" not in line
        assert "/missing/dir/x.json" in line and "no such directory: /missing/dir" in line
        folder = await ctl(daemon, "append-many", "cli-file", short_dir, check=False)
        assert folder.returncode == 1 and "is a directory" in one_line(folder.stderr)
        js = await ctl(daemon, "events-append", "cli-file", "/nope.json", "--json", check=False)
        error = json.loads(one_line(js.stderr))["error"]
        assert error == {"code": "file_error", "message": "/nope.json: no such file",
                         "data": {"path": "/nope.json"}}
        gone = await ctl(daemon, "--json", "ping", check=False)
        assert gone.returncode == 0
        unreachable = await anyio.run_process(
            [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket + ".x", "--json",
             "ping"], check=False)
        error = json.loads(one_line(unreachable.stderr.decode()))["error"]
        assert unreachable.returncode == 2 and error["code"] == "unreachable"

    async def test_spawn_that_cannot_start_exits_non_zero(self, daemon: Daemon) -> None:
        """A program that does not exist: the session is failed and spawn exits 1."""
        done = await ctl(daemon, "spawn", "--id", "cli-nostart", "--",
                         "/no/such/program", check=False)
        assert done.returncode == 1
        assert "/no/such/program did not start" in done.stderr.strip().splitlines()[-1]

    async def test_import_nothing_found_and_skip(self, daemon: Daemon, client: AsyncClient,
                                                 short_dir: str) -> None:
        """An import that finds nothing exits 1 saying so; --on-conflict skip lists skips."""
        empty = os.path.join(short_dir, "empty")
        os.mkdir(empty)
        nothing = await ctl(daemon, "import", "--format", "hive", empty, check=False)
        assert nothing.returncode == 1 and "nothing to import" in one_line(nothing.stderr)
        await client.create_session("cli-skip")
        path = os.path.join(short_dir, "doc.json")
        await ctl(daemon, "export", "cli-skip", "-o", path)
        skipped = await ctl(daemon, "import", path, "--on-conflict", "skip")
        assert f"skipped cli-skip from {path}" in skipped.stdout
        report = await ctl_json(daemon, "import", path, "--on-conflict", "skip")
        assert report["imported"] == [] and report["skipped"][0]["session_id"] == "cli-skip"
        await client.delete_session("cli-skip")
        again = await ctl_json(daemon, "import", path, "--on-conflict", "skip")
        assert again["skipped"] == [] and again["imported"][0]["session_id"] == "cli-skip"


class TestDeleteConfirmation:
    def _delete_on_tty(self, socket_path: str, answer: bytes | None, *extra: str
                       ) -> tuple[int, str]:
        """Run `delete` with a terminal as stdin; answer its question (if it asks)."""
        import pty
        master, slave = pty.openpty()
        try:
            proc = subprocess.Popen(
                [sys.executable, "-m", "sessiond.cli", "--socket", socket_path, "delete",
                 "cli-tty", *extra], stdin=slave, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
            if answer is not None:
                assert isinstance(proc.stderr, io.BufferedReader)
                prompt = b""
                while not prompt.endswith(b"[y/N] "):
                    chunk = proc.stderr.read1(1024)
                    assert chunk, "sessionctl did not ask"
                    prompt += chunk
                assert b"cli-tty" in prompt
                os.write(master, answer)
            out, err = proc.communicate(timeout=60)
            return proc.returncode, out.decode() + err.decode()
        finally:
            os.close(master)
            os.close(slave)

    async def test_delete_asks_on_a_terminal(self, daemon: Daemon, client: AsyncClient) -> None:
        """No (or anything but y) keeps the session, y deletes it; --yes does not ask;
        without a terminal (a script) it does not ask."""
        await client.create_session("cli-tty")
        code, text = await anyio.to_thread.run_sync(
            self._delete_on_tty, daemon.socket, b"n\n")
        assert code == 1 and "not deleted" in text
        assert (await client.get_session("cli-tty")).session_id == "cli-tty"
        code, text = await anyio.to_thread.run_sync(
            self._delete_on_tty, daemon.socket, b"y\n")
        assert code == 0 and "deleted cli-tty" in text
        await client.create_session("cli-tty")
        code, text = await anyio.to_thread.run_sync(
            self._delete_on_tty, daemon.socket, None, "--yes")
        assert code == 0 and "deleted cli-tty" in text and "[y/N]" not in text
        await client.create_session("cli-tty")
        await ctl(daemon, "delete", "cli-tty", stdin="")  # stdin is a pipe: no question
        assert (await client.list_sessions()).sessions == []


class TestDatabaseOpenErrors:
    async def test_a_directory_is_named_as_one(self, short_dir: str) -> None:
        """`sessiond --db DIR` exits 1 saying the path is a directory."""
        directory = os.path.join(short_dir, "db")
        os.mkdir(directory)
        done = await anyio.run_process(
            [sys.executable, "-m", "sessiond_daemon", "--socket", os.path.join(short_dir, "s"),
             "--db", directory, "--log-format", "console"], check=False)
        assert done.returncode == 1 and b"is a directory" in done.stderr

    @staticmethod
    def _open_as_nobody(path: str) -> str:
        """Open a store on `path` in a forked child running as `nobody`; its error text."""
        import asyncio
        import pwd

        from sessiond_daemon.stores import registry

        def open_store() -> bytes:
            try:
                asyncio.run(registry.open_store(path).open())
                return b"opened"
            except Exception as exc:
                return str(exc).encode()

        return as_user(pwd.getpwnam("nobody"), open_store).decode()

    @pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
    async def test_permission_denied_is_named(self, short_dir: str) -> None:
        """A database file, or a directory, the daemon's user may not write: "permission
        denied", naming the path, not SQLite's "unable to open database file"."""
        os.chmod(short_dir, 0o711)
        shared = os.path.join(short_dir, "shared")
        os.mkdir(shared)
        os.chmod(shared, 0o777)
        theirs = os.path.join(shared, "theirs.db")
        sqlite3.connect(theirs).close()
        os.chmod(theirs, 0o600)
        text = await anyio.to_thread.run_sync(self._open_as_nobody, theirs)
        assert "permission denied" in text.lower() and theirs in text, text
        locked = os.path.join(short_dir, "locked")
        os.mkdir(locked, 0o755)
        text = await anyio.to_thread.run_sync(self._open_as_nobody,
                                              os.path.join(locked, "new.db"))
        assert "permission denied" in text.lower() and locked in text, text

    async def test_read_only_file_system_is_named(self) -> None:
        """A database on a read-only file system: the message says so (and keeps SQLite's)."""
        from test_faults import tmpfs

        with tmpfs("1m") as point:
            db = os.path.join(point, "ro.db")
            sqlite3.connect(db).close()
            subprocess.run(["mount", "-o", "remount,ro", point], check=True)
            with tempfile.TemporaryDirectory(prefix="sd-") as run:
                done = await anyio.run_process(
                    [sys.executable, "-m", "sessiond_daemon", "--db", db, "--socket",
                     os.path.join(run, "s"), "--log-format", "json"], check=False)
        assert done.returncode == 1
        assert f"the file system holding {point} is read-only" in done.stderr.decode()


class TestNonFiniteNumbers:
    """NaN and infinity are not JSON: refused before sending, never sent as null (which a
    merge patch would take for "delete this key")."""

    async def test_cli_refuses_them_in_arguments_and_stdin(self, daemon: Daemon,
                                                           client: AsyncClient) -> None:
        await client.create_session("nf")
        await client.update_memory("nf", {"keep": "important", "n": 5})
        for patch in ('{"keep": 1e999}', '{"keep": NaN}', '{"keep": -Infinity}'):
            done = await ctl(daemon, "memory", "nf", patch, check=False)
            assert done.returncode == 2, done.stderr
            assert "not valid JSON" in done.stderr and "Traceback" not in done.stderr
        done = await ctl(daemon, "append-many", "nf", "-", check=False,
                         stdin='{"role": "user", "content": "a", "metadata": {"c": 1e999}}')
        assert done.returncode == 2 and "not valid JSON" in done.stderr, done.stderr
        state = await client.get_session("nf")
        assert state.memory == {"keep": "important", "n": 5} and state.message_count == 0

    async def test_clients_refuse_them_naming_the_path(self, daemon: Daemon,
                                                       client: AsyncClient) -> None:
        from sessiond import Client, InvalidParamsError

        await client.create_session("nf2")
        await client.update_memory("nf2", {"n": 1})
        with pytest.raises(InvalidParamsError) as refused:
            await client.update_memory("nf2", {"n": float("nan")})
        assert refused.value.data["path"] == "$.patch.n"
        with Client(daemon.socket) as blocking, pytest.raises(InvalidParamsError) as refused:
            blocking.create_session("nf3", metadata={"cost": [1.0, float("inf")]})
        assert refused.value.data["path"] == "$.metadata.cost[1]"
        assert (await client.get_session("nf2")).memory == {"n": 1}
        assert (await client.ping()).pong  # the connection is still good
        with pytest.raises(SessiondError):
            await client.get_session("nf3")


CLAUDE_CODE = os.path.join(os.path.dirname(__file__), "fixtures", "transcripts", "claude-code",
                           "projects", "-home-dev-shop",
                           "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d.jsonl")
CC_ID = "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d"


class TestEveryFaceReadsTheConversation:
    """Issue 44 §2: a session reads as its conversation whoever wrote it: tool calls with
    the tool's name and input, each result under its call, every turn in the trajectory."""

    async def test_an_imported_claude_code_session(self, daemon: Daemon) -> None:
        await ctl(daemon, "import", "--format", "claude-code", CLAUDE_CODE)
        messages = (await ctl(daemon, "messages", CC_ID, columns=120)).stdout
        assert '→ Grep({"' in messages and '"pattern": "def total"' in messages
        assert "↳ Grep: shop/cart.py:41" in messages  # the result names its call
        steps = (await ctl(daemon, "trajectory", CC_ID)).stdout.splitlines()
        assert [line.split()[1] for line in steps] == [
            "user", "message", "tool_call", "tool_result", "message", "user"]
        assert "Grep({" in steps[2] and '"path": "shop"' in steps[2]
        assert "quantize to cents" in steps[4]
        full = await ctl_json(daemon, "trajectory", CC_ID, "--full")
        assert full[2]["details"] == {"id": "toolu_01Qw3rTy5uIo7pAs9dFg1hJk",
                                      "input": {"path": "shop", "pattern": "def total"}}
        events = (await ctl(daemon, "events", CC_ID, columns=200)).stdout
        assert "#2 assistant: → Grep(" in events and "#3 tool: ↳ Grep:" in events

    async def test_a_clients_own_tool_calls(self, daemon: Daemon, client: AsyncClient) -> None:
        """OpenAI's shape of metadata.tool_calls, as a client writes it."""
        await client.create_session("own-1")
        await client.append_message("own-1", "user", "what is 6 x 7?")
        call = {"id": "c-9", "type": "function",
                "function": {"name": "multiply", "arguments": '{"a": 6, "b": 7}'}}
        await client.append_message("own-1", "assistant", "let me compute",
                                    metadata={"tool_calls": [call]})
        await client.append_message("own-1", "tool", "42", tool_call_id="c-9")
        out = (await ctl(daemon, "messages", "own-1", columns=120)).stdout
        assert '→ multiply({"a": 6, "b": 7})' in out and "↳ multiply: 42" in out
        steps = (await ctl(daemon, "trajectory", "own-1")).stdout
        assert 'tool_call    multiply({"a": 6, "b": 7})' in steps
        assert "tool_result  42" in steps

    async def test_a_forks_events_hold_what_it_inherited(self, daemon: Daemon,
                                                         client: AsyncClient) -> None:
        await client.create_session("src-1", task="the source")
        await client.append_message("src-1", "user", "before the fork")
        fork = await client.fork("src-1", new_session_id="fork-1")
        await client.append_message("fork-1", "assistant", "after the fork")
        text = (await ctl(daemon, "events", "fork-1", columns=100)).stdout
        assert "inherited: the events of src-1" in text
        lines = [x for x in text.splitlines() if " v" in x]
        assert [x.lstrip("^").split()[4] for x in lines] == [
            "session.created", "message.appended", "session.forked", "message.appended"]
        assert lines[0].startswith("^") and lines[1].startswith("^")  # the source's
        assert not lines[2].startswith("^")
        got = await ctl_json(daemon, "events", "fork-1")
        assert [(e["session_id"], e["version"]) for e in got["events"]] == [
            ("src-1", 1), ("src-1", 2), ("fork-1", 3), ("fork-1", 4)]
        assert fork.version == 3
        page = await ctl_json(daemon, "events", "fork-1", "--from-version", "2", "--limit", "2")
        assert [e["version"] for e in page["events"]] == [2, 3] and page["next"] == 4


class TestFiguresSayWhatTheyCount:
    async def test_show_says_how_long_an_active_session_ran(self, daemon: Daemon,
                                                            client: AsyncClient) -> None:
        """An active session's duration_ms is 0 (it is set at the end): show says the
        time from its start to its last event instead, and that it has not ended."""
        await ctl(daemon, "import", "--format", "claude-code", CLAUDE_CODE)
        out = (await ctl(daemon, "show", CC_ID)).stdout
        assert "duration_ms" not in out
        assert "2m 10s to its last event (active, not ended)" in out  # 09:14:02 to 09:16:12

    async def test_stats_says_what_events_and_last_position_count(
            self, daemon: Daemon, client: AsyncClient) -> None:
        await client.create_session("gone-1")
        await client.delete_session("gone-1")
        out = (await ctl(daemon, "stats", columns=200)).stdout
        assert "events: events stored now" in out
        assert "last_position: the newest event's global position" in out
        assert "since deleted" in out


class TestEightyColumns:
    async def test_ping_lists_every_method(self, daemon: Daemon) -> None:
        out = (await ctl(daemon, "ping", columns=80)).stdout
        methods = (await ctl_json(daemon, "ping"))["methods"]
        listed = out.split("methods:", 1)[1].split()
        assert listed[0] == str(len(methods)) and listed[1:] == methods
        assert all(len(line) <= 80 for line in out.splitlines())

    async def test_search_and_events_wide_fit(self, daemon: Daemon, client: AsyncClient) -> None:
        await ctl(daemon, "import", "--format", "claude-code", CLAUDE_CODE)
        out = (await ctl(daemon, "search", "total", columns=80)).stdout
        head = out.splitlines()[0]
        assert "(7 matching)" in head and len(head) <= 80
        wide = (await ctl(daemon, "events", "--wide", CC_ID, columns=80)).stdout
        first = wide.splitlines()[0].split()
        assert first[:4] == ["15" if first[0] == "15" else first[0], CC_ID, "v1",
                             "session.created"]
        # wrapped at 80 columns: compared with its white space folded
        assert '"task": "The cart total is off by a cent' in " ".join(wide.split())
        assert all(len(line) <= 80 for line in wide.splitlines())

    async def test_output_into_head_is_quiet(self, daemon: Daemon, client: AsyncClient) -> None:
        """`sessionctl output ID | head -3`: three lines, no traceback."""
        fakes = os.path.join(os.path.dirname(__file__), "executors")
        await ctl(daemon, "spawn", "--adapter", "codex", "--id", "pipe-1", "--task", "x", "--",
                  os.path.join(fakes, "codex"), "exec", "--json", "x")
        with anyio.fail_after(30):
            while (await client.get_session("pipe-1")).status == "active":
                await anyio.sleep(0.02)
        command = (f"{sys.executable} -m sessiond.cli --socket {daemon.socket} output pipe-1"
                   " --turn 1 | head -1")
        for _ in range(5):  # whether the pipe is closed before the write is a race: try more
            done = await anyio.run_process(["sh", "-c", command], check=False)
            assert done.stdout.decode().count("\n") == 1
            assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr, \
                done.stderr

    async def test_the_help_speaks_of_frameworks_not_seeds(self, daemon: Daemon) -> None:
        out = (await ctl(daemon, "import", "--help")).stdout + (await ctl(daemon, "--help")).stdout
        assert "seed" not in out.lower()
