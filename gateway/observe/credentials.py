"""Credentials in text: a small pattern set for the kinds an agent pastes or a tool leaks (cloud keys, code-host and
chat tokens, private keys, JWTs, connection strings with a password), found without keeping their values.

Each pattern starts from a literal marker (``AKIA``, ``ghp_``, ``-----BEGIN``, ``://``...), so a text holding none
of them costs one scan for all the markers at once and no pattern's regular expression; a 100 KB answer is scanned in
about a millisecond (bench/secrets_scan.py). A ``Finding`` is a kind and a location (a JSON path such as
``arguments.note`` or ``content[0].text``), never the value: ``redact`` replaces each match (a connection string's
password only) with ``[redacted KIND]``. detect-secrets was measured and left out: 3.7 s for 100 KB per call, and its
entropy rules flag every hex id.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Final

__all__ = ["KINDS", "Finding", "find", "redact", "redact_value", "scan_value"]


@dataclass(frozen=True, slots=True)
class _Pattern:
    kind: str
    markers: tuple[str, ...]  # literals one of which every match contains: the cheap first test
    regex: re.Pattern[str]  # a group named ``secret``, when present, is what redaction replaces
    word: bool = True  # it starts a word: a match glued to a word before it is part of something else


_PATTERNS: Final = (
    _Pattern("aws_access_key", ("AKIA", "ASIA"), re.compile(r"A[KS]IA[0-9A-Z]{16}(?![0-9A-Za-z])")),
    _Pattern(
        "aws_secret_key",
        ("ecret", "ECRET"),
        re.compile(r"(?i)aws.{0,20}?secret.{0,20}?[\"'=:\s]\s*[\"']?(?P<secret>[A-Za-z0-9/+]{40})(?![A-Za-z0-9/+])"),
    ),
    _Pattern("google_api_key", ("AIza",), re.compile(r"AIza[0-9A-Za-z_-]{35}(?![0-9A-Za-z_-])")),
    _Pattern("github_token", ("ghp_", "gho_", "ghu_", "ghs_", "ghr_"), re.compile(r"gh[pousr]_[A-Za-z0-9]{36,255}")),
    _Pattern("github_token", ("github_pat_",), re.compile(r"github_pat_[A-Za-z0-9_]{60,255}")),
    _Pattern("gitlab_token", ("glpat-", "glptt-", "gldt-"), re.compile(r"gl(?:pat|ptt|dt)-[A-Za-z0-9_-]{20,}")),
    _Pattern("slack_token", ("xox",), re.compile(r"xox[abposr]-[A-Za-z0-9-]{10,}")),
    _Pattern(
        "slack_webhook",
        ("hooks.slack.com",),
        re.compile(r"https://hooks\.slack\.com/services/T[A-Za-z0-9_]+/B[A-Za-z0-9_]+/[A-Za-z0-9_]+"),
        word=False,
    ),
    _Pattern("stripe_key", ("k_live_",), re.compile(r"[sr]k_live_[0-9A-Za-z]{20,}")),
    _Pattern("ai_api_key", ("sk-ant-", "sk-proj-"), re.compile(r"sk-(?:ant|proj)-[A-Za-z0-9_-]{20,}")),
    _Pattern(
        "private_key",
        ("PRIVATE KEY",),
        re.compile(
            r"-----BEGIN (?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?-----.*?(?:-----END (?:[A-Z0-9]+ )*PRIVATE KEY"
            r"(?: BLOCK)?-----|\Z)",
            re.DOTALL,
        ),
        word=False,
    ),
    _Pattern("jwt", ("eyJ",), re.compile(r"eyJ[A-Za-z0-9_-]{8,}\.eyJ[A-Za-z0-9_-]{8,}\.[A-Za-z0-9_-]{8,}")),
    _Pattern(
        "connection_string",
        ("://",),
        re.compile(r"://[^\s:/@\"'<>]{1,256}:(?P<secret>[^\s@/\"'<>]{1,256})@[^\s@/\"'<>]"),
        word=False,
    ),
)
# Each regex starts with its literal, so the engine skips to it; a leading ``\b`` would make it try every position
# (100 times slower): a ``word`` match glued to a word before it is dropped in ``_matches`` instead.
ANY_MARKER: Final = re.compile("|".join(re.escape(m) for p in _PATTERNS for m in p.markers))
"""Every marker at once: one scan in C tells most texts (a log line's fields, an ordinary answer) hold none."""
KINDS: Final = tuple(dict.fromkeys(p.kind for p in _PATTERNS))
"""The kinds of credential found."""


@dataclass(frozen=True, slots=True)
class Finding:
    """A credential's kind and where it was (a JSON path); never its value."""

    kind: str
    location: str

    def __str__(self) -> str:
        return f"{self.kind} at {self.location}"


def _matches(text: str) -> Iterator[tuple[str, int, int]]:
    if ANY_MARKER.search(text) is None:
        return
    for pattern in _PATTERNS:
        if not any(marker in text for marker in pattern.markers):
            continue
        for match in pattern.regex.finditer(text):
            before = text[match.start() - 1] if match.start() > 0 else " "
            if pattern.word and (before.isalnum() or before == "_"):
                continue
            if pattern.kind == "connection_string" and match.group("secret").startswith(("${", "[redacted")):
                continue  # a placeholder (``${DB_PASSWORD}``) or a password masked already, not a password
            group = "secret" if "secret" in pattern.regex.groupindex else 0
            yield pattern.kind, match.start(group), match.end(group)


def find(text: str) -> list[str]:
    """The kinds of credential in ``text``, each once."""
    return list(dict.fromkeys(kind for kind, _, _ in _matches(text)))


def redact(text: str) -> str:
    """``text`` with each credential (a connection string's password only) replaced by ``[redacted KIND]``."""
    spans = sorted(_matches(text), key=lambda m: m[1])
    if not spans:
        return text
    out, at = [], 0
    for kind, start, end in spans:
        if start < at:
            continue  # inside a span already replaced (a JWT inside a private key block, say)
        out.append(text[at:start])
        out.append(f"[redacted {kind}]")
        at = end
    out.append(text[at:])
    return "".join(out)


def scan_value(value: Any, location: str) -> list[Finding]:
    """Every credential in the strings of a JSON value (dict keys aside), with the path of the string it is in."""
    if isinstance(value, str):
        return [Finding(kind, location) for kind in find(value)]
    if isinstance(value, dict):
        return [f for key, item in value.items() for f in scan_value(item, f"{location}.{key}")]
    if isinstance(value, list | tuple):
        return [f for i, item in enumerate(value) for f in scan_value(item, f"{location}[{i}]")]
    return []


def redact_value(value: Any) -> Any:
    """A JSON value with every credential in its strings redacted (``redact``); other values as they are."""
    if isinstance(value, str):
        return redact(value)
    if isinstance(value, dict):
        return {key: redact_value(item) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return [redact_value(item) for item in value]
    return value
