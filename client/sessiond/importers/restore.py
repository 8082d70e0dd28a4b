"""Sessions handed back to the CLIs: `sessionctl restore ID --format claude-code|codex`.

A session imported from that CLI's transcript is written back line for line: the
importer keeps every line as the CLI wrote it (`_lines.LINE_FIELD`, in the first event
of the line). Any other session, or a message the transcript did not bring, is written
as a transcript the CLI reads: its messages, tool calls and results, in the CLI's own
line shapes (Claude Code 2.1, Codex 0.169). The file goes where the CLI looks for it
(`claude --resume`, `codex resume`), and never over a file that exists. The session is
read a page of events at a time and written as it is read.
"""

from __future__ import annotations

import json
import os
import re
import tempfile
import uuid
from dataclasses import dataclass, field
from datetime import UTC
from typing import IO, Any

from sessiond_schemas.events import Event, parse_time
from sessiond_schemas.state import SessionState

from .._sync import Client
from ._lines import LINE_CUT_FIELD, LINE_FIELD, calls_text

_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
_PAGE = 1000
MAX_PROJECT = 200  # the CLI cuts longer project folder names and adds a hash


def default_root(fmt: str) -> str:
    """The CLI's own folder: Claude Code's projects, Codex's sessions."""
    home = os.path.expanduser("~")
    if fmt == "claude-code":
        config = os.environ.get("CLAUDE_CONFIG_DIR") or os.path.join(home, ".claude")
        return os.path.join(config, "projects")
    return os.path.join(os.environ.get("CODEX_HOME") or os.path.join(home, ".codex"),
                        "sessions")


def _hash36(text: str) -> str:
    """The 32-bit string hash (h * 31 + c, JavaScript's int overflow) in base 36, as Claude
    Code adds it to a project folder name it cut."""
    h = 0
    for ch in text:
        h = (h * 31 + ord(ch)) & 0xFFFFFFFF
    n = abs(h - (1 << 32) if h >= 1 << 31 else h)
    digits = ""
    while True:
        n, r = divmod(n, 36)
        digits = "0123456789abcdefghijklmnopqrstuvwxyz"[r] + digits
        if not n:
            return digits


def project_folder(cwd: str) -> str:
    """The folder Claude Code keeps a working directory's transcripts in: every character
    but ASCII letters and digits a '-', cut at 200 with a hash of the whole."""
    name = re.sub(r"[^a-zA-Z0-9]", "-", cwd)
    return name if len(name) <= MAX_PROJECT else f"{name[:MAX_PROJECT]}-{_hash36(cwd)}"


def cli_session_id(session_id: str) -> str:
    """The CLI's id of a session (both take UUIDs): its own id, or one made from it."""
    if _UUID.match(session_id):
        return session_id
    return str(uuid.uuid5(uuid.NAMESPACE_URL, f"sessiond:{session_id}"))


def target(view: SessionState, fmt: str, root: str) -> str:
    """Where the CLI looks for this session under `root`: the imported file's own place
    when the session came from the CLI, else the place the CLI would have given it. A
    place a session's metadata would put outside `root` (`..`) is refused."""
    path = os.path.normpath(_place(view, fmt, root))
    if not path.startswith(os.path.join(os.path.normpath(root), "")):
        raise ValueError(f"session {view.session_id} would be written outside {root}")
    return path


def _place(view: SessionState, fmt: str, root: str) -> str:
    md = view.metadata
    source = md.get("transcript") if view.adapter == fmt else None
    if isinstance(source, str):
        parts = os.path.normpath(source).split(os.sep)
        if fmt == "claude-code" and isinstance(md.get("project"), str) \
                and md["project"] in parts:
            at = len(parts) - 1 - parts[::-1].index(md["project"])
            return os.path.join(root, *parts[at:])
        if fmt == "codex" and len(parts) >= 4 and all(p.isdigit() for p in parts[-4:-1]):
            return os.path.join(root, *parts[-4:])
    if fmt == "claude-code" and isinstance(md.get("project"), str) \
            and isinstance(md.get("sdk_session_id"), str):
        # Mirrored by the Agent SDK's SessiondSessionStore: the place its key names.
        sub = md.get("subpath")
        name = md["sdk_session_id"] + (f"/{sub}" if isinstance(sub, str) else "")
        return os.path.join(root, md["project"], name + ".jsonl")
    sid = cli_session_id(view.session_id)
    if fmt == "claude-code":
        return os.path.join(root, project_folder(view.working_dir or os.getcwd()),
                            f"{sid}.jsonl")
    t = parse_time(view.timestamps.created_at).astimezone(UTC)
    return os.path.join(root, f"{t:%Y}", f"{t:%m}", f"{t:%d}",
                        f"rollout-{t:%Y-%m-%dT%H-%M-%S}-{sid}.jsonl")


@dataclass
class Restored:
    """What one restore wrote."""

    session_id: str
    file: str
    lines: int = 0  # lines written
    original: int = 0  # of them, the CLI's own lines as it wrote them
    left_out: list[str] = field(default_factory=list)  # what could not be written, and why

    def as_item(self) -> dict[str, Any]:
        return {"session_id": self.session_id, "file": self.file, "lines": self.lines,
                "original_lines": self.original, "left_out": self.left_out}


class _Writer:
    """Renders messages as one CLI's transcript lines (those the importer did not keep)."""

    def __init__(self, view: SessionState, fmt: str, out: IO[str], result: Restored) -> None:
        self.view, self.fmt, self.out, self.result = view, fmt, out, result
        self.cli_id = cli_session_id(view.session_id)
        self.parent: str | None = None  # Claude Code: the last line's uuid
        self.calls: set[str] = set()  # tool call ids written: a result needs its call
        self.started = False

    def line(self, obj: dict[str, Any]) -> None:
        self.out.write(json.dumps(obj, ensure_ascii=False, separators=(",", ":")) + "\n")
        self.result.lines += 1

    def original(self, text: str, data: dict[str, Any]) -> None:
        if LINE_CUT_FIELD in data:
            self.result.left_out.append(
                f"a line of {data[LINE_CUT_FIELD]} characters, kept cut: not written")
            return
        self.out.write(text + "\n")
        self.result.lines += 1
        self.result.original += 1
        self.started = True
        if self.fmt == "claude-code":
            try:
                parent = json.loads(text).get("uuid")
            except (ValueError, AttributeError):
                parent = None
            self.parent = parent if isinstance(parent, str) else self.parent

    def message(self, event: Event) -> None:
        d = event.fields()
        role, content = str(d.get("role")), str(d.get("content") or "")
        at = event.recorded_at
        calls = [c for c in (d.get("metadata") or {}).get("tool_calls") or []
                 if isinstance(c, dict) and isinstance(c.get("id"), str)]
        if role == "system":
            self.result.left_out.append(f"a system message (version {event.version})")
            return
        if self.fmt == "claude-code":
            self._claude(event, role, content, calls, d.get("tool_call_id"), at)
        else:
            self._codex(role, content, calls, d.get("tool_call_id"), at)

    # --- Claude Code ----------------------------------------------------------------

    def _claude(self, event: Event, role: str, content: str, calls: list[dict[str, Any]],
                call_id: str | None, at: str) -> None:
        line_id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"sessiond:{event.event_id}"))
        base = {"parentUuid": self.parent, "isSidechain": False, "userType": "external",
                "cwd": self.view.working_dir or os.getcwd(), "sessionId": self.cli_id,
                "version": str(self.view.metadata.get("cli_version") or "2.1.0")}
        if role == "assistant":
            # The text, unless it is only the rendering of the calls the importer made.
            blocks: list[dict[str, Any]] = [] if calls and content == calls_text(calls) \
                else [{"type": "text", "text": content}]
            for c in calls:
                blocks.append({"type": "tool_use", "id": c["id"], "name": str(c.get("name")),
                               "input": c.get("input") if isinstance(c.get("input"), dict)
                               else {"input": c.get("input")}})
                self.calls.add(c["id"])
            message: dict[str, Any] = {
                "id": "msg_" + line_id.replace("-", "")[:24], "type": "message",
                "role": "assistant", "model": self.view.model or "<synthetic>",
                "content": blocks, "stop_reason": "tool_use" if calls else "end_turn",
                "stop_sequence": None, "usage": {"input_tokens": 0, "output_tokens": 0}}
            kind = "assistant"
        elif role == "tool" and call_id in self.calls:
            message = {"role": "user", "content": [
                {"type": "tool_result", "tool_use_id": call_id, "content": content}]}
            kind = "user"
        else:  # a user message, or a tool result whose call this transcript lacks
            message = {"role": "user", "content": content if role == "user"
                       else f"[tool result {call_id}]\n{content}"}
            kind = "user"
        self.line({**base, "type": kind, "message": message, "uuid": line_id,
                   "timestamp": at})
        self.parent = line_id

    # --- Codex ------------------------------------------------------------------------

    def _codex(self, role: str, content: str, calls: list[dict[str, Any]],
               call_id: str | None, at: str) -> None:
        if not self.started:
            self.started = True
            meta: dict[str, Any] = {
                "id": self.cli_id, "timestamp": self.view.timestamps.created_at,
                "cwd": self.view.working_dir or os.getcwd(), "originator": "sessiond",
                "cli_version": str(self.view.metadata.get("cli_version") or "0.169.0"),
                "source": "cli", "model_provider": "openai"}
            self.line({"timestamp": self.view.timestamps.created_at, "type": "session_meta",
                       "payload": meta})
        items: list[dict[str, Any]] = []
        if role == "assistant" and calls:
            if content != calls_text(calls):  # said besides the calls
                items.append({"type": "message", "role": "assistant",
                              "content": [{"type": "output_text", "text": content}]})
            for c in calls:
                args = c.get("input")
                items.append({"type": "function_call", "name": str(c.get("name")),
                              "arguments": args if isinstance(args, str) else json.dumps(args),
                              "call_id": c["id"]})
                self.calls.add(c["id"])
        elif role == "tool" and call_id in self.calls:
            items.append({"type": "function_call_output", "call_id": call_id,
                          "output": content})
        else:
            kind = "output_text" if role == "assistant" else "input_text"
            text = content if role != "tool" else f"[tool result {call_id}]\n{content}"
            items.append({"type": "message", "role": "assistant" if role == "assistant"
                          else "user", "content": [{"type": kind, "text": text}]})
        for item in items:
            self.line({"timestamp": at, "type": "response_item", "payload": item})


def restore(client: Client, session_id: str, fmt: str, root: str | None = None) -> Restored:
    """Write session `session_id` as a `fmt` transcript under `root` (default: the CLI's
    own folder); FileExistsError if that file exists (nothing is written then)."""
    view = client.get_session(session_id)
    path = target(view, fmt, root or default_root(fmt))
    if os.path.lexists(path):
        raise FileExistsError(path)
    folder = os.path.dirname(path)
    os.makedirs(folder, exist_ok=True)
    result = Restored(session_id, path)
    fd, temp = tempfile.mkstemp(prefix=".sessiond-restore-", suffix=".jsonl", dir=folder)
    try:
        with os.fdopen(fd, "w", encoding="utf-8", newline="\n") as out:
            _write(client, view, fmt, out, result)
            out.flush()
            os.fsync(out.fileno())
        os.link(temp, path)  # never over a file: one made meanwhile fails here
    finally:
        os.unlink(temp)
    return result


def _write(client: Client, view: SessionState, fmt: str, out: IO[str],
           result: Restored) -> None:
    writer = _Writer(view, fmt, out, result)
    own = view.adapter == fmt  # lines kept from another CLI's transcript are not this one's
    kept_key: str | None = None  # the line whose first event held it: its other events too
    # a history trimmed by retention is read from where it starts now
    version: int | None = view.history.version if view.history else 1
    while version is not None:
        page = client.read_events(view.session_id, from_version=version, limit=_PAGE)
        for event in page.events:
            key = event.meta.idempotency_key
            data = event.fields() if own or event.type == "message.appended" else {}
            text = data.get(LINE_FIELD) if own else None
            if isinstance(text, str):
                writer.original(text, data)
                kept_key = key
            elif key is not None and key == kept_key:
                continue
            elif event.type == "message.appended":
                writer.message(event)
        version = page.next
    if result.lines == 0:
        result.left_out.append("no messages: an empty transcript")

