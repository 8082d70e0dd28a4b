"""A delete through one host ends the live subscriptions to that session on every host.

A delete leaves no event in the shared log; each deleted session gets a row in
`deletions`, placed in commit order, which the other daemons' followers read with the
head and ring (postgres/follow.py). Two daemons on one PostgreSQL database: a
subscriber on one follows a session deleted through the other.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import anyio
import pg
import pytest
from conftest import daemon_config, running_daemon

from sessiond import AsyncClient

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


def _host(short_dir: str, name: str, pg_url: str) -> Any:
    os.makedirs(os.path.join(short_dir, name), exist_ok=True)
    return daemon_config(os.path.join(short_dir, name), db=pg_url, host_name=name)


async def test_a_delete_on_one_host_ends_subscriptions_on_another(pg_url: str,
                                                                 short_dir: str) -> None:
    """The subscription on beta to a session deleted through alpha ends with
    subscription.dropped "session deleted" (twice: a delete alone, then one sent together
    with a write to another session); beta's subscription to another session goes on, and a
    session made again under the same id after the delete is followed anew."""
    alpha, beta = _host(short_dir, "alpha", pg_url), _host(short_dir, "beta", pg_url)
    async with (running_daemon(alpha) as a, running_daemon(beta) as b,
                AsyncClient(a.socket) as on_a, AsyncClient(b.socket) as on_b):
        for sid in ("doomed", "again", "other"):
            await on_a.create_session(sid)
        async with (on_b.subscribe("doomed", from_version=1) as doomed,
                    on_b.subscribe("again", from_version=1) as again,
                    on_b.subscribe("other", from_version=1) as other):
            for sub in (doomed, again, other):
                assert (await sub.__anext__()).type == "session.created"
            await on_a.append_message("doomed", "user", "last words")
            assert (await doomed.__anext__()).type == "message.appended"
            await on_a.delete_session("doomed")
            with anyio.fail_after(30):  # a guard against a hang, not a timing
                rest = [e async for e in doomed]
            assert rest == [] and doomed.ended is not None
            assert "session deleted" in doomed.ended
            # A delete sent together with a write to another session.
            async with anyio.create_task_group() as tg:
                tg.start_soon(on_a.delete_session, "again")
                tg.start_soon(on_a.append_message, "other", "user", "still here")
            assert (await other.__anext__()).type == "message.appended"
            with anyio.fail_after(30):
                rest = [e async for e in again]
            assert rest == [] and again.ended is not None and "session deleted" in again.ended
        # Made again under the same id: a new subscription on beta follows it, and is
        # not ended by the old delete.
        await on_a.create_session("doomed")
        async with on_b.subscribe("doomed", from_version=1) as reborn:
            assert (await reborn.__anext__()).type == "session.created"
            await on_a.append_message("doomed", "user", "new life")
            assert (await reborn.__anext__()).type == "message.appended"
            assert reborn.ended is None
