"""Issue 24, sections 2 and 4: reads built in bounded pages, work with a cost bound, and
forks that share their source's checkpoint payloads, through the real client and socket on
both stores."""

from __future__ import annotations

from collections.abc import Iterator

import pg
import pytest
from conftest import Daemon, daemon_config, running_daemon

from sessiond import AsyncClient
from sessiond_schemas.errors import InvalidTransitionError, StorageError

pytestmark = pytest.mark.anyio
BIG = "x" * (512 << 10)  # a checkpoint payload of half a MiB


def payload_bytes(daemon: Daemon) -> int:
    """The checkpoint payload bytes the store holds, every session's rows counted."""
    return int(daemon.sql("SELECT COALESCE(SUM(length(payload)), 0) FROM checkpoints")[0][0])


class TestForksShareCheckpoints:
    async def test_a_fork_stores_no_payload_and_reads_the_sources(
            self, daemon: Daemon, client: AsyncClient) -> None:
        """Forking a session with large checkpoints adds none of their bytes; the fork's
        checkpoints still read back whole, also after the source saves one again."""
        await client.create_session(session_id="src", task="t")
        for i in range(4):
            await client.save_checkpoint("src", {"i": i, "blob": BIG}, checkpoint_id=f"cp{i}")
        before = payload_bytes(daemon)
        assert before > 4 * len(BIG)
        for n in range(3):
            await client.fork("src", new_session_id=f"f{n}")
        await client.fork("f0", new_session_id="f0-0")  # a fork of a fork shares them too
        assert payload_bytes(daemon) == before  # not multiplied by the forks
        for sid in ("f0", "f1", "f2", "f0-0"):
            got = await client.get_checkpoint(sid, "cp2")
            assert got.payload == {"i": 2, "blob": BIG}
            assert (await client.get_checkpoint(sid)).payload["i"] == 3  # the latest
        # The source saves cp1 again: its old payload moves to one fork that shares it,
        # so every fork still reads the checkpoint as it was at its fork point.
        await client.save_checkpoint("src", {"i": "new"}, checkpoint_id="cp1")
        assert (await client.get_checkpoint("src", "cp1")).payload == {"i": "new"}
        for sid in ("f0", "f1", "f2", "f0-0"):
            assert (await client.get_checkpoint(sid, "cp1")).payload["i"] == 1
        # Deleting the fork that now holds it hands it on again.
        holder = daemon.sql("SELECT session_id FROM checkpoints WHERE checkpoint_id = 'cp1'"
                            " AND session_id != 'src' AND length(payload) > 0")
        assert len(holder) == 1
        if holder[0][0] != "f0":  # f0 has a fork of its own: it cannot be deleted first
            await client.delete_session(holder[0][0])
            for sid in {"f0", "f1", "f2", "f0-0"} - {holder[0][0]}:
                assert (await client.get_checkpoint(sid, "cp1")).payload["i"] == 1
        # The source is still not deletable while forks share its history.
        with pytest.raises(InvalidTransitionError):
            await client.delete_session("src")
        # An export of a fork holds its own checkpoints' payloads only; of the source, all.
        doc = await client.export_session("src")
        assert {c["checkpoint_id"] for c in doc["checkpoints"]} == {"cp0", "cp1", "cp2", "cp3"}


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


class TestPostgresStatementTimeout:
    @pytest.mark.postgresql
    async def test_a_write_behind_a_held_lock_fails_retryable_then_works(
            self, short_dir: str, pg_url: str) -> None:
        """A row locked from another connection: the write ends at db_statement_timeout_s
        with a retryable -32012 naming the setting (never acknowledged, nothing stored),
        and once the lock goes the same keyed write is acknowledged once."""
        import asyncpg

        config = daemon_config(short_dir, db=pg_url, db_statement_timeout_s=0.5)
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await client.create_session(session_id="s1", task="t")
            blocker = await asyncpg.connect(pg_url)
            try:
                tx = blocker.transaction()
                await tx.start()
                await blocker.execute("SELECT position FROM log_head FOR UPDATE")
                with pytest.raises(StorageError) as failed:
                    await client.append_message("s1", "user", "hi", idempotency_key="k1")
                assert failed.value.data["retryable"] is True
                assert failed.value.data["setting"] == "db_statement_timeout_s"
                assert "nothing was written" in failed.value.message
                assert (await client.get_session("s1")).message_count == 0
                await tx.rollback()
            finally:
                await blocker.close()
            first = await client.append_message("s1", "user", "hi", idempotency_key="k1")
            again = await client.append_message("s1", "user", "hi", idempotency_key="k1")
            assert first.sequence == again.sequence == 0
            assert (await client.get_session("s1")).message_count == 1
            assert (await client.list_messages("s1")).messages[0].content == "hi"
