"""Tests of the SDK integrations skip when the SDK is not installed, except in CI.

.ci/run installs every extra and sets SESSIOND_REQUIRE_SDKS=1, so there a missing SDK fails
the run instead of skipping its tests.
"""

from __future__ import annotations

import importlib
import os
from types import ModuleType

import pytest


def require_sdk(module: str, extra: str) -> ModuleType:
    if os.environ.get("SESSIOND_REQUIRE_SDKS"):
        return importlib.import_module(module)
    return pytest.importorskip(module, reason=f"pip install -e '.[{extra}]' to test it")
