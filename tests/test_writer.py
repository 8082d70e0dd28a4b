"""The writer on a real database: a command that fails midway leaves no trace."""

from __future__ import annotations

import os
import sqlite3
from typing import Any

import anyio
import pytest
from sessiond_daemon.store import SqliteStore
from sessiond_daemon.writer import Command, Plan, Writer
from sessiond_schemas.errors import InternalError
from sessiond_schemas.events import EventMeta

pytestmark = pytest.mark.anyio


def creating(plan_result: Any) -> Any:
    def plan(state: Any) -> Plan:
        return Plan([("session.created", {})], plan_result)
    return plan


async def test_a_failing_command_stores_nothing_and_leaves_no_gap(short_dir: str) -> None:
    """A bug late in one command (its result) fails only that command, whole."""
    db = os.path.join(short_dir, "w.db")
    store = SqliteStore(db)
    await store.open()
    writer = Writer(store, max_queue=16, max_batch=16, cache_size=16)

    def broken(state: Any, events: Any) -> Any:
        raise RuntimeError("bug in a result builder")

    try:
        async with anyio.create_task_group() as tg:
            await tg.start(writer.run)
            bad = Command(session_id="bad", plan=creating(broken), meta=EventMeta())
            good = Command(session_id="good", plan=creating(lambda s, ev: {"ok": True}),
                           meta=EventMeta())
            outcomes: dict[str, Any] = {}

            async def submit(cmd: Command) -> None:
                try:
                    outcomes[cmd.session_id] = await writer.submit(cmd)
                except InternalError as exc:
                    outcomes[cmd.session_id] = exc

            async with anyio.create_task_group() as both:  # one batch, two commands
                both.start_soon(submit, bad)
                both.start_soon(submit, good)
            writer.close()
    finally:
        await store.close()
    assert isinstance(outcomes["bad"], InternalError) and "error_id" in outcomes["bad"].data
    assert outcomes["good"] == b'{"ok":true}'
    con = sqlite3.connect(db)
    try:
        assert con.execute("SELECT session_id, position FROM events").fetchall() == [("good", 1)]
        assert con.execute("SELECT session_id FROM sessions").fetchall() == [("good",)]
    finally:
        con.close()
