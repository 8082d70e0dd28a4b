"""The Claude Code and Codex importers turn the CLIs' compaction records into compactions
(issue 48): Claude Code's `compact_boundary` system line and the `isCompactSummary` user
line after it, Codex's `compacted` line (its `replacement_history`), each a
session.compacted in the same write as its line, so the imported session's context is
the summary and what came after. The fixtures are the CLIs' record shapes."""

from __future__ import annotations

import os
import shutil

import pytest
from conftest import Daemon
from test_importers import import_json, jsonl

from sessiond import AsyncClient

pytestmark = [pytest.mark.anyio, pytest.mark.slow_on_postgresql]
FIXTURES = os.path.join(os.path.dirname(__file__), "fixtures", "compaction")
CC_SID = "9a8b7c6d-5e4f-4a3b-8c2d-1e0f9a8b7c6d"
CODEX_SID = "019c2b3a-4d5e-7f60-8a9b-0c1d2e3f4a5b"


async def context_of(client: AsyncClient, sid: str) -> tuple[object, list[str], list[str]]:
    ctx = await client.context(sid)
    return ctx.compaction, [m.content for m in ctx.summary], [m.content for m in ctx.messages]


class TestImporters:
    @pytest.mark.parametrize("follow", [False, True])
    async def test_claude_code_compact_boundary(self, daemon: Daemon, client: AsyncClient,
                                                short_dir: str, follow: bool) -> None:
        """Imported whole (one document) or line by line (a session that exists: each
        line an events.append, as --follow writes them): the history stays whole, and
        the context is the summary line, then the turn after it."""
        root = os.path.join(short_dir, "projects")
        shutil.copytree(os.path.join(FIXTURES, "claude-code", "projects"), root)
        path = os.path.join(root, "-home-dev-app", f"{CC_SID}.jsonl")
        lines = jsonl(path)
        if follow:  # the session exists with its first line: the rest are appended
            with open(path) as f:
                whole = f.read()
            with open(path, "w") as f:
                f.write(whole.splitlines(keepends=True)[0])
            assert (await import_json(daemon, "--format", "claude-code", root))[0] == 0
            with open(path, "w") as f:
                f.write(whole)
        code, out = await import_json(daemon, "--format", "claude-code", root)
        assert code == 0 and out["failed"] == []
        assert (await client.get_session(CC_SID)).message_count == 6  # nothing cut
        compaction, summary, after = await context_of(client, CC_SID)
        assert compaction is not None and compaction.by == "claude-code"  # type: ignore[attr-defined]
        assert compaction.reason == "manual" and compaction.through_sequence == 3  # type: ignore[attr-defined]
        assert summary == [lines[3]["message"]["content"]]
        assert after == ["Now add a test for load_settings.", "Added tests/test_settings.py."]
        assert (await client.verify()).ok

    async def test_codex_compacted(self, daemon: Daemon, client: AsyncClient,
                                   short_dir: str) -> None:
        """Codex's compacted line: its replacement_history is the summary, standing for
        the messages before it; the turn after it is the context's messages."""
        root = os.path.join(short_dir, "sessions")
        shutil.copytree(os.path.join(FIXTURES, "codex", "sessions"), root)
        code, out = await import_json(daemon, "--format", "codex", root)
        assert code == 0 and out["failed"] == []
        compaction, summary, after = await context_of(client, CODEX_SID)
        assert compaction is not None and compaction.by == "codex"  # type: ignore[attr-defined]
        assert compaction.through_sequence == 1  # type: ignore[attr-defined]
        assert summary[0] == "Why is --verbose ignored?" and "summary produced" in summary[1]
        assert after == ["Fix it.", "Moved the logger setup before parse_args()."]
        assert len((await client.list_messages(CODEX_SID)).messages) == 4
        assert (await client.verify()).ok
