"""tests/sdk_suites.py, the SDKs' own suites as shipped in the installed packages, against a
real daemon on each store: what runs passes, and what does not run says why."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from sdk_extras import require_sdk

require_sdk("langgraph.checkpoint.conformance", "sdk-tests")
require_sdk("agents", "openai-agents")
require_sdk("google.adk", "adk")
require_sdk("claude_agent_sdk", "claude-agent-sdk")

pytestmark = pytest.mark.slow_on_postgresql

SCRIPT = Path(__file__).with_name("sdk_suites.py")


def test_the_shipped_suites_pass_or_say_why_not(db_url: str) -> None:
    run = subprocess.run([sys.executable, str(SCRIPT), "--db", db_url, "--json"],
                         capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    suites = {s["name"]: s for s in json.loads(run.stdout)}
    lg = suites["langgraph checkpoint conformance"]
    # Every capability the installed suite knows is detected and passes.
    assert lg["failed"] == 0 and lg["failures"] == {}
    assert set(lg["skipped"]) <= {"delta_channel_history"}
    from langgraph.checkpoint.conformance.capabilities import Capability
    if "delta_channel_history" in {c.value for c in Capability}:
        assert lg["detail"].get("delta_channel_history", 0) > 0  # detected, and it passes
    else:
        assert lg["passed"] == 81  # 0.0.2, the newest release
        assert "SessiondSaver overrides aget_delta_channel_history" in \
            lg["skipped"]["delta_channel_history"]
    claude = suites["claude-agent-sdk session store conformance"]
    assert (claude["passed"], claude["failed"], claude["skipped"]) == (14, 0, {}), claude
    # ADK and openai-agents ship no session tests in their wheels: skipped, with the version.
    for name, dist in (("ADK session-service tests", "google-adk"),
                       ("openai-agents session store tests", "openai-agents")):
        s = suites[name]
        assert s["detail"]["shipped_test_modules"] == [], s  # shipped: wire them here
        assert s["skipped"]["*"].startswith(f"{s['package']} ships no ")
        assert dist in s["package"]
