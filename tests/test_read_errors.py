"""A read the database cannot answer is the same error on both stores: -32012, saying it
was a read (never "nothing was written", which is about writes), and the daemon goes on."""

from __future__ import annotations

import sqlite3

import pg
import pytest
from conftest import Daemon

from sessiond import AsyncClient, StorageError

pytestmark = pytest.mark.anyio


def _ddl(daemon: Daemon, sql: str) -> None:
    """Change the schema behind the daemon's back (a table gone, as a damaged file or an
    operator's mistake would leave it)."""
    if daemon.db.startswith("postgres"):
        pg.query(daemon.db, sql)
        return
    con = sqlite3.connect(daemon.db, isolation_level=None)
    try:
        con.execute(sql)
    finally:
        con.close()


async def test_a_failed_read_is_32012_and_says_it_was_a_read(client: AsyncClient,
                                                             daemon: Daemon) -> None:
    await client.create_session("r")
    await client.append_message("r", "user", "hello")
    _ddl(daemon, "ALTER TABLE messages RENAME TO messages_away")
    try:
        with pytest.raises(StorageError) as err:
            await client.list_messages("r")
        assert err.value.code == -32012
        assert "while reading" in err.value.message and "messages" in err.value.message
        assert "nothing was written" not in err.value.message
        assert err.value.data["read"] is True and err.value.data["detail"]
        assert (await client.get_session("r")).message_count == 1  # other reads go on
    finally:
        _ddl(daemon, "ALTER TABLE messages_away RENAME TO messages")
    assert [m.content for m in (await client.list_messages("r")).messages] == ["hello"]
