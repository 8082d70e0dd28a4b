"""Fleet mode's settings: a PostgreSQL URL from the flag, $SESSIOND_DB or the TOML file,
and its password only from a file or systemd's credentials (needs no server)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sessiond_daemon.serve.config import ConfigError, load
from sessiond_daemon.stores.postgres import dsn

URL = "postgresql://sessiond@db.example:5432/sessions"


def test_the_url_comes_from_the_flag_the_environment_or_the_file(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path)}
    assert load(None, {"db": URL}, env).db == URL
    assert load(None, {}, {**env, "SESSIOND_DB": URL}).db == URL
    toml = tmp_path / "sessiond.toml"
    (tmp_path / "pw").write_text("secret\n")
    toml.write_text(f'db = "{URL}"\ndb_password_file = "{tmp_path / "pw"}"\n')
    config = load(str(toml), {}, env)
    assert (config.db, config.db_password_file) == (URL, str(tmp_path / "pw"))
    assert dsn.is_postgres(config.db) and not dsn.is_postgres("/var/lib/sessiond/s.db")


@pytest.mark.parametrize("url", ["postgresql://sessiond:hunter2@db/sessions",
                                 "postgres://:hunter2@db/sessions"])
def test_a_password_in_the_url_is_refused_without_showing_it(url: str, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="holds a password") as refused:
        load(None, {"db": url}, {"HOME": str(tmp_path)})
    assert "hunter2" not in str(refused.value)
    assert "hunter2" not in dsn.redact(url)


def test_a_url_without_a_database_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="names no database"):
        load(None, {"db": "postgresql://db.example:5432/"}, {"HOME": str(tmp_path)})


def test_an_unreadable_password_file_is_refused_at_start(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="cannot read the database password"):
        load(None, {"db": URL, "db_password_file": str(tmp_path / "missing")},
             {"HOME": str(tmp_path)})


def test_the_password_comes_from_its_file_then_the_credential(tmp_path: Path) -> None:
    named, credentials = tmp_path / "pw", tmp_path / "creds"
    named.write_text("from-file\n")
    credentials.mkdir()
    (credentials / dsn.CREDENTIAL).write_text("from-systemd")
    env = {"CREDENTIALS_DIRECTORY": str(credentials)}
    assert dsn.password(str(named), env) == "from-file"
    assert dsn.password(None, env) == "from-systemd"
    assert dsn.password(None, {}) is None
    assert dsn.password(None, {"CREDENTIALS_DIRECTORY": str(tmp_path)}) is None
    empty = tmp_path / "empty"
    empty.write_text("\n")
    with pytest.raises(dsn.DsnError, match="is empty"):
        dsn.password(str(empty), {})
    with pytest.raises(dsn.DsnError, match="cannot read"):
        dsn.password(os.path.join(tmp_path, "missing"), {})
