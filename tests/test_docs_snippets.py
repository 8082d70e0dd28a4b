"""The docs run: every shell and Python snippet in README.md and docs/**/*.md, against a
real daemon on a temporary socket.

A fenced block tagged `sh`, `bash`, `console`, `python` or `py` is one test, named by its
file and the line of its opening fence (`README.md:39`). The line right before the fence
may be `<!-- not run: REASON -->`: the test is then a skip with that reason (a model
call, a remote host, a command that runs until stopped). Other tags (`toml`, `ini`,
`json`, `text`, ...) are not snippets.

Each block is self-contained, as a reader copies one: it runs alone, on a fresh daemon
(SQLite, the default store) whose socket is in `SESSIOND_SOCKET`, in an empty temporary
directory that is also `$HOME` (so `~/x` stays in it), with `sessionctl`, `sessiond` and
`python` on PATH being this test run's interpreter. A block that uses `$id` makes it.
Shell blocks run under `bash` with `set -euo pipefail`; in a `console` block the lines
starting with `$ ` are the commands (the rest is their output, not compared). Python
blocks run as a script with the same interpreter.
"""

from __future__ import annotations

import importlib.util
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

import anyio
import pytest
from conftest import Daemon

ROOT = Path(__file__).parent.parent
RUN_TAGS = frozenset({"sh", "bash", "console", "python", "py"})
NOT_RUN = re.compile(r"^<!-- not run: (?P<reason>\S.*?) -->$")
FENCE = re.compile(r"^(?P<indent> *)(?P<fence>`{3,}|~{3,})\s*(?P<tag>[^\s`]*)")
# The extra that brings a package a snippet may need (README.md: the extras).
EXTRAS = {"agents": "openai-agents", "google": "adk", "langgraph": "langgraph",
          "claude_agent_sdk": "claude-agent-sdk", "mcp": "mcp"}
OURS = ("sessiond", "sessiond_daemon", "sessiond_schemas")
NO_MODULE = re.compile(r"^ModuleNotFoundError: No module named '(?P<name>[\w.]+)'$", re.M)
# A guard against a snippet that never ends (an unmarked `watch`): it fails, naming the
# snippet, instead of hanging the run. Not a bound under test.
GUARD_S = 300

pytestmark = [pytest.mark.anyio,
              pytest.mark.sqlite_only("the docs' snippets run on the store a user gets by "
                                      "default; the API's own tests run on both")]


@dataclass(frozen=True)
class Snippet:
    path: Path
    line: int  # of the opening fence, 1-based
    tag: str
    code: str
    not_run: str | None  # the reason, when marked

    @property
    def name(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def doc_files() -> list[Path]:
    """README.md and every Markdown file under docs/."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def fenced_blocks(path: Path) -> list[Snippet]:
    """Every fenced block of `path`, whatever its tag, with the mark before it if any."""
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks: list[Snippet] = []
    i = 0
    while i < len(lines):
        opening = FENCE.match(lines[i])
        if opening is None:
            i += 1
            continue
        indent, fence = len(opening["indent"]), opening["fence"]
        body: list[str] = []
        j = i + 1
        while j < len(lines) and not (lines[j].strip().startswith(fence)
                                      and lines[j].strip().strip(fence[0]) == ""):
            body.append(lines[j][indent:] if lines[j][:indent].strip() == "" else lines[j])
            j += 1
        mark = NOT_RUN.match(lines[i - 1].strip()) if i > 0 else None
        blocks.append(Snippet(path, i + 1, opening["tag"].lower(), "\n".join(body) + "\n",
                              mark["reason"] if mark else None))
        i = j + 1
    return blocks


def snippets() -> list[Snippet]:
    return [b for path in doc_files() for b in fenced_blocks(path) if b.tag in RUN_TAGS]


def console_commands(code: str) -> str:
    """The commands of a console transcript: `$ ` lines and their `\\` continuations."""
    commands: list[str] = []
    continued = False
    for line in code.splitlines():
        if continued or line.startswith("$ "):
            commands.append(line if continued else line[2:])
            continued = line.endswith("\\")
    return "\n".join(commands) + "\n"


def missing_package(stderr: str) -> str | None:
    """The package a failed snippet could not import, if it is one this interpreter does
    not have (an SDK that `[test]` does not install); never one of sessiond's own."""
    found = NO_MODULE.findall(stderr)
    if not found or found[-1].split(".")[0] in OURS:
        return None
    name: str = found[-1]
    try:
        return name if importlib.util.find_spec(name) is None else None
    except ModuleNotFoundError:  # its parent package is missing too
        return name


def tools(directory: Path) -> Path:
    """A bin directory whose sessionctl, sessiond and python are this interpreter's."""
    bin_dir = directory / ".bin"
    bin_dir.mkdir()
    for name, run in (("python", ""), ("python3", ""), ("sessionctl", " -m sessiond.cli"),
                      ("sessiond", " -m sessiond_daemon")):
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\nexec "{sys.executable}"{run} "$@"\n')
        tool.chmod(0o755)
    return bin_dir


def snippet_env(directory: Path, socket: str) -> dict[str, str]:
    """The environment a snippet runs in: the daemon's socket, a private home."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SESSIOND_") or k.startswith("SESSIOND_REQUIRE")}
    # The worktree's code, by absolute paths (the run's own PYTHONPATH may be relative).
    code = [str(ROOT / p) for p in ("client", "daemon", "schemas")]
    inherited = [str(Path(p).resolve()) for p in env.get("PYTHONPATH", "").split(":") if p]
    env.update({
        "SESSIOND_SOCKET": socket, "HOME": str(directory),
        "XDG_STATE_HOME": str(directory / ".local/state"),
        "XDG_CONFIG_HOME": str(directory / ".config"),
        "PATH": f"{tools(directory)}:{env.get('PATH', '/usr/bin:/bin')}",
        "PYTHONPATH": ":".join([*code, *inherited]),
        "NO_COLOR": "1", "COLUMNS": "100",
    })
    return env


def test_snippets_are_found() -> None:
    """The collector sees the README's snippets (a parser gone wrong runs nothing)."""
    found = snippets()
    readme = [s for s in found if s.path.name == "README.md"]
    assert len(readme) >= 4 and any(s.tag == "python" for s in readme)
    assert {s.path.name for s in found} >= {"README.md", "upgrading.md", "fleet.md"}


def test_every_mark_precedes_a_snippet() -> None:
    """A `not run` mark stands on the line right before the fence of a run snippet; one
    anywhere else (a blank line between, or before a `toml` block) would skip nothing."""
    for path in doc_files():
        lines = path.read_text(encoding="utf-8").splitlines()
        blocks = {b.line: b for b in fenced_blocks(path)}
        for n, line in enumerate(lines, start=1):
            if line.strip().startswith("<!-- not run"):
                where = f"{path.relative_to(ROOT)}:{n}"
                assert NOT_RUN.match(line.strip()), f"{where}: write <!-- not run: REASON -->"
                block = blocks.get(n + 1)
                assert block is not None, f"{where}: the mark is not right before a fence"
                assert block.tag in RUN_TAGS, f"{where}: a `{block.tag}` block is never run"


def test_fence_parsing(tmp_path: Path) -> None:
    """Tags, marks, indented fences and console transcripts are read as meant."""
    doc = tmp_path / "d.md"
    doc.write_text("text\n<!-- not run: a model call -->\n```sh\nrun me\n```\n\n"
                   "- item\n\n  ```python\n  print(1)\n  ```\n```toml\na = 1\n```\n")
    blocks = fenced_blocks(doc)
    assert [(b.line, b.tag, b.code, b.not_run) for b in blocks] == [
        (3, "sh", "run me\n", "a model call"), (9, "python", "print(1)\n", None),
        (12, "toml", "a = 1\n", None)]
    assert console_commands("$ a \\\n  b\nout\n$ c\n") == "a \\\n  b\nc\n"


def test_missing_package() -> None:
    """A snippet that failed on an import this interpreter cannot make is told apart from
    one that failed otherwise, or on a module of sessiond's own (a rename is a failure)."""
    trace = "Traceback ...\nModuleNotFoundError: No module named '{}'\n"
    assert missing_package(trace.format("no_such_sdk.sub")) == "no_such_sdk.sub"
    assert missing_package(trace.format("json.no_such_module")) == "json.no_such_module"
    assert missing_package(trace.format("sessiond.no_such_module")) is None
    assert missing_package(trace.format("json")) is None  # there: the failure is elsewhere
    assert missing_package("ValueError: no_such_sdk\n") is None


@pytest.mark.parametrize("snippet", snippets(), ids=lambda s: s.name)
async def test_snippet_runs(snippet: Snippet, daemon: Daemon, tmp_path: Path) -> None:
    """The snippet exits 0 against a fresh daemon (or is skipped with its mark's reason)."""
    if snippet.not_run is not None:
        pytest.skip(f"{snippet.name}: not run: {snippet.not_run}")
    work = tmp_path / "work"
    work.mkdir()
    env = snippet_env(work, daemon.socket)
    if snippet.tag in ("python", "py"):
        script = work / "snippet.py"
        script.write_text(snippet.code)
        argv = [sys.executable, str(script)]
    else:
        code = console_commands(snippet.code) if snippet.tag == "console" else snippet.code
        script = work / "snippet.sh"
        script.write_text("set -euo pipefail\n" + code)
        argv = ["bash", str(script)]
    with anyio.fail_after(GUARD_S):
        done = await anyio.run_process(argv, cwd=work, env=env, check=False)
    out, err = done.stdout.decode(errors="replace"), done.stderr.decode(errors="replace")
    # A snippet of an SDK's integration skips where the SDK is not installed, as the SDK
    # tests do; where .ci/run installed them all (SESSIOND_REQUIRE_SDKS), it fails.
    missing = None if done.returncode == 0 else missing_package(err)
    if missing and not os.environ.get("SESSIOND_REQUIRE_SDKS"):
        extra = EXTRAS.get(missing.split(".")[0], missing)
        pytest.skip(f"{snippet.name}: needs {missing}: pip install -e '.[{extra}]' to run it")
    assert done.returncode == 0, (
        f"{snippet.name} ({snippet.tag}) exited {done.returncode}\n--- snippet\n"
        f"{snippet.code}--- stdout\n{out[-3000:]}--- stderr\n{err[-3000:]}")
