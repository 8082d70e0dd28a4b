"""SessiondSessionStore against the Claude Agent SDK's own conformance harness and readers."""

from __future__ import annotations

import itertools
import json
import os
import shutil
import sys
from typing import Any

import anyio
import pytest
from conftest import Daemon
from sdk_extras import require_sdk

sdk = require_sdk("claude_agent_sdk", "claude-agent-sdk")
from claude_agent_sdk import (  # noqa: E402
    get_session_messages_from_store,
    list_sessions_from_store,
)
from claude_agent_sdk.testing import run_session_store_conformance  # noqa: E402

from sessiond import AsyncClient  # noqa: E402
from sessiond.integrations.claude_agent_sdk import SessiondSessionStore  # noqa: E402
from sessiond_schemas.errors import SessionNotFoundError  # noqa: E402

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "transcripts", "claude-code",
                        "projects")
PROJECT = "-home-dev-shop"
SID = "3f6b1c2a-9d84-4e1b-a7c5-1e2f3a4b5c6d"
counter = itertools.count()


def lines_of(path: str) -> list[dict[str, Any]]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


async def test_conformance(daemon: Daemon) -> None:
    """The SDK's 14 contracts, a namespace per store so that each starts empty."""
    stores: list[SessiondSessionStore] = []

    def make() -> SessiondSessionStore:
        stores.append(SessiondSessionStore(namespace=f"conformance-{next(counter)}",
                                           socket=daemon.socket))
        return stores[-1]

    try:
        await run_session_store_conformance(make)
    finally:
        for store in stores:
            store.close()
    assert len(stores) >= 14  # one per contract, and the probe: none was skipped


async def test_a_transcript_through_the_store_is_a_session(daemon: Daemon,
                                                           client: AsyncClient) -> None:
    """Entries become the session's messages, tool calls and results and token usage,
    as the importer makes them; load gives back every entry as it was appended."""
    entries = lines_of(os.path.join(FIXTURES, PROJECT, f"{SID}.jsonl"))
    store = SessiondSessionStore(socket=daemon.socket)
    key = {"project_key": PROJECT, "session_id": SID}
    try:
        await store.append(key, entries[:3])  # type: ignore[arg-type]
        await store.append(key, entries[3:])  # type: ignore[arg-type]
        await store.append(key, entries[3:5])  # type: ignore[arg-type]  # a retry: no dup
        assert await store.load(key) == entries  # type: ignore[arg-type]
    finally:
        store.close()
    s = await client.get_session(SID)
    assert (s.namespace, s.working_dir, s.model, s.adapter, s.source) == (
        f"claude-code:{PROJECT}", "/home/dev/shop", "claude-sonnet-4-20250514", "claude-code",
        "claude-agent-sdk")
    assert s.task == entries[1]["message"]["content"]
    msgs = (await client.list_messages(SID)).messages
    assert [(m.role, m.tool_call_id) for m in msgs] == [
        ("user", None), ("assistant", None), ("assistant", None),
        ("tool", "toolu_01Qw3rTy5uIo7pAs9dFg1hJk"), ("assistant", None), ("user", None)]
    assert msgs[2].metadata["tool_calls"][0]["name"] == "Grep"
    usage = [e["message"]["usage"] for e in entries[2:] if e["type"] == "assistant"]
    assert s.token_usage.output_tokens == usage[0]["output_tokens"] + usage[2]["output_tokens"]
    found = await client.search("rounding")
    assert SID in [h.session_id for h in found.sessions]
    assert (await client.verify()).ok


async def test_store_and_importer_see_one_session(daemon: Daemon, client: AsyncClient,
                                                  short_dir: str) -> None:
    """The store writes half a transcript, the importer reads the whole file: one session,
    no line twice; then the SDK's own readers list it and read its messages."""
    root = os.path.join(short_dir, "projects")
    shutil.copytree(FIXTURES, root)
    path = os.path.join(root, PROJECT, f"{SID}.jsonl")
    entries = lines_of(path)
    store = SessiondSessionStore(socket=daemon.socket)
    key = {"project_key": PROJECT, "session_id": SID}
    try:
        await store.append(key, entries[:4])  # type: ignore[arg-type]
        result = await anyio.run_process(
            [sys.executable, "-m", "sessiond.cli", "--socket", daemon.socket, "import",
             "--format", "claude-code", "--json", root], check=False)
        assert result.returncode == 0, result.stderr
        out = json.loads(result.stdout)
        mine = [i for i in out["imported"] if i["session_id"] == SID]
        assert [i["lines"] for i in mine] == [len(entries) - 4]
        assert await store.load(key) == entries  # type: ignore[arg-type]
        events = (await client.read_events(SID, limit=10_000)).events
        kept = [e.fields()["transcript_line"] for e in events
                if "transcript_line" in e.fields()]
        assert [json.loads(k) for k in kept] == entries  # each line once, in order
        # The sub-agent the importer read is the store's subkey of its session.
        api = "7d1c2b9e-5a44-4f0b-9e61-3c8a2d4f6b10"
        assert await store.list_subkeys({"project_key": "-home-dev-api", "session_id": api}
                                        ) == ["subagents/agent-a3f9c21"]
        listed = await list_sessions_from_store(store, directory="/home/dev/shop")
        assert SID in [info.session_id for info in listed]
        read = await get_session_messages_from_store(store, SID, directory="/home/dev/shop")
        assert [m.type for m in read][:2] == ["user", "assistant"]
        assert read[0].message["content"] == entries[1]["message"]["content"]
        # The SDK's other store helpers: sub-agents, rename, fork, delete.
        assert await sdk.list_subagents_from_store(store, api, directory="/home/dev/api"
                                                   ) == ["a3f9c21"]
        sub = await sdk.get_subagent_messages_from_store(store, api, "a3f9c21",
                                                         directory="/home/dev/api")
        assert [m.type for m in sub][:2] == ["user", "assistant"]
        await sdk.rename_session_via_store(store, SID, "Rounding", directory="/home/dev/shop")
        info = await sdk.get_session_info_from_store(store, SID, directory="/home/dev/shop")
        assert info is not None and info.custom_title == "Rounding"
        fork = await sdk.fork_session_via_store(store, SID, directory="/home/dev/shop")
        listed = await list_sessions_from_store(store, directory="/home/dev/shop")
        assert {SID, fork.session_id} <= {info.session_id for info in listed}
        await sdk.delete_session_via_store(store, fork.session_id, directory="/home/dev/shop")
        with pytest.raises(SessionNotFoundError):
            await client.get_session(fork.session_id)
    finally:
        store.close()


async def test_any_json_entry_comes_back(daemon: Daemon, client: AsyncClient) -> None:
    """Entries are opaque to a store: one whose messages the daemon would refuse (a
    number past int64 in a tool's input), odd text, no uuid, repeated: each comes back."""
    odd = [
        {"type": "assistant", "uuid": "u-1", "message": {"role": "assistant", "content": [
            {"type": "tool_use", "id": "t1", "name": "Big", "input": {"n": 2**70}}]}},
        {"type": "user", "uuid": "u-2", "message": {"role": "user", "content": "ünï \u2028 😀"}},
        {"type": "tag", "tag": "x"},
        {"type": "tag", "tag": "x"},  # no uuid: appended again, not taken for the first
        {"type": "x", "nested": {"a": [1, 2.5, None, True, {"b": "c"}]}},
    ]
    store = SessiondSessionStore(namespace="odd", socket=daemon.socket)
    key = {"project_key": "p", "session_id": "s"}
    try:
        await store.append(key, odd[:3])  # type: ignore[arg-type]
        await store.append(key, odd[3:])  # type: ignore[arg-type]
        assert await store.load(key) == odd  # type: ignore[comparison-overlap]
    finally:
        store.close()
    assert (await client.verify()).ok


async def test_concurrent_appends_keep_every_line_and_one_summary(daemon: Daemon) -> None:
    """Two stores (two SDK processes) append to one session at once: every entry once,
    and the summary is the fold of all of them, in the order stored."""
    from claude_agent_sdk import fold_session_summary

    key = {"project_key": "p", "session_id": "busy"}
    stores = [SessiondSessionStore(namespace="busy", socket=daemon.socket) for _ in range(2)]

    async def writer(i: int) -> None:
        for n in range(8):
            await stores[i].append(key, [  # type: ignore[arg-type]
                {"type": "user", "uuid": f"w{i}-{n}-{k}", "customTitle": f"t{i}{n}",
                 "timestamp": f"2026-01-01T00:{n:02d}:{k:02d}.000Z",
                 "message": {"role": "user", "content": f"from {i}: {n}.{k}"}}
                for k in range(3)])

    try:
        async with anyio.create_task_group() as tg:
            for i in range(2):
                tg.start_soon(writer, i)
        loaded = await stores[0].load(key)  # type: ignore[arg-type]
        assert loaded is not None and len(loaded) == 48
        assert len({e["uuid"] for e in loaded}) == 48
        [summary] = await stores[1].list_session_summaries("p")
        assert summary["data"] == fold_session_summary(None, key, loaded)["data"]  # type: ignore[arg-type]
    finally:
        for store in stores:
            store.close()


async def test_a_line_another_writer_stored_is_not_stored_again(daemon: Daemon) -> None:
    """Store A knows what it wrote; B (another process, or the importer) writes a line
    A is then given too: stored once. B deletes the session and starts it again: A
    finds that out and goes on."""
    def entry(n: int) -> dict[str, Any]:
        return {"type": "user", "uuid": f"e-{n}", "message": {"role": "user",
                                                            "content": f"line {n}"}}

    a, b = (SessiondSessionStore(namespace="two", socket=daemon.socket) for _ in range(2))
    for sub in (None, "subagents/agent-1"):
        key: Any = {"project_key": "p", "session_id": "s"}
        if sub:
            key["subpath"] = sub
        try:
            await a.append(key, [entry(0), entry(1)])
            await b.append(key, [entry(2)])
            await a.append(key, [entry(2), entry(3)])
            assert await b.load(key) == [entry(n) for n in range(4)]
            await b.delete(key)
            await b.append(key, [entry(5)])
            await a.append(key, [entry(5), entry(6)])
            assert await a.load(key) == [entry(5), entry(6)]
        finally:
            a.close()
            b.close()


async def test_a_following_importer_and_the_store_write_each_line_once(
        daemon: Daemon, short_dir: str) -> None:
    """`import --follow` holds what it knows of a session; the store mirrors a line to it
    meanwhile; the CLI's file then gets that line: the follower does not store it again."""
    from sessiond import Client
    from sessiond.importers.transcripts import TranscriptImporter

    folder = os.path.join(short_dir, "projects", PROJECT)
    os.makedirs(folder)
    path = os.path.join(folder, f"{SID}.jsonl")
    entries = lines_of(os.path.join(FIXTURES, PROJECT, f"{SID}.jsonl"))
    with open(path, "w") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries[:3])
    with Client(daemon.socket) as sync:
        follower = TranscriptImporter(sync, "claude-code")
        first = await anyio.to_thread.run_sync(lambda: follower.sync(path, final=False))
        assert first.error is None and first.appended == 3
        store = SessiondSessionStore(socket=daemon.socket)
        try:
            await store.append({"project_key": PROJECT, "session_id": SID},
                               entries[3:5])  # type: ignore[arg-type]
            with open(path, "a") as f:
                f.writelines(json.dumps(e) + "\n" for e in entries[3:])
            again = await anyio.to_thread.run_sync(lambda: follower.sync(path, final=False))
            assert again.error is None and again.appended == len(entries) - 5
            loaded = await store.load({"project_key": PROJECT, "session_id": SID})
        finally:
            store.close()
            follower.close()
    assert loaded == entries
