"""`sessionctl migrate FROM TO`: copy a database into another, SQLite <-> PostgreSQL.

The copy needs the daemon's stores, and the client never imports the daemon: this runs
the daemon's program, `python -m sessiond_daemon migrate FROM TO`, with the same Python
(which has the daemon installed beside the client), and hands on its output and exit
status. No daemon is contacted: a SQLite end must not be served meanwhile.
"""

from __future__ import annotations

import argparse
import importlib.util
import subprocess
import sys
from typing import Any

from .._sync import Client
from .registry import CliError, arg, command


@command("migrate", "copy a database into another (SQLite <-> PostgreSQL), ids, versions,"
         " hashes and times kept; run again, it copies only what is missing", sid=False,
         args=[arg("source", help="SQLite path or postgresql://user@host:port/dbname"),
               arg("target", help="SQLite path or postgresql://user@host:port/dbname"),
               arg("--db-password-file", help="the PostgreSQL password's file (never on"
                   " the command line)")])
def _migrate(c: Client, a: argparse.Namespace) -> Any:
    raise AssertionError("sessionctl migrate runs without a daemon (cli.LOCAL)")


def run(a: argparse.Namespace) -> int:
    """Run the daemon program's migrate; its exit status is ours."""
    if importlib.util.find_spec("sessiond_daemon") is None:
        raise CliError("sessionctl migrate needs the daemon installed beside the client"
                       " (pip install sessiond)", "unavailable", 2)
    argv = [sys.executable, "-m", "sessiond_daemon", "migrate", a.source, a.target]
    if a.db_password_file:
        argv += ["--db-password-file", a.db_password_file]
    return subprocess.run(argv, check=False).returncode
