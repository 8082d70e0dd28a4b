"""Misspelt and mistyped client options, each of which `mypy --strict` must report
(tests/test_client_typing.py asserts the errors, one per marked line); never run.

Every client method takes its RPC's params as real keyword parameters, so an editor
completes them and a checker catches a wrong one before the daemon would."""

from __future__ import annotations

from sessiond import AsyncClient, Client


def blocking(c: Client) -> None:
    c.append_message("s", "tool", "x", tool_call="c1")  # error: tool_call_id
    c.record_tokens("s", input_tokens=1, idempotency_kee="k")  # error: idempotency_key


async def awaited(c: AsyncClient) -> None:
    await c.transition("s", "paused", expected_verison=2)  # error: expected_version
    await c.transition("s", "asleep")  # error: not a status
    await c.record_tokens("s", input_tokens="12")  # error: an int
