"""The client is typed: every method's result is its declared schema type, checked by mypy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy.api", reason="mypy is in the `test` extra")

ROOT = Path(__file__).parent.parent


def mypy(*args: str) -> subprocess.CompletedProcess[str]:
    """mypy --strict, configured by pyproject.toml, run from the repository's root."""
    return subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml",
                           "--no-error-summary", *args], cwd=ROOT, capture_output=True,
                          text=True, check=False)


def test_usage_file_checks_clean() -> None:
    """tests/typing/client_usage.py calls every method of Client, AsyncClient and the
    integrations' LoopClient, asserting each result's exact type: no error at all."""
    result = mypy("tests/typing/client_usage.py")
    assert result.stdout == "" and result.returncode == 0, result.stdout + result.stderr


def test_a_wrong_result_type_is_caught(tmp_path: Path) -> None:
    """The check has teeth: a result taken for another type, or an AsyncClient result
    used without await, is an error."""
    program = ("from sessiond import AsyncClient, Client\n"
               "from sessiond_schemas import rpc\n"
               "n: int = Client().ping()\n"
               "async def f(c: AsyncClient) -> None:\n"
               "    r: rpc.MessageAppendResult = c.append_message('s', 'user', 'x')\n")
    wrong = tmp_path / "wrong.py"
    wrong.write_text(program)
    result = mypy(str(wrong))
    assert result.returncode == 1
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert len(errors) == 2, result.stdout
    assert '"PingResult"' in errors[0] and '"int"' in errors[0]
    assert "Coroutine" in errors[1] and "MessageAppendResult" in errors[1]


def test_a_misspelt_keyword_is_caught() -> None:
    """Every option is a real keyword parameter, so a misspelt one or a value of the wrong
    type is an error mypy reports: tests/typing/client_misspelt.py has one on each line
    marked `# error:`, and each is reported, naming it."""
    path = "tests/typing/client_misspelt.py"
    marked = [n for n, line in enumerate((ROOT / path).read_text().splitlines(), start=1)
              if "# error:" in line]
    result = mypy(path)
    assert result.returncode == 1, result.stdout + result.stderr
    errors = [line for line in result.stdout.splitlines() if ": error:" in line]
    assert [int(e.split(":")[1]) for e in errors] == marked, result.stdout
    assert 'Unexpected keyword argument "tool_call"' in errors[0]
    assert 'Unexpected keyword argument "idempotency_kee"' in errors[1]
    assert 'Unexpected keyword argument "expected_verison"' in errors[2]
    assert 'Argument 2' in errors[3] and "'paused'" in errors[3]
    assert 'Argument "input_tokens"' in errors[4] and '"int | None"' in errors[4]
