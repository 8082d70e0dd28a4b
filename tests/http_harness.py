"""The Node side of the HTTP tests: the Durable Streams server conformance suite, the
protocol's reference Node server and the official TypeScript client, all pinned in
tests/http/conformance/ (package.json and its lock; installed with `npm ci`).

Node and npm are needed only here, never to install or run sessiond. With no `node`
(20 or newer) or `npm` on PATH the tests that need them skip, unless
SESSIOND_REQUIRE_NODE=1 (as .ci/run sets), where they fail.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tempfile
import threading
import tomllib
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest

NODE_DIR = Path(__file__).resolve().parent / "http" / "conformance"
REQUIRED = os.environ.get("SESSIOND_REQUIRE_NODE") == "1"
MIN_NODE = 20
# A guard against a hung suite (never a bound under test): the whole suite takes about
# 40 s against the reference server with its long-poll timeout at 5 s.
SUITE_PATIENCE_S = 900
# The reference server holds a long-poll this long before its 204; two tests of the
# suite wait that out. Its default is 30 s; 5 s keeps a run of the suite near 40 s.
REFERENCE_LONG_POLL_MS = 5000


def _unavailable(why: str) -> None:
    if REQUIRED:
        pytest.fail(f"Node is required (SESSIOND_REQUIRE_NODE=1): {why}")
    pytest.skip(f"{why}; the HTTP conformance and TypeScript client tests need Node "
                f"{MIN_NODE}+ and npm (set SESSIOND_REQUIRE_NODE=1 to fail instead)")


def node() -> str:
    """The `node` executable, after checking it and npm are there and the pinned packages
    are installed (`npm ci` when node_modules is missing or older than the lock)."""
    exe, npm = shutil.which("node"), shutil.which("npm")
    if exe is None or npm is None:
        _unavailable("no `node` or `npm` on PATH")
        raise AssertionError("unreachable")
    version = subprocess.run([exe, "--version"], capture_output=True, text=True,
                             check=True).stdout.strip()
    if int(version.lstrip("v").split(".")[0]) < MIN_NODE:
        _unavailable(f"node {version} is older than {MIN_NODE}")
    installed = NODE_DIR / "node_modules" / ".package-lock.json"
    lock = NODE_DIR / "package-lock.json"
    if not installed.exists() or installed.stat().st_mtime < lock.stat().st_mtime:
        done = subprocess.run([npm, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
                              cwd=NODE_DIR, capture_output=True, text=True)
        if done.returncode != 0:
            raise AssertionError(f"npm ci in {NODE_DIR} failed:\n{done.stderr[-4000:]}")
    return exe


def _drain(stream: IO[str], into: list[str]) -> None:
    for line in stream:
        into.append(line)


@contextmanager
def reference_server(exe: str, data_dir: str) -> Iterator[str]:
    """The protocol's reference Node server, file storage in `data_dir`, on a free
    loopback port for the block; yields its base URL."""
    proc = subprocess.Popen(
        [exe, "ref-server.mjs", data_dir, str(REFERENCE_LONG_POLL_MS)], cwd=NODE_DIR,
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None and proc.stdin is not None
    output: list[str] = []
    drain: threading.Thread | None = None
    try:
        for line in proc.stdout:  # its log lines, then its URL
            output.append(line)
            if line.startswith("http://"):
                break
        else:
            raise AssertionError(f"the reference server exited {proc.wait()}:\n"
                                 + "".join(output))
        drain = threading.Thread(target=_drain, args=(proc.stdout, output), daemon=True)
        drain.start()
        yield line.strip()
    finally:
        proc.stdin.close()  # it stops when its stdin ends
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if drain is not None:
            drain.join()
        proc.stdout.close()


# The section of the protocol (PROTOCOL.md of github.com/durable-streams/durable-streams)
# each top-level `describe` of the suite covers.
SPEC_SECTIONS = {
    "Basic Stream Operations": "5.1 Create Stream, 5.4 Delete Stream",
    "Append Operations": "5.2 Append to Stream",
    "Read Operations": "5.6 Read Stream - Catch-up",
    "Long-Poll Operations": "5.7 Read Stream - Live (Long-poll)",
    "Long-Poll Edge Cases": "5.7 Read Stream - Live (Long-poll)",
    "HTTP Protocol": "5 HTTP Operations",
    "TTL Expiration Behavior": "4 Stream Model (TTL/Expiry), 5.1 Stream-TTL/Stream-Expires-At",
    "TTL and Expiry Edge Cases": "5.1 Stream-TTL/Stream-Expires-At",
    "TTL and Expiry Validation": "5.1 Stream-TTL/Stream-Expires-At",
    "Case-Insensitivity": "5.1 Create Stream, 9 Content Types",
    "Content-Type Validation": "9 Content Types, 12.4 Content Type Validation",
    "HEAD Metadata": "5.5 Stream Metadata",
    "HEAD Metadata Edge Cases": "5.5 Stream Metadata",
    "Offset Validation and Resumability": "8 Offsets",
    "Protocol Edge Cases": "5 HTTP Operations",
    "Idempotent Producer Operations": "5.2.1 Idempotent Producers",
    "JSON Mode": "9.1 JSON Mode",
    "SSE Mode": "5.8 Read Stream - Live (SSE)",
    "Read-Your-Writes Consistency": "5.2 Append, 5.6 Read Stream - Catch-up",
    "Caching and ETag": "10.1 Catch-up and Long-poll Reads (caching, ETag)",
    "Chunking and Large Payloads": "5.6 Read Stream - Catch-up",
    "Browser Security Headers": "12.7 Browser Security Headers",
    "Property-Based Tests (fast-check)": "8 Offsets, 5.6 Catch-up (byte-exactness)",
    "Stream Closure": "4.1 Stream Closure, 5.3 Close Stream",
    "Reserved subscription APIs": "6 Reserved Subscription APIs, 7 Subscription Delivery",
}


def spec_section(full_name: str, group: str) -> str:
    if group.startswith("Fork"):
        return "4.2 Stream forking"
    return SPEC_SECTIONS.get(group, "(not mapped: see the suite's test)")


@dataclass(frozen=True)
class Test:
    name: str  # the full name: the describe titles and the test's, joined by spaces
    group: str  # the top-level describe
    status: str  # passed, failed, skipped (vitest's "pending" and "todo" count as skipped)
    failure: str  # the first line of its first failure message, if it failed

    @property
    def section(self) -> str:
        return spec_section(self.name, self.group)


@dataclass(frozen=True)
class SuiteRun:
    target: str
    tests: dict[str, Test]

    def names(self, status: str) -> set[str]:
        return {name for name, test in self.tests.items() if test.status == status}

    def counts(self) -> Counter[str]:
        return Counter(test.status for test in self.tests.values())

    def summary(self) -> str:
        c = self.counts()
        return (f"{self.target}: {len(self.tests)} tests, {c['passed']} passed, "
                f"{c['failed']} failed, {c['skipped']} skipped")


def redact(text: str) -> str:
    """`text` without capability tokens (a URL's /t/<token>/ prefix)."""
    return re.sub(r"/t/[^/\s]+/", "/t/<token>/", text)


def parse_report(target: str, report: dict[str, object]) -> SuiteRun:
    """The tests of vitest's JSON reporter output (`--reporter=json`)."""
    tests: dict[str, Test] = {}
    files = report["testResults"]
    assert isinstance(files, list)
    for file in files:
        for a in file["assertionResults"]:
            status = {"pending": "skipped", "todo": "skipped"}.get(a["status"], a["status"])
            messages = a.get("failureMessages") or [""]
            group = a["ancestorTitles"][0] if a["ancestorTitles"] else a["title"]
            name = a["fullName"]
            assert name not in tests, f"two tests named {name!r} in the suite"
            tests[name] = Test(name, group, status,
                               redact(messages[0].strip().split("\n")[0]))
    return SuiteRun(target, tests)


def run_suite(exe: str, target: str, base_url: str) -> SuiteRun:
    """Run the whole conformance suite against `base_url` under vitest (the suite's own
    CLI finds no tests from node_modules) and return its results."""
    with tempfile.TemporaryDirectory(prefix="sd-vitest-") as out:
        report_path = os.path.join(out, "report.json")
        env = {**os.environ, "CONFORMANCE_TEST_URL": base_url, "NO_COLOR": "1"}
        done = subprocess.run(
            [exe, str(NODE_DIR / "node_modules" / "vitest" / "vitest.mjs"), "run",
             "--reporter=json", f"--outputFile={report_path}"],
            cwd=NODE_DIR, env=env, capture_output=True, text=True, timeout=SUITE_PATIENCE_S)
        # vitest exits 1 when a test fails: the report says which
        if not os.path.exists(report_path):
            raise AssertionError(f"vitest against {base_url} wrote no report (exit "
                                 f"{done.returncode}):\n{done.stdout[-3000:]}"
                                 f"\n{done.stderr[-3000:]}")
        with open(report_path) as f:
            run = parse_report(target, json.load(f))
    if not run.tests:
        raise AssertionError(f"vitest ran no conformance tests against {base_url}")
    return run


def allowed() -> dict[str, str]:
    """tests/http/differences.toml: the tests sessiond may fail though the reference
    passes, and why it differs."""
    with open(NODE_DIR.parent / "differences.toml", "rb") as f:
        table: dict[str, str] = tomllib.load(f).get("differences", {})
    return table


def differences(reference: SuiteRun, other: SuiteRun, allowed: dict[str, str]) -> str:
    """The tests `reference` passes and `other` does not, but those `allowed`, one a
    line, with the spec section each covers."""
    lines = []
    for name in sorted(reference.names("passed") - other.names("passed") - set(allowed)):
        test = other.tests.get(name)
        status = test.status if test else "missing"
        why = f": {test.failure}" if test and test.failure else ""
        lines.append(f"- [{spec_section(name, test.group if test else '')}] {name} "
                     f"({status}){why}")
    return "\n".join(lines)


def tables(reports: Path) -> str:
    """The figures section of tests/http/CONFORMANCE.md from a run's reports (the JSON
    files tests/test_http_conformance.py keeps, one a target):

        python tests/http_harness.py [DIR]   # default: $TMPDIR/sessiond-conformance
    """
    runs: dict[str, dict[str, dict[str, str]]] = {}
    for path in sorted(reports.glob("*.json")):
        runs[path.stem.replace("-", " ")] = json.loads(path.read_text())
    out = ["| target | tests | passed | failed | skipped |", "| --- | --- | --- | --- | --- |"]
    for target, tests in runs.items():
        c = Counter(t["status"] for t in tests.values())
        out.append(f"| {target} | {len(tests)} | {c['passed']} | {c['failed']} | "
                   f"{c['skipped']} |")
    reference = runs.get("reference", {})
    passed = {n for n, t in reference.items() if t["status"] == "passed"}
    others = {target: tests for target, tests in runs.items() if target != "reference"}
    for title, keep in (("fails, the reference passes", lambda t: t["status"] != "passed"),
                        ("passes, the reference does not", lambda t: t["status"] == "passed")):
        which: dict[str, list[str]] = {}
        for target, tests in others.items():
            for name, t in tests.items():
                if keep(t) and (name in passed) == title.startswith("fails"):
                    which.setdefault(name, []).append(target.removeprefix("sessiond "))
        counts = ", ".join(f"{sum(target.removeprefix('sessiond ') in w for w in which.values())}"
                           f" on {target.removeprefix('sessiond ')}" for target in others)
        out += ["", f"### sessiond {title} ({counts})", ""]
        for name in sorted(which, key=lambda n: (reference[n]["section"] if n in reference
                                                 else "", n)):
            t = next(tests[name] for tests in others.values() if name in tests)
            failure = redact(t["failure"])[:160] if title.startswith("fails") else ""
            why = f": `{failure}`" if failure else ""
            stores = "" if len(which[name]) == len(others) else f" [{', '.join(which[name])} only]"
            out.append(f"- §{t['section']}: {name}{stores}{why}")
    if reference:
        out += ["", "### The reference server's own (not passed)", ""]
        for name, t in sorted(reference.items(), key=lambda kv: (kv[1]["section"], kv[0])):
            if t["status"] != "passed":
                why = f": `{t['failure'][:160]}`" if t["failure"] else ""
                out.append(f"- §{t['section']}: {name} ({t['status']}){why}")
    return "\n".join(out)


if __name__ == "__main__":
    import sys

    print(tables(Path(sys.argv[1] if len(sys.argv) > 1
                      else Path(tempfile.gettempdir(), "sessiond-conformance"))))
