"""Credentials out of event data before anything stores it: `[redacted:<kind>:<digest>]`.

Each rule has needles, lowercase literals one of which any match contains. The data's
JSON, lowercased, is searched for all needles at once (one compiled alternation of
literals); nearly every event has none, and costs that scan alone. Data with a needle is
walked as JSON: every string is searched by the rules whose needles it holds (a rule per
pass, each a compiled pattern with a literal to look for), and an object's string value
is replaced whole when its key's name says secret. Opaque values are never touched: a
stream chunk's `base64`, a graph checkpoint's or write's serialized values (`Typed`: type
and base64 bytes). The digest is keyed (BLAKE2b's MAC mode with the host key, 8 hex digits), so
two mentions of one secret can be told apart from two secrets without either being read.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Final

import msgspec

from sessiond_schemas.events import (
    Event,
    EventData,
    SessionCreated,
    SessionForked,
    decode_data,
    moved,
)
from sessiond_schemas.export import chain_link

# A value's characters in NAME=value: up to a space, a quote or a separator.
_V = r"[^\s\"'`;,&()\[\]{}<>]"


@dataclass(frozen=True, slots=True)
class Rule:
    """One kind of credential: its pattern (group "s": the part replaced, else the whole
    match), needles (lowercase literals every match contains; none: always searched), and
    whether the pattern is matched against the lowercased text (names in any case)."""

    kind: str
    pattern: re.Pattern[str]
    needles: tuple[str, ...] = ()
    lowered: bool = False
    # A match followed by one of these is no credential (checked after the match, not by
    # a lookahead: a failed lookahead after a long run would scan it again from each
    # candidate in it).
    not_before: str = ""
    digits: bool = False  # a match holds a digit, or it is a word (sk-learn-...)


def _rule(kind: str, pattern: str, *needles: str, lowered: bool = False,
          not_before: str = "", digits: bool = False) -> Rule:
    return Rule(kind, re.compile(pattern), needles, lowered, not_before, digits)


# In priority order: where two matches overlap, the earlier rule's wins.
RULES: Final[tuple[Rule, ...]] = (
    # Its body: base64 and the headers of an encrypted key (Proc-Type: 4,ENCRYPTED), up to
    # an END line (or to where the text stops being one: a key cut off); possessive, so
    # that a text of many BEGIN lines costs one pass.
    _rule("private-key", r"-----BEGIN[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----"
                         r"(?:[A-Za-z0-9+/=\s:,.]|-(?!----))*+"
                         r"(?:-----END[A-Z0-9 ]{0,40}PRIVATE KEY(?: BLOCK)?-----)?",
          "-----begin"),
    _rule("aws-access-key", r"\b(?:AKIA|ASIA|ABIA|ACCA)[A-Z2-7]{16}\b",
          "akia", "asia", "abia", "acca"),
    _rule("azure-storage-key", r"(?i:AccountKey)=(?P<s>[A-Za-z0-9+/]{86}==)", "accountkey="),
    _rule("azure-sas", r"[?&]sig=(?P<s>[A-Za-z0-9%+/=]{40,})", "sig="),
    _rule("azure-client-secret", r"(?<![A-Za-z0-9_~.-])[A-Za-z0-9_~.-]{3}[0-9]Q~"
                                 r"[A-Za-z0-9_~.-]{31,34}(?![A-Za-z0-9_~.-])", "q~"),
    _rule("anthropic-key", r"\bsk-ant-[A-Za-z0-9_-]{20,}", "sk-ant-"),
    _rule("openai-key", r"\bsk-(?!ant-)(?:proj-|svcacct-|admin-)?[A-Za-z0-9_-]{32,}+", "sk-",
          digits=True),
    _rule("google-api-key", r"\bAIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])", "aiza"),
    _rule("groq-key", r"\bgsk_[A-Za-z0-9]{40,}\b", "gsk_"),
    _rule("xai-key", r"\bxai-[A-Za-z0-9]{60,}\b", "xai-"),
    _rule("huggingface-token", r"\bhf_[A-Za-z0-9]{30,}\b", "hf_"),
    _rule("github-token", r"\b(?:gh[pousr]_[A-Za-z0-9]{36,}|github_pat_[A-Za-z0-9_]{50,})\b",
          "ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_"),
    _rule("gitlab-token", r"\bglpat-[A-Za-z0-9_-]{20,}", "glpat-"),
    _rule("npm-token", r"\bnpm_[A-Za-z0-9]{36}\b", "npm_"),
    _rule("pypi-token", r"\bpypi-[A-Za-z0-9_-]{50,}", "pypi-"),
    _rule("slack-token", r"\bxox[abposre]-[A-Za-z0-9-]{10,}", "xox"),
    _rule("slack-webhook", r"https://hooks\.slack\.com/services/(?P<s>[A-Za-z0-9/_-]{20,})",
          "://hooks.slack.com"),
    _rule("stripe-key", r"\b(?:sk|rk)_(?:live|test)_[A-Za-z0-9]{20,}\b", "sk_", "rk_"),
    _rule("jwt", r"\beyJ[A-Za-z0-9_-]{10,}+\.eyJ[A-Za-z0-9_-]{10,}+\.[A-Za-z0-9_-]*+", "eyj"),
    _rule("bearer-token", r"\bbearer[ \t]+(?P<s>[a-z0-9._~+/-]{20,}=*)", "bearer",
          lowered=True),
    _rule("url-password", r"\b[A-Za-z][A-Za-z0-9+.-]{0,30}://[^\s:/@\"'<>\[]++:(?P<s>[^\s@/\"'<>]++)@",
          "://"),
    # NAME=value, NAME: value, NAME="value": a name that ends in a secret-saying word (the
    # pattern starts at the word: one that started at the name would scan it again from
    # each of its characters, quadratic in a long run of them), a
    # value of at least 6 characters that is not a number, a reference ($X, <x>, %x%,
    # {{x}}), a mark's digest ([redacted:api-key:0a1b2c3d]), a dotted name
    # (settings.SECRET_KEY) or a call or subscript (getenv(...), os.environ[...]).
    _rule("secret-assignment",
          r"(?:secret|passw(?:or)?d|pwd|passphrase|token|api[_-]?key|apikey"
          r"|access[_-]?key|private[_-]?key|credentials?|auth)(?:[_-]?(?:id|key|value))?"
          r"[\"']?[ \t]*[=:][ \t]*[\"']?(?![$<*%])(?![0-9a-f]{8}\])"
          rf"(?![0-9]++(?!{_V}))(?![a-z_][a-z0-9_]*+(?:\.[a-z_][a-z0-9_]*+)++(?!{_V}))"
          rf"(?P<s>{_V}{{6,}}+)",
          "secret", "passw", "pwd", "passphrase", "token", "apikey", "api_key", "api-key",
          "access_key", "access-key", "accesskey", "private_key", "private-key",
          "privatekey", "credential", "auth", lowered=True, not_before="([{"),
)
KINDS: Final = frozenset(r.kind for r in RULES)

# An object key whose value is a secret: {"password": "..."}, {"OPENAI_API_KEY": "..."}.
SECRET_NAME: Final = re.compile(
    r"(?i)(?:secret|passw(?:or)?d|pwd|passphrase|token|api[_-]?key|apikey"
    r"|access[_-]?key|private[_-]?key|credentials?|auth[_-]?key|client[_-]?secret)"
    r"(?:[_-]?(?:id|key|value))?$")

# What any rule's needles contain, over the data's lowercased JSON: one alternation of
# few, short literals (a trie of every needle costs more in `re`). "tokens" alone (as in
# input_tokens) is not one: a name ending in token is.
_NEEDLES: Final = re.compile(
    rb"key|pass|pwd|secret|token(?!s)|auth|credential|bearer|://|-----begin|sig=|q~|akia"
    rb"|asia|abia|acca|aiza|eyj|sk[-_]|rk_|hf_|gh[pousr]_|github_pat_|glpat-|gsk_|xai-"
    rb"|npm_|pypi-|xox")

# Fields never searched, by event type: serialized bytes whose format sessiond cannot
# write back (base64 of the producer's serialization).
OPAQUE: Final[Mapping[str, frozenset[str]]] = {
    "stream.chunk": frozenset({"base64"}),
    "graph.checkpoint": frozenset({"checkpoint", "metadata_typed", "blobs"}),
    "graph.writes": frozenset({"writes"}),
}
_MARK: Final = "[redacted:"
_DIGIT: Final = re.compile("[0-9]")
_ASCII_LOWER: Final = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")
_json = msgspec.json.Encoder()
_canonical = msgspec.json.Encoder(order="sorted")


@dataclass(frozen=True, slots=True)
class Setting:
    """How one namespace is redacted: on or off, with extra rules (kind -> pattern)."""

    enabled: bool = True
    patterns: Mapping[str, str] = field(default_factory=dict)


def check_patterns(patterns: Mapping[str, str]) -> str | None:
    """Why extra patterns cannot be used (a kind's name, a pattern that does not compile);
    None when they can."""
    for kind, pattern in patterns.items():
        if not re.fullmatch(r"[a-z0-9][a-z0-9-]{0,39}", kind):
            return f"redaction kind {kind!r}: lowercase letters, digits and '-', at most 40"
        try:
            re.compile(pattern)
        except re.error as exc:
            return f"redaction pattern {kind!r} does not compile: {exc}"
    return None


def _lower(text: str) -> str:
    """ASCII letters lowercased, nothing else: positions stay those of `text`."""
    return text.lower() if text.isascii() else text.translate(_ASCII_LOWER)


class Redactor:
    """Replaces credentials in event data; counts what it replaced, by kind."""

    def __init__(self, key: bytes, settings: Mapping[str, Setting] | None = None, *,
                 digest: bool = True) -> None:
        self.key = key
        self.digest = digest
        self.settings: dict[str, Setting] = dict(settings or {})
        self.counts: Counter[str] = Counter()
        self.events = 0  # events with at least one replacement
        self._rules: dict[tuple[tuple[str, str], ...], tuple[Rule, ...]] = {}

    def setting(self, namespace: str) -> Setting:
        """The namespace's setting: its own, else the longest "prefix*" match, else on."""
        found = self.settings.get(namespace)
        if found is not None:
            return found
        matches = [(len(p), s) for p, s in self.settings.items()
                   if p.endswith("*") and namespace.startswith(p[:-1])]
        return max(matches, key=lambda m: m[0])[1] if matches else Setting()

    def rules(self, setting: Setting) -> tuple[Rule, ...]:
        extra = tuple(sorted(setting.patterns.items()))
        rules = self._rules.get(extra)
        if rules is None:
            rules = self._rules[extra] = RULES + tuple(
                Rule(kind, re.compile(pattern)) for kind, pattern in extra)
        return rules

    def redact_json(self, event_type: str, namespace: str, data_json: bytes) -> Any | None:
        """The data (its JSON) with credentials replaced, as builtins; None when there was
        nothing to replace (the common case: the JSON is not even decoded)."""
        setting = self.setting(namespace)
        if not setting.enabled:
            return None
        if not setting.patterns and _NEEDLES.search(data_json.lower()) is None:
            return None
        counts: Counter[str] = Counter()
        walk = _Walk(self, self.rules(setting), counts)
        out = walk.value(msgspec.json.decode(data_json), OPAQUE.get(event_type, ()))
        if not counts:
            return None
        self.counts.update(counts)
        self.events += 1
        return out

    def text(self, text: str, namespace: str = "") -> str:
        """`text` with credentials replaced (what redact_json does to each string)."""
        return _Walk(self, self.rules(self.setting(namespace)), self.counts).string(text)

    def mark(self, kind: str, secret: str) -> str:
        if not self.digest:
            return f"{_MARK}{kind}]"
        tag = hashlib.blake2b(secret.encode(), key=self.key, digest_size=4).hexdigest()
        return f"{_MARK}{kind}:{tag}]"


class _Walk:
    """One walk of a JSON value, replacing and counting."""

    def __init__(self, redactor: Redactor, rules: tuple[Rule, ...],
                 counts: Counter[str]) -> None:
        self.redactor = redactor
        self.rules = rules
        self.counts = counts

    def value(self, value: Any, skip: Iterable[str] = ()) -> Any:
        if isinstance(value, str):
            return self.string(value)
        if isinstance(value, list):
            return [self.value(v) for v in value]
        if isinstance(value, dict):
            out = {}
            for k, v in value.items():
                if k in skip:
                    out[k] = v
                elif isinstance(v, str) and SECRET_NAME.search(k) and _secret_like(v):
                    out[k] = self.string(v)
                    if out[k] == v:  # no rule knows it: the name says what it is
                        self.counts["secret-assignment"] += 1
                        out[k] = self.redactor.mark("secret-assignment", v)
                else:
                    out[k] = self.value(v)
            return out
        return value

    def string(self, text: str) -> str:
        """`text` with every rule's matches replaced; overlaps go to the earlier rule."""
        if len(text) < 6:
            return text
        low = _lower(text)
        spans: list[tuple[int, int, int]] = []  # start, end, rule
        for index, rule in enumerate(self.rules):
            if rule.needles and not any(n in low for n in rule.needles):
                continue
            for m in rule.pattern.finditer(low if rule.lowered else text):
                group = "s" if "s" in rule.pattern.groupindex and m.start("s") >= 0 else 0
                start, end = m.span(group)
                if text.startswith(_MARK, start) or (
                        end < len(text) and text[end] in rule.not_before) or (
                        rule.digits and not _DIGIT.search(text, start, end)):
                    continue
                spans.append((start, end, index))
        if not spans:
            return text
        spans.sort(key=lambda s: (s[0], s[2]))
        out: list[str] = []
        at = 0
        for start, end, index in spans:
            if start < at:
                continue  # inside a match already replaced
            kind = self.rules[index].kind
            self.counts[kind] += 1
            out += (text[at:start], self.redactor.mark(kind, text[start:end]))
            at = end
        out.append(text[at:])
        return "".join(out)


def _secret_like(value: str) -> bool:
    """A string value under a secret-saying key that is a secret: one token of at least 6
    characters, not a number, not already redacted, not a reference."""
    return (len(value) >= 6 and not value.startswith((_MARK, "$", "<", "*", "{"))
            and not any(c.isspace() for c in value) and not value.isdigit())


def canonical(value: Any) -> bytes:
    """Canonical JSON (what the hash covers) of redacted builtins."""
    return _canonical.encode(value)


def encoded(value: Any) -> bytes:
    """The stored JSON of redacted builtins (keys in their order)."""
    return _json.encode(value)


def redact_data(redactor: Redactor | None, event_type: str, namespace: str,
                data: EventData, data_json: bytes, hash_json: bytes,
                ) -> tuple[EventData, bytes, bytes]:
    """An event's data, its stored JSON and its canonical JSON, redacted (the same three
    when there was nothing to redact). Raises msgspec.ValidationError when the redacted
    data no longer fits its type (a field whose format a mark breaks)."""
    if redactor is None:
        return data, data_json, hash_json
    value = redactor.redact_json(event_type, namespace, data_json)
    if value is None:
        return data, data_json, hash_json
    return decode_data(event_type, value), encoded(value), canonical(value)


def redact_history(redactor: Redactor | None, events: list[Event],
                   key: bytes | None = None) -> list[Event]:
    """Events of another store (an import) with credentials replaced; from the first one
    changed on, the chain is hashed again, sealed with `key` (the events before it keep
    their hashes)."""
    if redactor is None or not events:
        return events
    first = events[0].data
    namespace = first.namespace if isinstance(first, SessionCreated) else "local"
    out: list[Event] = []
    prev: str | None = None  # set once an event changed: the hash the next one chains on
    for given in events:
        event = given
        value = redactor.redact_json(event.type, namespace, bytes(event.data_json))
        if value is not None:
            event = moved(event, data_json=msgspec.Raw(encoded(value)))
            prev = prev if prev is not None else (out[-1].hash if out else _start(event))
        if prev is not None:
            event = moved(event, hash=chain_link(prev, event, key))
            prev = event.hash
        out.append(event)
    return out


def _start(event: Event) -> str:
    """The hash a history's first event chains on: its fork source's, or none."""
    data = event.data
    return data.from_.hash if isinstance(data, SessionForked) else ""
