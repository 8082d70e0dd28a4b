"""Store choice lives in one place: the store registry (stores/registry.py).

Outside the registry and the store packages themselves, no daemon module checks which
engine it has (`is_postgres`, `isinstance(x, PostgresStore)`, `engine == "sqlite"`) or
imports a store package: it asks `registry.kind_of(url)` before a store is opened, and
`store.capabilities` after (docs/architecture.md; issue 25 §4). This test reads the source,
so a new engine check fails here with its file and line.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

DAEMON = Path(__file__).resolve().parent.parent / "daemon" / "sessiond_daemon"
STORE_PACKAGES = ("postgres", "sqlite")
# Where choosing between engines is the job: the registry, and each store about itself.
ALLOWED = (DAEMON / "stores" / "registry.py", *(DAEMON / "stores" / p for p in STORE_PACKAGES))

CHECKS = {
    "an engine check by URL": re.compile(r"\bis_postgres\b|\bis_sqlite\b"),
    "an engine check by type": re.compile(
        r"isinstance\([^)]*\b(PostgresStore|SqliteStore)\b"),
    "an engine check by name": re.compile(r"\bengine\s*(==|!=|\bin\b|\bnot in\b)|"
                                          r"(==|!=)\s*[\w.]*\bengine\b"),
    "an import of a store package": re.compile(
        r"^\s*(from|import)\s+(\.+|sessiond_daemon\.stores\.)(postgres|sqlite)\b", re.MULTILINE),
}


def offences(source: str, where: str) -> list[str]:
    found = []
    for what, pattern in CHECKS.items():
        for m in pattern.finditer(source):
            line = source.count("\n", 0, m.start()) + 1
            found.append(f"{where}:{line}: {what}: {m.group(0).strip()}")
    return found


def _allowed(path: Path) -> bool:
    return any(path == a or a in path.parents for a in ALLOWED)


# Offences another branch removes, each with why it is here for now. An entry that no
# longer matches fails the test (remove it), so none outlives its reason.
PENDING: dict[str, str] = {}


def test_no_engine_check_outside_the_registry() -> None:
    modules = sorted(DAEMON.rglob("*.py"))
    assert len(modules) > 30  # the daemon's modules, not an empty glob
    found = [o for path in modules if not _allowed(path)
             for o in offences(path.read_text(), str(path.relative_to(DAEMON)))]
    pending = {o for o in found if re.sub(r":\d+:", ":", o, count=1) in PENDING}
    stale = set(PENDING) - {re.sub(r":\d+:", ":", o, count=1) for o in pending}
    assert not stale, f"no longer found, remove from PENDING: {sorted(stale)}"
    found = [o for o in found if o not in pending]
    assert not found, "ask the store registry or store.capabilities instead:\n" + "\n".join(found)


@pytest.mark.parametrize("source", [
    "if dsn.is_postgres(config.db):",
    "if isinstance(store, PostgresStore):",
    "if not isinstance(s, (FaultyStore, SqliteStore)):",
    "if caps.sql is not None and caps.engine == 'sqlite':",
    "if caps.engine != \"sqlite\":",
    "if 'postgresql' == store.capabilities.engine:",
    "if caps.engine in ('sqlite',):",
    "from .postgres import dsn",
    "    from .postgres.store import PostgresStore",
    "from .sqlite import SqliteStore",
    "from sessiond_daemon.stores.sqlite.base import storage_error",
    "from ..postgres import follow",
])
def test_each_kind_of_engine_check_is_caught(source: str) -> None:
    """The patterns catch what they are for (a test that cannot fail is a defect)."""
    assert offences(source, "x.py")


@pytest.mark.parametrize("source", [
    "engine: str",
    "{'detail': 'no search index', 'engine': caps.engine}",
    "from .stores import registry",
    "import sqlite3",
    "kind = registry.kind_of(url)",
])
def test_what_is_not_an_engine_check(source: str) -> None:
    assert not offences(source, "x.py")
