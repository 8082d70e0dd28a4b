"""sessionctl's daemon and document commands: ping, verify, export, import, backup, cleanup,
stats."""

from __future__ import annotations

import argparse
import json
import os
import sys
from typing import Any

import msgspec

from sessiond_schemas.errors import SessiondError, SessionNotFoundError
from sessiond_schemas.events import STATUSES

from .._render import print_kv
from .._sync import Client
from .inputs import days, file_problem, read_file
from .registry import STREAMED, CliError, arg, command, full_id


@command("ping", "check that the daemon answers", sid=False, render=print_kv)
def _ping(c: Client, a: argparse.Namespace) -> Any:
    return c.ping()


def render_verify(r: Any) -> None:
    for p in r.problems:
        print(f"{p.session_id or '(database)'}: {p.problem}")
    print(f"{'ok' if r.ok else 'PROBLEMS'}: {r.checked_sessions} sessions checked,"
          f" {len(r.problems)} problems")


@command("verify", "check the database, hash chains and views; exit 1 on problems",
         sid=False, render=render_verify)
def _verify(c: Client, a: argparse.Namespace) -> Any:
    result = c.verify()
    if not result.ok:  # print, then exit non-zero
        (print(msgspec.json.encode(result).decode()) if a.json else render_verify(result))
        sys.exit(1)
    return result


@command("export", "write a session's export document (JSON with a checksum)",
         args=[arg("-o", "--output", help="file to write (default: stdout)")])
def _export(c: Client, a: argparse.Namespace) -> Any:
    # Written as session.export's pages come: a session of any size, never whole in memory.
    sid = full_id(c, a.id)
    if not a.output:
        c.export_session_to(sid, sys.stdout)
        return STREAMED
    try:
        with open(a.output, "w", encoding="utf-8") as f:
            c.export_session_to(sid, f)
    except OSError as exc:
        raise file_problem(a.output, exc) from exc
    return STREAMED


def _document_session(document: Any) -> str | None:
    """The session id an export document (object or JSON text) is for, if it says."""
    try:
        doc = json.loads(document) if isinstance(document, str) else document
        session = doc.get("session")
        if isinstance(session, dict) and isinstance(session.get("session_id"), str):
            return str(session["session_id"])
        first = doc["events"][0]["session_id"]
        return first if isinstance(first, str) else None
    except (ValueError, TypeError, KeyError, IndexError, AttributeError):
        return None  # the daemon judges the document and says what is wrong


@command("import", "import export documents, or a seed's store with --format;"
         " exit 1 if any fails", sid=False, args=[
             arg("files", nargs="+", metavar="PATH"),
             arg("--format", choices=["hive", "cleveragents", "zwarm"],
                 help="hive: a storage root, its sessions/ or one session folder;"
                      " cleveragents: an as_export_dict() file; zwarm: a project, .zwarm/"
                      " or one session folder"),
             arg("--on-conflict", choices=["error", "skip", "replace"])])
def _import(c: Client, a: argparse.Namespace) -> Any:
    imported: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    failed: list[dict[str, Any]] = []

    def exists(sid: str | None) -> bool:
        if sid is None:
            return False
        try:
            c.get_session(sid)
        except SessionNotFoundError:
            return False
        return True

    def send(path: str, document: Any, warnings: list[str]) -> None:
        try:
            sid = _document_session(document) if a.on_conflict == "skip" else None
            if exists(sid):  # skip: the daemon would return the stored session untouched
                skipped.append({"file": path, "session_id": sid,
                                "reason": "a session with this id exists"})
                return
            state = c.import_session(document, on_conflict=a.on_conflict)
            imported.append({"file": path, "session_id": state.session_id,
                             "version": state.version, "warnings": warnings})
        except SessiondError as exc:
            failed.append({"file": path, "error": exc.message})

    def one(path: str) -> None:
        try:
            if a.format:  # a seed's own store: each importer yields export documents
                from ..importers import FORMATS
                for source, document, warnings in FORMATS[a.format](path):
                    send(source, document, warnings)
                return
            text = read_file(path)  # sent as text: the daemon judges even invalid JSON
        except CliError as exc:
            failed.append({"file": path, "error": exc.message})
            return
        except (OSError, UnicodeDecodeError) as exc:
            failed.append({"file": path, "error": file_problem(path, exc).message})
            return
        except (ValueError, KeyError) as exc:
            failed.append({"file": path, "error": f"cannot read it: {exc}"})
            return
        send(path, text, [])

    if a.json or len(a.files) == 1:
        for path in a.files:
            one(path)
    else:
        from rich.progress import track
        for path in track(a.files, description="importing"):
            one(path)
    if not (imported or skipped or failed):
        what = f"{a.format} sessions" if a.format else "export documents"
        raise CliError(f"nothing to import: no {what} found in {', '.join(a.files)}",
                       "nothing_found", 1, {"files": a.files})
    if a.json:
        print(json.dumps({"imported": imported, "skipped": skipped, "failed": failed}))
    else:
        for item in imported:
            print(f"imported {item['session_id']} (v{item['version']}) from {item['file']}")
            for warning in item["warnings"]:
                print(f"  note: {warning}", file=sys.stderr)
        for item in skipped:
            print(f"skipped {item['session_id']} from {item['file']}: {item['reason']}")
        for item in failed:
            print(f"FAILED {item['file']}: {item['error']}", file=sys.stderr)
    if failed:
        sys.exit(1)
    return STREAMED


@command("backup", "copy the database online to a new file", sid=False,
         render=print_kv, args=[arg("path")])
def _backup(c: Client, a: argparse.Namespace) -> Any:
    return c.backup(os.path.abspath(a.path))


@command("cleanup", "delete ended sessions idle for a while", sid=False, args=[
    arg("--older-than", type=days, default=7.0, help="7d, 12h, 30m (default 7d)"),
    arg("--status", action="append", choices=STATUSES,
        help="statuses to clean (default: completed failed cancelled killed)"),
    arg("--dry-run", action="store_true", help="only list what would go")])
def _cleanup(c: Client, a: argparse.Namespace) -> Any:
    result = c.cleanup(older_than_days=a.older_than, statuses=a.status or None,
                       dry_run=True if a.dry_run else None)
    if a.json:
        return result
    verb = "would delete" if a.dry_run else "deleted"
    print(f"{verb} {result.deleted} sessions" + "".join(f"\n  {s}" for s in result.session_ids))
    return STREAMED


@command("stats", "show the daemon's counters", sid=False, render=print_kv)
def _stats(c: Client, a: argparse.Namespace) -> Any:
    return c.stats()
