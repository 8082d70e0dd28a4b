"""The database file deleted or replaced under the daemon (SQLite): no write is
acknowledged from then on, a keyed retry included (docs/reliability.md)."""

from __future__ import annotations

import os

import pytest
from conftest import daemon_config, running_daemon

from sessiond import AsyncClient
from sessiond_schemas.errors import StorageError

pytestmark = pytest.mark.anyio


class TestKeyedRetryAfterTheFileIsGone:
    @pytest.mark.parametrize("how", ["deleted", "replaced"])
    async def test_a_keyed_retry_is_refused_not_acknowledged(self, short_dir: str,
                                                             how: str) -> None:
        """A keyed write after the file went lands in the old file and is refused; its
        retry under the same key is refused too (never answered from the lost file), and
        so is the retry of a key stored before the file went."""
        config = daemon_config(short_dir)
        db = config.db
        assert db is not None
        async with running_daemon(config) as d, AsyncClient(d.socket) as client:
            await client.create_session("s")
            first = await client.append_message("s", role="user", content="kept",
                                                idempotency_key="before")
            if how == "deleted":
                os.unlink(db)
            else:
                os.rename(db, db + ".aside")
                with open(db + ".aside", "rb") as src, open(db, "wb") as dst:
                    dst.write(src.read())
            with pytest.raises(StorageError) as refused:
                await client.append_message("s", role="user", content="lost",
                                            idempotency_key="after")
            assert how in refused.value.data["detail"]
            for key in ("after", "after", "before"):
                with pytest.raises(StorageError) as again:
                    await client.append_message("s", role="user", content="lost",
                                                idempotency_key=key)
                assert again.value.code == -32012 and again.value.data["path"] == db
            assert first.version == 2
            assert (await client.ping()).pong  # it serves on; it only stops acknowledging
