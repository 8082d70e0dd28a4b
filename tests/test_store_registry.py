"""The store registry (stores/registry.py): which store a `db` setting names, what it needs
before it opens, and what it can do once open, asked by capability, never by engine."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pg
import pytest

from sessiond_daemon.serve import lifecycle, migrate
from sessiond_daemon.serve.config import ConfigError, load
from sessiond_daemon.stores import registry
from sessiond_daemon.stores.interface import Store

pytestmark = pytest.mark.anyio


@pytest.fixture
def pg_url() -> Iterator[str]:
    yield from pg.database()


def test_a_setting_names_one_kind_of_store() -> None:
    for url in ("postgresql://u@db/s", "postgres://db:5432/s"):
        kind = registry.kind_of(url)
        assert not kind.needs_file_lock and kind.exists(url)
    for path in ("/var/lib/sessiond/sessiond.db", "relative.db", "postgresql.db"):
        assert registry.kind_of(path).needs_file_lock
    assert not registry.kind_of("/no/such/dir/sessiond.db").exists("/no/such/dir/sessiond.db")


def test_a_url_that_cannot_work_is_refused_before_anything_opens(tmp_path: Path) -> None:
    with pytest.raises(registry.StoreUrlError, match="holds a password"):
        registry.check("postgresql://u:hunter2@db/s")
    with pytest.raises(registry.StoreUrlError, match="cannot read the database password"):
        registry.open_store("postgresql://u@db/s",
                            registry.Options(password_file=str(tmp_path / "missing")))
    # The same refusal, said by each place that chooses a store.
    with pytest.raises(ConfigError, match="names no database"):
        load(None, {"db": "postgresql://db:5432/"}, {"HOME": str(tmp_path)})
    with pytest.raises(migrate.MigrateError, match="names no database"):
        migrate.open_store("postgresql://db:5432/", None)
    registry.check(str(tmp_path / "new.db"))  # a file that does not exist yet is fine


async def _capabilities(store: Store) -> None:
    await store.open()
    try:
        caps = store.capabilities
        assert caps.size is not None and await caps.size.db_bytes() > 0
    finally:
        await store.close()


async def test_the_daemon_s_store_is_the_registry_s(short_dir: str) -> None:
    """lifecycle.default_store (the daemon), migrate.open_store and open_store give the
    same kind of store for a setting: the file alone has a file lock, an integrity check,
    a file backup and a full-text index, and follows no shared log."""
    path = os.path.join(short_dir, "s.db")
    config = load(None, {"db": path, "socket": os.path.join(short_dir, "s.sock")}, env={})
    for store in (lifecycle.default_store(config), migrate.open_store(path, None),
                  registry.open_store(path)):
        caps = store.capabilities
        assert caps.shared_log is None and not caps.shared
        assert None not in (caps.integrity, caps.backup, caps.full_text, caps.size)
        await _capabilities(store)


@pytest.mark.postgresql
async def test_the_shared_store_is_the_registry_s(short_dir: str, pg_url: str) -> None:
    """The same for a PostgreSQL URL: shared, its log followed, a size but no cap, no
    file to check or copy."""
    config = load(None, {"db": pg_url, "socket": os.path.join(short_dir, "s.sock")}, env={})
    for store in (lifecycle.default_store(config), migrate.open_store(pg_url, None),
                  registry.open_store(pg_url)):
        caps = store.capabilities
        assert caps.shared and caps.shared_log is not None
        assert caps.integrity is caps.backup is None
        assert caps.size is not None and caps.size.max_bytes == 0  # no cap, but a size
        await _capabilities(store)
