"""`sessionctl restore`: sessions written back into the CLIs' own transcript folders."""

from __future__ import annotations

import filecmp
import json
import os
import shutil
import sys
from typing import Any

import anyio
import pytest
from conftest import Daemon
from sdk_extras import require_sdk

from sessiond import AsyncClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
TRANSCRIPTS = os.path.join(os.path.dirname(__file__), "fixtures", "transcripts")
# The CLIs' folders the round trip imports, deletes and restores: every version read.
ROOTS = {"claude-code": [os.path.join(TRANSCRIPTS, "claude-code", "projects"),
                         os.path.join(TRANSCRIPTS, "current", "claude-code", "projects")],
         "codex": [os.path.join(TRANSCRIPTS, "codex", "sessions"),
                   os.path.join(TRANSCRIPTS, "current", "codex", "sessions")]}


async def sessionctl(daemon: Daemon, *args: str,
                     env: dict[str, str] | None = None) -> tuple[int, Any, str]:
    result = await anyio.run_process(
        [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, *args, "--json"],
        check=False, env=None if env is None else {**os.environ, **env})
    err = result.stderr.decode()
    assert "Traceback" not in err, err
    out = result.stdout.decode()
    return result.returncode, json.loads(out) if out.strip() else None, err


def files_under(root: str) -> list[str]:
    return sorted(os.path.relpath(os.path.join(d, f), root)
                  for d, _, fs in os.walk(root) for f in fs)


@pytest.mark.parametrize("fmt", ["claude-code", "codex"])
async def test_round_trip_gives_back_the_files(daemon: Daemon, client: AsyncClient,
                                               short_dir: str, fmt: str) -> None:
    """Import the CLI's transcripts, delete them, restore each session: the same files,
    byte for byte, at the same places; a second restore refuses to overwrite."""
    root = os.path.join(short_dir, "root")
    for source in ROOTS[fmt]:
        shutil.copytree(source, root, dirs_exist_ok=True)
    originals = os.path.join(short_dir, "originals")
    shutil.copytree(root, originals)
    code, out, err = await sessionctl(daemon, "import", "--format", fmt, root)
    assert code == 0 and out["failed"] == [], (out, err)
    sessions = [i["session_id"] for i in out["imported"]]
    assert len(sessions) == len(files_under(originals))
    shutil.rmtree(root)
    for sid in sessions:
        code, item, err = await sessionctl(daemon, "restore", sid, "--format", fmt,
                                           "--to", root)
        assert code == 0, err
        assert item["lines"] == item["original_lines"] > 0 and item["left_out"] == []
    assert files_under(root) == files_under(originals)
    for name in files_under(root):
        assert filecmp.cmp(os.path.join(root, name), os.path.join(originals, name),
                           shallow=False), name
    # Never over a file: the one there stays as it is.
    victim, sid = out["imported"][0]["file"], out["imported"][0]["session_id"]
    with open(victim, "w") as f:
        f.write("mine\n")
    code, out, err = await sessionctl(daemon, "restore", sid, "--format", fmt, "--to", root)
    assert code == 1 and "never overwrites" in err
    with open(victim) as f:
        assert f.read() == "mine\n"


async def test_the_agent_sdk_reads_a_restored_claude_code_session(
        daemon: Daemon, client: AsyncClient, short_dir: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Restored into $CLAUDE_CONFIG_DIR/projects (the default --to), the Claude Agent SDK's
    own readers list the session and read its messages."""
    sdk = require_sdk("claude_agent_sdk", "claude-agent-sdk")
    root = os.path.join(short_dir, "projects")
    shutil.copytree(ROOTS["claude-code"][0], root)
    code, out, _ = await sessionctl(daemon, "import", "--format", "claude-code", root)
    assert code == 0 and out["failed"] == []
    shutil.rmtree(root)
    config = os.path.join(short_dir, "claude-config")
    sid = "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d"
    code, item, err = await sessionctl(daemon, "restore", sid, "--format", "claude-code",
                                       env={"CLAUDE_CONFIG_DIR": config})
    assert code == 0, err
    assert item["file"] == os.path.join(config, "projects", "-home-dev-shop", f"{sid}.jsonl")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", config)
    listed = sdk.list_sessions(directory="/home/dev/shop")
    assert [s.session_id for s in listed] == [sid]
    messages = sdk.get_session_messages(sid, directory="/home/dev/shop")
    ours = (await client.list_messages(sid)).messages
    assert [m.type for m in messages] == ["user", "assistant", "assistant", "user",
                                          "assistant", "user"]
    assert messages[0].message["content"] == ours[0].content
    assert messages[-1].message["content"] == ours[-1].content


async def made_here(client: AsyncClient) -> str:
    """A session no CLI made: a user, a tool call, its result, an answer."""
    sid = "made-here-1"
    await client.create_session(sid, working_dir="/home/dev/made", model="claude-x")
    await client.append_messages(sid, [
        {"role": "user", "content": "What is in the folder?"},
        {"role": "system", "content": "Be brief."},
        {"role": "assistant", "content": "Let me look.", "metadata": {"tool_calls": [
            {"id": "toolu_1", "name": "Bash", "input": {"command": "ls"}}]}},
        {"role": "tool", "content": "a.txt\nb.txt", "tool_call_id": "toolu_1"},
        {"role": "assistant", "content": "Two files: a.txt and b.txt."}])
    return sid


async def test_a_session_made_elsewhere_is_a_transcript_each_cli_reads(
        daemon: Daemon, client: AsyncClient, short_dir: str,
        monkeypatch: pytest.MonkeyPatch) -> None:
    """Claude Code: the SDK's reader reads its messages; Codex: the rollout imports back
    into the same conversation. What cannot be said (a system message) is reported."""
    sid = await made_here(client)
    root = os.path.join(short_dir, "cc")
    code, item, err = await sessionctl(daemon, "restore", sid, "--format", "claude-code",
                                       "--to", root)
    assert code == 0, err
    assert item["original_lines"] == 0 and item["lines"] == 4
    assert item["left_out"] == ["a system message (version 3)"]
    assert os.path.dirname(item["file"]) == os.path.join(root, "-home-dev-made")
    cli_id = os.path.basename(item["file"]).removesuffix(".jsonl")
    sdk = require_sdk("claude_agent_sdk", "claude-agent-sdk")
    monkeypatch.setenv("CLAUDE_CONFIG_DIR", short_dir)
    os.rename(root, os.path.join(short_dir, "projects"))
    messages = sdk.get_session_messages(cli_id, directory="/home/dev/made")
    assert [m.type for m in messages] == ["user", "assistant", "user", "assistant"]
    assert [(b["type"], b.get("text") or b.get("name")) for b in messages[1].message["content"]
            ] == [("text", "Let me look."), ("tool_use", "Bash")]
    assert messages[2].message["content"][0]["tool_use_id"] == "toolu_1"

    root = os.path.join(short_dir, "codex")
    code, item, err = await sessionctl(daemon, "restore", sid, "--format", "codex",
                                       "--to", root)
    assert code == 0, err
    code, out, err = await sessionctl(daemon, "import", "--format", "codex", root)
    assert code == 0 and len(out["imported"]) == 1, (out, err)
    back = (await client.list_messages(out["imported"][0]["session_id"])).messages
    # Codex says an answer's text and its calls as items of their own: two messages.
    assert [(m.role, m.tool_call_id, m.content) for m in back] == [
        ("user", None, "What is in the folder?"), ("assistant", None, "Let me look."),
        ("assistant", None, 'Bash({"command": "ls"})'), ("tool", "toolu_1", "a.txt\nb.txt"),
        ("assistant", None, "Two files: a.txt and b.txt.")]
    assert back[2].metadata["tool_calls"][0]["input"] == json.dumps({"command": "ls"})


async def test_a_session_mirrored_by_the_agent_sdk_goes_back_to_its_key(
        daemon: Daemon, client: AsyncClient, short_dir: str) -> None:
    """SessiondSessionStore's sessions go back where the key names them, a sub-agent's
    under its session: the lines as the SDK gave them."""
    require_sdk("claude_agent_sdk", "claude-agent-sdk")
    from sessiond.integrations.claude_agent_sdk import SessiondSessionStore

    main = os.path.join(ROOTS["claude-code"][1], "-home-dev-web",
                        "9c8b7a6d-5e4f-4a3b-8c2d-1e0f9a8b7c6e")
    key = {"project_key": "-home-dev-web", "session_id": "9c8b7a6d-5e4f-4a3b-8c2d-1e0f9a8b7c6e"}
    store = SessiondSessionStore(socket=daemon.socket)
    try:
        for k, path in ((key, main + ".jsonl"),
                        ({**key, "subpath": "subagents/agent-b7e1d20"},
                         os.path.join(main, "subagents", "agent-b7e1d20.jsonl"))):
            with open(path) as f:
                await store.append(k, [json.loads(line) for line in f])  # type: ignore[arg-type]
    finally:
        store.close()
    root = os.path.join(short_dir, "projects")
    for sid in (key["session_id"], f"{key['session_id']}.agent-b7e1d20"):
        code, item, err = await sessionctl(daemon, "restore", sid, "--format", "claude-code",
                                           "--to", root)
        assert code == 0 and item["lines"] == item["original_lines"], err
    for source in (main + ".jsonl", os.path.join(main, "subagents", "agent-b7e1d20.jsonl")):
        mine = os.path.join(root, os.path.relpath(source, ROOTS["claude-code"][1]))
        with open(mine) as a, open(source) as b:
            assert [json.loads(x) for x in a] == [json.loads(x) for x in b]


async def test_metadata_never_puts_a_file_outside_the_root(daemon: Daemon, client: AsyncClient,
                                                          short_dir: str) -> None:
    """A session whose metadata names `..` is refused, nothing written."""
    await client.create_session("sneaky", adapter="claude-code", metadata={
        "project": "..", "sdk_session_id": "../../escaped"})
    await client.append_message("sneaky", "user", "hi")
    root = os.path.join(short_dir, "a", "projects")
    code, _, err = await sessionctl(daemon, "restore", "sneaky", "--format", "claude-code",
                                    "--to", root)
    assert code == 1 and "outside" in err
    assert not os.path.exists(os.path.join(short_dir, "escaped.jsonl"))


async def test_a_trimmed_session_imports_and_restores(daemon: Daemon, client: AsyncClient,
                                                      short_dir: str) -> None:
    """A Claude Code session compacted (its compact_boundary) and trimmed by retention:
    the importer run again from the file's start appends a new line after the trim (the
    keys of the lines trimmed are answered with their first writes' versions), and
    restore writes what the session still holds (review of issues 46 and 48)."""
    sid = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
    root = os.path.join(short_dir, "projects")
    shutil.copytree(os.path.join(os.path.dirname(__file__), "fixtures", "compaction",
                                 "claude-code", "projects"), root)
    path = os.path.join(root, "-home-dev-app", f"{sid}.jsonl")
    code, out, err = await sessionctl(daemon, "import", "--format", "claude-code", root)
    assert code == 0 and out["failed"] == [], (out, err)
    trimmed = await client.trim(sid, older_than_days=0)
    assert trimmed.starts_at is not None and trimmed.starts_at > 1
    with open(path) as f:
        last = json.loads(f.read().splitlines()[-1])
    last.update(uuid="c0c0c0c0-0000-4000-8000-000000000099", parentUuid=last["uuid"],
                timestamp="2026-02-03T10:07:00.000Z")
    last["message"]["content"] = [{"type": "text", "text": "One more line."}]
    with open(path, "a") as f:
        f.write(json.dumps(last) + "\n")
    code, out, err = await sessionctl(daemon, "import", "--format", "claude-code", root)
    assert code == 0 and out["failed"] == [], (out, err)
    context = await client.context(sid)
    assert context.messages[-1].content == "One more line."
    code, item, err = await sessionctl(daemon, "restore", sid, "--format", "claude-code",
                                       "--to", os.path.join(short_dir, "back"))
    assert code == 0, err
    with open(item["file"]) as f:
        assert json.loads(f.read().splitlines()[-1])["uuid"].endswith("000000000099")
    assert (await client.verify()).ok
