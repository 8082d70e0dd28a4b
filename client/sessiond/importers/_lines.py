"""Claude Code and Codex CLI transcripts (JSON Lines) read line by line into events.

Their vendors do not document these files; the shapes here follow the public schemas
and parsers the community keeps (docs/importers.md lists what is read). Each line that
carries something becomes one `events.append` batch keyed by the line's own id, so a
session in the daemon says itself which lines it holds.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import IO, Any
from urllib.parse import quote

from sessiond_schemas.events import Event

from ._builder import Problem, TDict, TList, json_problem, plain, problem_of, root_object

SOURCE_LIMIT = 100_000  # characters of one tool input/output kept in a message
# Every line is kept as the CLI wrote it, in the data of its first event (LINE_FIELD), so
# that `sessionctl restore` writes the transcript back line for line. It is one field of
# its own, the only copy of the line outside the messages, so that a redaction has one
# place to rewrite. A line longer than LINE_LIMIT characters is kept cut, with
# LINE_CUT_FIELD saying its length (restore leaves such a line out and says so).
LINE_FIELD = "transcript_line"
LINE_CUT_FIELD = "transcript_line_cut"
LINE_LIMIT = 8 << 20
# Lines appended together in one write (SessiondSessionStore's batches, whose write has a
# key of its own, `ccb:...`) name each line's key in its first event's data.
LINE_KEY_FIELD = "transcript_line_key"


def line_keys(events: Iterable[Event]) -> Iterator[str]:
    """The line keys stored events hold: each write's idempotency key (a line appended
    alone, or imported), and in a batch's write, the key each of its lines names."""
    for event in events:
        key = event.meta.idempotency_key
        if key:
            yield key
            if key.startswith("ccb:"):
                named = event.fields().get(LINE_KEY_FIELD)
                if isinstance(named, str):
                    yield named


def namespace_for(namespace: str | None, project_key: str, session_id: str | None = None) -> str:
    """The sessiond namespace of a Claude Code project's main transcripts (or, with
    `session_id`, of that session's sub-agents'), escaped so that no two collide: where
    the importer puts them, and SessiondSessionStore(namespace=None) finds them
    (`namespace` N: `claude-code+N:...`)."""
    base = "claude-code" if namespace is None else "claude-code+" + quote(namespace, safe="")
    found = f"{base}:{quote(project_key, safe='')}"
    return found if session_id is None else f"{found}:{quote(session_id, safe='')}"


@dataclass
class Line:
    """One transcript line's events, in the form events.append takes them."""

    key: str  # the idempotency key: the transcript's own id for the line
    number: int
    at: str | None  # the time the CLI recorded
    events: list[dict[str, Any]] = field(default_factory=list)

    def cut(self, budget: int) -> Line:
        """This line made small enough to store (the daemon refused it whole): each
        message's content and the kept line cut to `budget` characters, tool inputs left
        out, and marked: `transcript_line_cut` is the line's length, the content ends
        saying it was cut."""
        events: list[dict[str, Any]] = []
        for event in self.events:
            data = dict(event["data"])
            if LINE_FIELD in data:
                data[LINE_CUT_FIELD] = data.get(LINE_CUT_FIELD, len(data[LINE_FIELD]))
                data[LINE_FIELD] = data[LINE_FIELD][:budget]
            if event["type"] == "message.appended":
                content = data.get("content", "")
                if len(content) > budget:
                    data["content"] = (content[:budget]
                                       + f"\n[cut: {len(content)} characters in all]")
                metadata = dict(data.get("metadata") or {})
                if "tool_calls" in metadata:
                    metadata["tool_calls"] = [{**c, "input": "[cut]"}
                                              for c in metadata["tool_calls"]]
                data["metadata"] = metadata
            events.append({**event, "data": data})
        return Line(self.key, self.number, self.at, events)

    def keep(self, text: str) -> None:
        """Keep the line's own text in its first event (a line that says nothing for the
        session gets an event that changes nothing: metadata.updated with no patch)."""
        if not self.events:
            self.events.append({"type": "metadata.updated", "data": {"patch": {}}})
        data = self.events[0]["data"] = dict(self.events[0]["data"])
        if len(text) > LINE_LIMIT:
            data[LINE_FIELD], data[LINE_CUT_FIELD] = text[:LINE_LIMIT], len(text)
        else:
            data[LINE_FIELD] = text


@dataclass
class Facts:
    """What the transcript says about its session (session.created's fields)."""

    session_id: str | None = None
    parent_session_id: str | None = None
    working_dir: str | None = None
    model: str | None = None  # the latest (what tokens are counted for)
    first_model: str | None = None
    git_branch: str | None = None  # the latest; the session starts with first_git_branch
    first_git_branch: str | None = None
    cli_version: str | None = None
    task: str | None = None
    first_at: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)


def _cut(text: str) -> str:
    return text if len(text) <= SOURCE_LIMIT else text[:SOURCE_LIMIT] + "…"


def _dumps(value: Any) -> str:
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False,
                                                           sort_keys=True)


def calls_text(calls: list[dict[str, Any]]) -> str:
    """The content of an assistant message that is tool calls only: `name(input)` each."""
    return "\n".join(f"{c['name']}({_cut(_dumps(c['input']))})" for c in calls)


def _message(role: str, content: str, metadata: dict[str, Any],
             tool_call_id: str | None = None) -> dict[str, Any]:
    data: dict[str, Any] = {"role": role, "content": _cut(content), "metadata": metadata}
    if tool_call_id is not None:
        data["tool_call_id"] = tool_call_id
    return {"type": "message.appended", "data": data}


class Parser:
    """Turns one file's lines into Lines; keeps what later lines depend on."""

    adapter = ""

    def __init__(self, path: str) -> None:
        self.path = path
        self.facts = Facts()
        self._occurrences: dict[str, int] = {}

    def from_start(self) -> None:
        """The file is read from its first line again (rewritten, cut shorter): a line's
        repeats are counted afresh, so a line read again gets the key it had."""
        self._occurrences.clear()

    def content_key(self, prefix: str, text: str) -> str:
        """For lines without an id: their content's hash (and which repeat it is)."""
        digest = hashlib.sha256(text.encode()).hexdigest()[:24]
        n = self._occurrences.get(digest, 0) + 1
        self._occurrences[digest] = n
        return f"{prefix}:{digest}" + (f"#{n}" if n > 1 else "")

    def parse(self, text: str, number: int) -> Line | None:
        try:
            loaded = json.loads(text)
        except ValueError as exc:
            raise _at_line(json_problem(exc), number) from None
        try:
            line = self.convert(root_object(loaded, "a transcript line"), text, number)
        except Exception as exc:  # a line's failure is its own result
            raise _at_line(problem_of(exc), number) from None
        if line is not None:
            line.keep(text)
        return line

    def convert(self, obj: TDict, text: str, number: int) -> Line | None:
        """The line's events (an empty list when it says nothing for the session: it is
        kept all the same); None only for a line not to keep at all."""
        raise NotImplementedError

    def namespace(self) -> str | None:
        """The namespace its session is made in (None: the daemon's default)."""
        return None

    def made_from_here(self, source: str, metadata: dict[str, Any], namespace: str) -> bool:
        """Whether an existing session (its `source`, `metadata`, `namespace`) is the one
        this transcript makes: imported from a file of the same name (a rotated copy's
        name without its `.N`) in a folder of the same name, wherever the CLI's root is
        now. Else the transcript names a session it did not make: nothing is appended."""
        made = metadata.get("transcript")
        if source != self.adapter or not isinstance(made, str):
            return False
        def place(path: str) -> tuple[str, str]:
            path = re.sub(r"(\.jsonl)\.\d+$", r"\1", os.path.normpath(path))
            return os.path.basename(os.path.dirname(path)), os.path.basename(path)
        return place(made) == place(self.path)

    def note_time(self, at: str | None) -> None:
        if at and self.facts.first_at is None:
            self.facts.first_at = at


def _at_line(problem: Problem, number: int) -> Problem:
    problem.line = number
    return problem


def _text_blocks(content: Any) -> str:
    """The text of a content field: a string, or a list of blocks with `text`."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for block in content:
            if isinstance(block, dict):
                if isinstance(block.get("text"), str):
                    parts.append(block["text"])
                elif block.get("type") == "image":
                    parts.append("[image]")
            elif isinstance(block, str):
                parts.append(block)
        return "\n".join(parts)
    return "" if content is None else _dumps(content)


class ClaudeCode(Parser):
    """~/.claude/projects/<project>/<session>.jsonl; sub-agents in agent-<id>.jsonl beside
    it (up to 2.0) or in <session>/subagents/agent-<id>.jsonl (2.1 on)."""

    adapter = "claude-code"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        stem = os.path.basename(path).split(".jsonl")[0]
        self.agent = stem[len("agent-"):] if stem.startswith("agent-") else None
        parts = os.path.normpath(path).split(os.sep)
        if self.agent is None:
            self.facts.session_id = stem
        elif len(parts) >= 3 and parts[-2] == "subagents":
            self._parent(parts[-3])
        # The project folder (the CLI's name for the cwd: the Agent SDK's project_key), and
        # for a sub-agent the SDK's subpath: what SessiondSessionStore finds sessions by.
        nested = self.agent is not None and len(parts) >= 4 and parts[-2] == "subagents"
        self.facts.extra["project"] = parts[-4] if nested else parts[-2]
        if self.agent is not None:
            self.facts.extra["subpath"] = f"subagents/agent-{self.agent}"
        self._usage_seen: set[str] = set()
        self._boundary: Any = None  # the last compact_boundary's compactMetadata

    def namespace(self) -> str | None:
        project = self.facts.extra.get("project")
        if not isinstance(project, str):
            return None
        if self.agent is None:
            return namespace_for(None, project)
        parent = self.facts.parent_session_id
        return namespace_for(None, project, parent) if parent else None

    def made_from_here(self, source: str, metadata: dict[str, Any], namespace: str) -> bool:
        # A session the Agent SDK mirrored (SessiondSessionStore) is this transcript's too
        # when it is where the importer would have put it: one session, keys once.
        if source == "claude-agent-sdk":
            return namespace == self.namespace()
        return super().made_from_here(source, metadata, namespace)

    def _parent(self, parent: str) -> None:
        self.facts.parent_session_id = parent
        self.facts.session_id = f"{parent}.agent-{self.agent}"

    def convert(self, obj: TDict, text: str, number: int) -> Line | None:
        kind = obj.text("type")
        at = obj.time("timestamp")
        self.note_time(at)
        if self.agent is not None and self.facts.session_id is None and obj.get("sessionId"):
            self._parent(obj.text("sessionId"))
        for key, attr in (("cwd", "working_dir"), ("version", "cli_version")):
            if obj.get(key) and getattr(self.facts, attr) is None:
                setattr(self.facts, attr, obj.text(key))
        uuid = obj.text("uuid")
        line = Line(f"cc:{uuid}" if uuid else self.content_key("cc", text), number, at)
        branch = obj.text("gitBranch")
        if branch and branch != self.facts.git_branch:
            if self.facts.git_branch is not None:
                line.events.append({"type": "metadata.updated",
                                    "data": {"patch": {"git_branch": branch}}})
            else:
                self.facts.first_git_branch = branch
            self.facts.git_branch = branch
        if kind == "system" and obj.get("subtype") == "compact_boundary":
            self._boundary = obj.get("compactMetadata")  # the summary line follows it
        if kind == "summary" and obj.get("summary"):
            line.events.append({"type": "metadata.updated",
                                "data": {"patch": {"summary": obj.text("summary")}}})
        elif kind == "custom-title" and obj.get("customTitle"):  # /rename (2.1)
            line.events.append({"type": "metadata.updated",
                                "data": {"patch": {"title": obj.text("customTitle")}}})
        elif kind in ("user", "assistant"):
            self._chat(obj, kind, uuid, at, line)
            if obj.get("isCompactSummary"):
                line.events += claude_code_compaction(line, self._boundary)
        elif kind == "system" and isinstance(obj.get("content"), str) and obj["content"].strip():
            # compact_boundary (2.1): where /compact or auto-compaction cut the context;
            # the summary that replaces what came before is the next (isCompactSummary) line.
            compact = obj.obj("compactMetadata")
            line.events.append(_message("system", obj["content"], self._meta(
                obj, uuid, at, subtype=obj.get("subtype"),
                logical_parent_uuid=obj.get("logicalParentUuid"),
                compact_trigger=compact.get("trigger"),
                compact_pre_tokens=compact.get("preTokens"))))
        # file-history-snapshot, queue-operation, progress, last-prompt, ...: kept as lines
        # (restore writes them back), nothing for the session's view
        return line

    def _meta(self, obj: TDict, uuid: str | None, at: str | None, **more: Any) -> dict[str, Any]:
        source = {"uuid": uuid, "parent_uuid": obj.get("parentUuid"), "timestamp": at}
        if obj.get("isSidechain"):
            source["is_sidechain"] = True
        if obj.get("isMeta"):
            source["is_meta"] = True
        if obj.get("isCompactSummary"):
            source["is_compact_summary"] = True
        source.update({k: v for k, v in more.items() if v is not None})
        return {"claude_code": {k: v for k, v in source.items() if v is not None}}

    def _chat(self, obj: TDict, kind: str, uuid: str | None, at: str | None,
              line: Line) -> None:
        msg = obj.obj("message")
        content = msg.get("content")
        if not isinstance(content, (str, TList)):
            raise Problem("expected a string or a list of blocks", f"{msg.path}.content")
        blocks = [content] if isinstance(content, str) else list(content)
        texts: list[str] = []
        calls: list[dict[str, Any]] = []
        results: list[dict[str, Any]] = []
        for i, block in enumerate(blocks):
            if isinstance(block, str):
                texts.append(block)
                continue
            if not isinstance(block, TDict):
                raise Problem("expected a content block", f"$.message.content[{i}]")
            btype = block.text("type")
            if btype == "text":
                texts.append(block.text("text") or "")
            elif btype == "image":
                texts.append("[image]")
            elif btype == "tool_use":
                calls.append({"id": block.text("id", required=True),
                              "name": block.text("name") or "tool",
                              "input": block.get("input")})
            elif btype == "tool_result":
                results.append({"tool_call_id": block.text("tool_use_id", required=True),
                                "content": _text_blocks(block.get("content")),
                                "is_error": bool(block.get("is_error"))})
            # thinking, redacted_thinking: the model's own, not the conversation
        if kind == "assistant":
            model = msg.text("model")
            if model and model != "<synthetic>":
                self.facts.model = self.facts.model or model
        text = "\n".join(t for t in texts if t.strip())
        if text.strip() or calls:
            if (self.facts.task is None and kind == "user" and not obj.get("isMeta")
                    and not obj.get("isCompactSummary")):
                self.facts.task = text.strip()[:200]
            meta = self._meta(obj, uuid, at, message_id=msg.get("id"),
                              request_id=obj.get("requestId"))
            if calls:
                meta["tool_calls"] = calls
                text = text or calls_text(calls)
            line.events.append(_message("assistant" if kind == "assistant" else "user",
                                        text, meta))
        for r in results:
            meta = self._meta(obj, uuid, at)
            if r["is_error"]:
                meta["is_error"] = True
            line.events.append(_message("tool", r["content"] or "(no output)", meta,
                                        r["tool_call_id"]))
        usage = msg.obj("usage")
        msg_id = msg.text("id") or uuid or line.key
        if kind == "assistant" and usage and msg_id not in self._usage_seen:
            # One API response is written as one line per content block, each with the
            # response's usage: it is counted once, on its first line.
            self._usage_seen.add(msg_id)
            tokens: dict[str, Any] = {
                "input_tokens": int(usage.number("input_tokens")
                                    + usage.number("cache_creation_input_tokens")
                                    + usage.number("cache_read_input_tokens")),
                "output_tokens": int(usage.number("output_tokens"))}
            if msg.text("model"):
                tokens["model"] = msg.text("model")
            line.events.append({"type": "tokens.recorded", "data": tokens})


# --- compactions (issue 48): each CLI's compaction as a session.compacted -------------
MAX_SUMMARY = 1000  # summary messages (events.MAX_SUMMARY_MESSAGES)


def claude_code_compaction(line: Line, boundary: Any) -> list[dict[str, Any]]:
    """A Claude Code summary line (`isCompactSummary`, the user message that follows a
    `compact_boundary` system line, /compact or the automatic one) is the message it is,
    and a session.compacted whose summary is it, standing for every message so far (it
    included): the context of the session resumed is the summary and what follows."""
    messages = [e["data"] for e in line.events if e["type"] == "message.appended"]
    if not messages:
        return []
    summary = {k: messages[-1][k] for k in ("role", "content", "metadata")}
    data: dict[str, Any] = {"summary": [summary], "by": "claude-code"}
    if isinstance(boundary, dict) and isinstance(boundary.get("trigger"), str):
        data["reason"] = boundary["trigger"]  # manual (/compact) or auto
    return [{"type": "session.compacted", "data": data}]


def codex_compaction(p: TDict) -> dict[str, Any]:
    """A Codex `compacted` line: the history Codex goes on with (`replacement_history`,
    its messages; older rollouts: the summary `message` alone, which Codex sends as a
    user message) as a session.compacted standing for every message so far."""
    summary: list[dict[str, Any]] = []
    history = p.get("replacement_history")
    for item in history if isinstance(history, list) else []:
        if isinstance(item, dict) and item.get("type") == "message":
            text = _text_blocks(plain(item.get("content")))
            role = {"developer": "system"}.get(str(item.get("role")), str(item.get("role")))
            if text.strip() and role in ("user", "assistant", "system"):
                summary.append({"role": role, "content": _cut(text)})
    message = p.text("message")
    if not summary:
        summary = [{"role": "user", "content": _cut(message or "") or "[compacted]"}]
    return {"type": "session.compacted", "data": {"summary": summary[-MAX_SUMMARY:],
                                                  "by": "codex"}}


_ROLLOUT_ID = re.compile(r"([0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12})")
_CALLS = ("function_call", "custom_tool_call", "local_shell_call")
_OUTPUTS = ("function_call_output", "custom_tool_call_output")
# User-role messages that Codex writes itself (its environment, AGENTS.md): kept as system.
_INJECTED = ("<environment_context>", "<user_instructions>", "# AGENTS.md")


class Codex(Parser):
    """~/.codex/sessions/YYYY/MM/DD/rollout-<time>-<uuid>.jsonl: {timestamp, type, payload}
    lines (0.4x on); the older files without the envelope (a bare meta line, then bare
    response items and `record_type: state` lines) too."""

    adapter = "codex"

    def __init__(self, path: str) -> None:
        super().__init__(path)
        found = _ROLLOUT_ID.findall(os.path.basename(path))
        self.facts.session_id = found[-1] if found else None
        self._total: Any = None
        self._met = False  # the first session_meta line read: it is this file's session

    def convert(self, obj: TDict, text: str, number: int) -> Line | None:
        kind = obj.text("type")
        at = obj.time("timestamp")
        if "payload" in obj and kind is not None:
            payload = obj.obj("payload")
        elif kind is None and obj.get("record_type") is None and obj.get("id"):
            kind, payload = "session_meta", obj  # before the envelope: the first line
        elif obj.get("record_type") == "state":
            return Line(self.content_key("cx", text), number, at)
        else:
            kind, payload = "response_item", obj
        self.note_time(at or (payload.time("timestamp") if kind == "session_meta" else None))
        line = Line(self.content_key("cx", text), number, at)
        if kind == "session_meta":
            if not self._met:  # a fork or resume copies its source's meta lines after its own
                self._meta_line(payload)
            self._met = True
        elif kind == "turn_context":
            model = payload.text("model")
            if model and model != self.facts.model:
                if self.facts.model is not None:
                    line.events.append({"type": "metadata.updated",
                                        "data": {"patch": {"model": model}}})
                self.facts.model = model
                self.facts.first_model = self.facts.first_model or model
            self.facts.working_dir = self.facts.working_dir or payload.text("cwd")
        elif kind == "response_item":
            self._item(payload, at, line)
        elif kind == "event_msg" and payload.get("type") == "token_count":
            self._tokens(payload, line)
        elif kind == "event_msg" and payload.get("type") == "thread_rolled_back":
            # The thread API's rollback (0.169): the last num_turns user turns leave the
            # model's context. Their messages stay here (history is kept); this says where.
            turns = int(payload.number("num_turns"))
            line.events.append(_message(
                "system", f"Codex rolled back the last {turns} turn(s): they left the"
                " model's context.", self._source(payload, at, rolled_back_turns=turns)))
        elif kind == "compacted":
            line.events.append(codex_compaction(payload))
        # event_msg (but token_count, thread_rolled_back), reasoning, ...: kept as lines
        # (restore writes them back), nothing for the session's view
        return line

    def _meta_line(self, p: TDict) -> None:
        if p.get("id"):
            self.facts.session_id = p.text("id")
        f = self.facts
        f.working_dir = p.text("cwd") or f.working_dir
        f.cli_version = p.text("cli_version") or f.cli_version
        git = p.obj("git")
        f.git_branch = git.text("branch") or f.git_branch
        f.first_git_branch = f.first_git_branch or f.git_branch
        for key in ("originator", "model_provider", "source", "forked_from_id",
                    "agent_nickname", "agent_role"):
            if isinstance(p.get(key), str):
                f.extra[key] = p[key]
        if git.text("commit_hash"):
            f.extra["git_commit"] = git.text("commit_hash")
        if git.text("repository_url"):
            f.extra["git_repository"] = git.text("repository_url")

    def _source(self, p: TDict, at: str | None, **more: Any) -> dict[str, Any]:
        source = {"timestamp": at, "id": p.get("id"), **more}
        return {"codex": {k: v for k, v in source.items() if v is not None}}

    def _item(self, p: TDict, at: str | None, line: Line) -> None:
        itype = p.text("type")
        if itype == "message":
            role = p.text("role", required=True)
            text = _text_blocks(plain(p.get("content")))
            if not text.strip():
                return
            mapped = {"developer": "system"}.get(role, role)
            if mapped not in ("user", "assistant", "system"):
                raise Problem(f"unknown role {role!r}", f"{p.path}.role")
            if mapped == "user" and text.lstrip().startswith(_INJECTED):
                mapped = "system"  # the CLI's context, not what the user typed
            if mapped == "user" and self.facts.task is None:
                self.facts.task = text.strip()[:200]
            line.events.append(_message(mapped, text, self._source(p, at, role=role)))
        elif itype in _CALLS:
            call_id = p.text("call_id") or p.text("id")
            if not call_id:
                raise Problem("missing", f"{p.path}.call_id")
            name = p.text("name") or ("shell" if itype == "local_shell_call" else "tool")
            args = p.get("arguments", p.get("input", p.get("action")))
            meta = self._source(p, at)
            meta["tool_calls"] = [{"id": call_id, "name": name, "input": plain(args)}]
            line.events.append(_message("assistant", calls_text(meta["tool_calls"]),
                                        meta))
        elif itype in _OUTPUTS:
            call_id = p.text("call_id", required=True)
            output = plain(p.get("output"))
            if isinstance(output, dict) and "content" in output:
                output = output["content"]
            text = _text_blocks(output) if isinstance(output, list) else _dumps(output)
            line.events.append(_message("tool", text if text.strip() else "(no output)",
                                        self._source(p, at), call_id))
        # reasoning (encrypted), web_search_call, ...: not the conversation

    def _tokens(self, p: TDict, line: Line) -> None:
        info = p.get("info")
        if not isinstance(info, TDict):
            return  # rate limits only
        total = plain(info.get("total_token_usage"))
        if total is not None and total == self._total:
            return  # the same figures again (written after each item): counted once
        self._total = total
        last = info.obj("last_token_usage")
        data: dict[str, Any] = {"input_tokens": int(last.number("input_tokens")),
                                "output_tokens": int(last.number("output_tokens"))}
        if self.facts.model:
            data["model"] = self.facts.model
        if data["input_tokens"] or data["output_tokens"]:
            line.events.append({"type": "tokens.recorded", "data": data})


PARSERS: dict[str, type[Parser]] = {"claude-code": ClaudeCode, "codex": Codex}


def regular(path: str) -> bool:
    """Whether `path` itself (not what a symlink names) is a regular file: a FIFO would
    block the reader, a symlink could lead anywhere; neither is a transcript."""
    try:
        return stat.S_ISREG(os.lstat(path).st_mode)
    except OSError:
        return False


def open_transcript(path: str) -> IO[bytes]:
    """Open a transcript to read, only if it is a regular file and not a symlink (checked
    on the file opened: one swapped in after listing is refused too)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOFOLLOW", 0)
                     | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise Problem("a symbolic link: not followed") from None
        raise
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise Problem("not a regular file (a FIFO, a device, ...): not read")
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def transcript_files(fmt: str, root: str) -> list[str]:
    """The transcripts under a root (or the one file given), oldest first within a
    session: rotated copies (`x.jsonl.1`) before the file itself. Symlinks (to files or
    folders) and FIFOs under the root are not followed; the root itself may be a link."""
    if os.path.isfile(root) or (os.path.exists(root) and not os.path.isdir(root)):
        return [root]  # one file given: opening it says what is wrong with it
    found: list[str] = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in files:
            if fmt == "codex" and not name.startswith("rollout-"):
                continue
            if re.search(r"\.jsonl(\.\d+)?$", name) and regular(os.path.join(folder, name)):
                found.append(os.path.join(folder, name))

    def order(path: str) -> tuple[str, int]:
        m = re.search(r"^(.*\.jsonl)(?:\.(\d+))?$", path)
        assert m is not None
        return m.group(1), -int(m.group(2)) if m.group(2) else 0

    return sorted(found, key=order)
