"""A position is never handed out twice (docs/protocol.md, "Identifiers, versions,
positions, time"): not after the sessions holding the log's newest events were deleted,
whether the writer then takes its head from a refused commit, from a restart, or from a
backup copy. A subscriber resumes `from_position` and exports quote positions: a position
handed out again would be an event they skip, or quote for another."""

from __future__ import annotations

import os

import pytest
from conftest import daemon_config, running_daemon

from sessiond import AsyncClient
from sessiond_schemas.errors import InvalidTransitionError

pytestmark = pytest.mark.anyio


async def _newest_deleted(c: AsyncClient, session_id: str) -> int:
    """Write the log's newest events in `session_id`, delete it; return the last position."""
    await c.create_session(session_id)
    top = 0
    for i in range(5):
        top = (await c.append_message(session_id, "user", f"m{i}")).position
    assert await c.delete_session(session_id)
    return top


async def _goes_on_after(c: AsyncClient, top: int) -> int:
    """The next event's position is past `top`, and a read after `top` finds it."""
    after = await c.append_message("keep", "user", "after")
    assert after.position > top, (after.position, top)
    seen = await c.read_events(from_position=top)
    assert [e.position for e in seen.events] == [after.position]
    return after.position


async def test_refused_delete_does_not_rewind_positions(client: AsyncClient,
                                                        store_kind: str) -> None:
    """A delete refused by its HasNoForks precondition must not hand out positions again.

    SQLite answered a refused precondition with Moved(head=MAX(position) FROM events) and
    the writer set next_position = head + 1: with the newest events deleted since, the
    next write took their positions again (found by the review, branch `review`)."""
    await client.create_session("keep")
    await client.create_session("src")
    await client.append_message("src", "user", "shared")
    await client.fork("src", new_session_id="f1")
    top = await _newest_deleted(client, "gone")
    with pytest.raises(InvalidTransitionError):
        await client.delete_session("src")  # refused in the commit: f1 shares its history
    await _goes_on_after(client, top)


async def test_a_restart_does_not_reuse_the_positions_of_deleted_events(
        short_dir: str, db_url: str) -> None:
    """SQLite's head at open was MAX(position) of the stored events: after deleting the
    session holding the newest ones, the restarted daemon numbered from below them. Twice:
    the second delete of the newest events comes after a restart that found none."""
    config = daemon_config(short_dir, db=db_url)
    async with running_daemon(config) as d, AsyncClient(d.socket) as c:
        await c.create_session("keep")
        await c.append_message("keep", "user", "before")
        top = await _newest_deleted(c, "gone")
    async with running_daemon(config) as d, AsyncClient(d.socket) as c:
        assert (await c.stats()).last_position == top
        top = await _newest_deleted(c, "gone-too")
    async with running_daemon(config) as d, AsyncClient(d.socket) as c:
        assert (await c.stats()).last_position == top
        await _goes_on_after(c, top)


@pytest.mark.sqlite_only(reason="daemon.backup copies a SQLite file")
async def test_a_daemon_on_a_backup_does_not_reuse_positions(short_dir: str,
                                                             store_kind: str) -> None:
    """Restoring is starting a daemon on the copy (docs/protocol.md, daemon.backup): it
    goes on after the positions the copied database handed out, also deleted ones."""
    copy = os.path.join(short_dir, "copy.db")
    async with running_daemon(daemon_config(short_dir)) as d, AsyncClient(d.socket) as c:
        await c.create_session("keep")
        top = await _newest_deleted(c, "gone")
        await c.backup(copy)
    restored = daemon_config(short_dir, db=copy, socket=os.path.join(short_dir, "r.sock"))
    async with running_daemon(restored) as d, AsyncClient(d.socket) as c:
        await _goes_on_after(c, top)
