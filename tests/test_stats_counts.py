"""daemon.stats' stored figures, on both stores: `events` counts the events stored (a
fork's versions up to its fork point are its source's, stored once), and `db_bytes` is
what the store takes (the SQLite file and its WAL; PostgreSQL's tables)."""

from __future__ import annotations

import secrets

import pytest
from conftest import Daemon, daemon_config, running_daemon
from faulty_store import FaultyStore, faulty

from sessiond import AsyncClient, StorageError

pytestmark = pytest.mark.anyio


async def test_events_counts_what_is_stored_not_what_forks_inherit(
        client: AsyncClient, daemon: Daemon) -> None:
    await client.create_session("src")
    await client.append_messages("src", [{"role": "user", "content": f"m{i}"}
                                         for i in range(9)])  # src at version 10
    fork = await client.fork("src", at_version=10, new_session_id="f1")
    await client.append_message(fork.session_id, "user", "mine")
    again = await client.fork(fork.session_id, new_session_id="f2")  # a fork of a fork
    await client.append_message(again.session_id, "user", "mine too")
    stored = daemon.sql("SELECT COUNT(*) FROM events")[0][0]
    versions = daemon.sql("SELECT SUM(version) FROM sessions")[0][0]
    assert versions > stored  # the forks' inherited versions (12 + 14 of them)
    stats = await client.stats()
    assert (stats.sessions, stats.events) == (3, stored)
    await client.delete_session(again.session_id)
    stats = await client.stats()
    assert (stats.sessions, stats.events) == (2, daemon.sql("SELECT COUNT(*) FROM events")[0][0])


async def test_db_bytes_is_what_the_store_takes(client: AsyncClient, daemon: Daemon) -> None:
    before = (await client.stats()).db_bytes
    assert before > 0
    await client.create_session("big")
    for _ in range(8):
        # Random text: PostgreSQL compresses what repeats (TOAST).
        await client.append_message("big", "user", secrets.token_urlsafe(150_000))
    assert (await client.stats()).db_bytes >= before + 1_000_000


async def test_a_scrape_serves_what_needs_no_database_when_it_cannot_be_read(
        short_dir: str, db_url: str) -> None:
    """db_bytes is a read of the database on PostgreSQL: when the store cannot answer it
    (nor the totals), /metrics still serves the gauges that need no database."""
    pytest.importorskip("prometheus_client")
    from test_metrics import free_port, samples, scrape

    port = free_port()
    stores: list[FaultyStore] = []
    config = daemon_config(short_dir, db=db_url, metrics_listen=f"127.0.0.1:{port}")
    async with running_daemon(config, faulty(stores)):
        got = samples((await scrape(f"http://127.0.0.1:{port}/metrics"))[0])
        assert got[("sessiond_database_bytes", ())] > 0
        lost = StorageError("storage error while reading: connection lost", {"read": True})
        stores[0].fail_reads("db_bytes", lost)
        stores[0].fail_reads("session_totals", lost, times=3)
        got = samples((await scrape(f"http://127.0.0.1:{port}/metrics"))[0])
        assert ("sessiond_database_bytes", ()) not in got
        assert got[("sessiond_write_queue_depth", ())] == 0
