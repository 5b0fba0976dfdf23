"""Poisoning checks: what in a tool's definition speaks to the model rather than describing the tool.

``inspect(tool)`` reads every text a model is shown of a tool (its name, title, description, and the titles and
descriptions inside its input and output schemas) or of a prompt (its arguments' instead of schemas) and returns
``Finding``s, each with where it sits and why, quoting at most a short excerpt (invisible characters shown as
escapes):

  * ``instruction``: words aimed at the model: overriding its instructions, claiming precedence, keeping something
    from the user, reaching for secret files or credentials, sending data somewhere, steering other tools' calls;
  * ``invisible``: Unicode tag characters (their hidden text is decoded and shown), bidi controls, zero-width
    characters outside emoji sequences;
  * ``confusable``: a name that is not plain ASCII, a word mixing Latin with Cyrillic or Greek letters;
  * ``payload``: a data: URI, or a long base64 or hex run that decodes to text;
  * ``length`` (a note, not a poisoning by itself; ``long_description``): a description far longer than its
    server's other tools'.

A definition is ``poisoned`` when it has any finding but a note. The patterns are plain regular expressions, read
once; bench/bench_poisoning.py measures them on a labelled set they were not tuned on (docs/benchmarks.md).
"""

from __future__ import annotations

import base64
import binascii
import re
import statistics
import unicodedata
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import mcp_types as types

__all__ = ["Finding", "inspect", "long_description", "poisoned"]

NOTE_KINDS = frozenset({"length"})
LONG_FLOOR = 1500  # characters: a description shorter than this is never "far longer" than its peers
LONG_FACTOR = 5  # ... and one longer is, past this many times its peers' median

_SECRET_FILES = (
    r"(~|\$home|%userprofile%)[/\\]\.\w|\bid_(rsa|ed25519|ecdsa|dsa)\b|\.ssh\b|\.aws/credentials|\.netrc\b"
    r"|\.git-credentials|(^|[\s`'\"(])\.env\b|/etc/(passwd|shadow)\b|\bmcp\.json\b|serviceaccount/token"
    r"|\bkeychain\b|\bbrowser cookies\b|\bprivate key\b"
)
_TAKING = (
    r"\b(read|reading|open|cat|include|pass|send|paste|attach|fetch|upload|append|look up|contents? of|collect"
    r"|put|add|zip)\b"
)
_CHECKS: tuple[tuple[str, str | None, str], ...] = (
    # (a pattern, another that must be in the same sentence or None, why)
    (
        r"\b(ignore|disregard|forget|override|bypass)\b",
        r"\b(instructions?|prompts?|guidance|guidelines|rules)\b",
        "tells the model to set aside its instructions",
    ),
    (r"\bignore (toutes|todas|alle)\b", None, "tells the model to set aside its instructions"),
    (
        r"\b(precedence|priority) over (the )?(system|user|instructions|other tools|any other)"
        r"|\bno longer an?\b|\b(developer|jailbreak|god|dan) mode\b|\bpretend (you are|to be)\b|\bnew instructions\b"
        r"|\b(safety|security) (rules|checks) (are )?(suspended|off)|\bunrestricted (model|assistant|ai)\b",
        None,
        "tries to change who the model is or what it obeys",
    ),
    (
        r"<\s*/?\s*(important|system|instructions?|secret|hidden|admin|assistant)\s*>",
        None,
        "wraps text in a tag meant for the model",
    ),
    (
        r"\b(do not|don't|never|without)\b",
        r"\b(tell|telling|mention|mentioning|inform|informing|reveal|notify)\b[^.]{0,30}\b(the )?user\b",
        "tells the model to keep something from the user",
    ),
    (
        r"\b(silently|quietly|secretly|covertly)\s+(read|collect|send|include|add|look up|gather|copy|upload"
        r"|forward|take|put|change|replace)\b|\bnever ask\b[^.]{0,30}\bconfirm|\bmust not be told\b",
        None,
        "tells the model to act behind the user's back",
    ),
    (_SECRET_FILES, _TAKING, "asks the model to take secret files or keys"),
    (
        _TAKING,
        r"\b(the user's|your|any|all|every|the) (api keys?|passwords?|tokens|credentials|secrets|environment"
        r" variables?)\b|\b(the|whole|full|complete|entire|previous) (conversation|chat history|home directory)\b",
        "asks the model to hand over secrets or the conversation",
    ),
    (
        r"\b(send|upload|post|forward|exfiltrate|transmit|bcc|recipient)\b",
        r"https?://|\b\S+@\S+\.\w+|\+\d{6,}",
        "asks the model to send data to an address",
    ),
    (
        r"\b(before|after) (each|every) (use|call) of this tool\b|\binstead of any other\b"
        r"|\bnever (call|use)\b[^.]{0,60}\bagain\b|\bwhen using the \w+ tools?\b"
        r"|\bwhen the \w+ tool is used\b",
        None,
        "steers how the model uses other tools",
    ),
    (
        r"\bnote to the (assistant|model|ai)\b|^\s*assistant\s*:|\b(the|you) (assistant|model|ai) should\b"
        r"|\bfor the ai model\b|\bdecode\b[^.]{0,40}\b(follow|do what)",
        None,
        "addresses the model directly",
    ),
    (r"!\[[^\]]*\]\(https?://[^)]*\{", None, "asks for an image whose URL carries data"),
)
_FLAGS = re.IGNORECASE | re.MULTILINE
_COMPILED = tuple(
    (re.compile(first, _FLAGS), re.compile(second, _FLAGS) if second else None, why) for first, second, why in _CHECKS
)
_SENTENCES = re.compile(r"(?<=[.!?])\s+|\n+")

_BIDI = frozenset("\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069")
_ZERO_WIDTH = frozenset("\u200b\u200c\u200d\u2060\ufeff\u180e")
_BASE64 = re.compile(r"[A-Za-z0-9+/]{40,}={0,2}")
_HEX = re.compile(r"\b(?:[0-9a-fA-F]{2}){20,}\b")
_DATA_URI = re.compile(r"\bdata:[\w.+-]+/[\w.+-]+;base64,", re.IGNORECASE)
_WORD = re.compile(r"\w+")


@dataclass(frozen=True, slots=True)
class Finding:
    """Something in a definition that speaks to the model: where (``description``, ``inputSchema.properties.x``,
    ...), what kind, and why in plain words."""

    where: str
    kind: str
    reason: str

    def __str__(self) -> str:
        return f"{self.where}: {self.reason}"


def poisoned(findings: Sequence[Finding]) -> bool:
    """Whether ``findings`` hold any finding but a note."""
    return any(finding.kind not in NOTE_KINDS for finding in findings)


def inspect(tool: types.Tool | types.Prompt) -> list[Finding]:
    """What in ``tool``'s definition (a tool's or a prompt's) speaks to the model."""
    findings = (
        [Finding("name", "confusable", f"the name {_shown(tool.name)} is not plain ASCII")]
        if not (tool.name.isascii())
        else []
    )
    for where, text in _texts(tool):
        findings.extend(_inspect_text(where, text))
    return findings


def _texts(item: types.Tool | types.Prompt) -> Iterator[tuple[str, str]]:
    for key in ("title", "description"):
        value = getattr(item, key, None)
        if isinstance(value, str) and value:
            yield key, value
    if isinstance(item, types.Tool):
        yield from _schema_texts("inputSchema", item.input_schema)
        yield from _schema_texts("outputSchema", item.output_schema)
        return
    for argument in item.arguments or ():
        for key in ("title", "description"):
            value = getattr(argument, key, None)
            if isinstance(value, str) and value:
                yield f"arguments.{argument.name}.{key}", value


def _schema_texts(where: str, schema: Any) -> Iterator[tuple[str, str]]:
    if isinstance(schema, dict):
        for key, value in schema.items():
            if key in ("description", "title") and isinstance(value, str):
                yield f"{where}.{key}", value
            else:
                yield from _schema_texts(f"{where}.{key}", value)
    elif isinstance(schema, list):
        for index, value in enumerate(schema):
            yield from _schema_texts(f"{where}[{index}]", value)


def _inspect_text(where: str, text: str) -> Iterator[Finding]:
    yield from _invisible(where, text)
    visible = "".join(ch for ch in text if unicodedata.category(ch) != "Cf")
    sentences = _SENTENCES.split(visible)
    for first, second, why in _COMPILED:
        match = next(
            (
                m
                for sentence in sentences
                if (m := first.search(sentence)) and (second is None or second.search(sentence))
            ),
            None,
        )
        if match is not None:
            yield Finding(where, "instruction", f"{why}: {_excerpt(match.string, match)}")
    mixed = [word for word in _WORD.findall(visible) if len(_scripts(word)) > 1]
    if mixed:
        yield Finding(where, "confusable", f"mixes Latin with Cyrillic or Greek letters: {_shown(mixed[0])}")
    yield from _payloads(where, visible)


def _invisible(where: str, text: str) -> Iterator[Finding]:
    tags = "".join(chr(ord(ch) - 0xE0000) for ch in text if 0xE0000 <= ord(ch) <= 0xE007F)
    if tags:
        yield Finding(where, "invisible", f"carries invisible Unicode tag characters that read {tags[:80]!r}")
    if any(ch in _BIDI for ch in text):
        yield Finding(where, "invisible", "carries bidirectional control characters that reorder what is shown")
    hidden = [i for i, ch in enumerate(text) if ch in _ZERO_WIDTH and not _in_emoji(text, i)]
    if hidden:
        yield Finding(
            where, "invisible", f"carries {len(hidden)} zero-width character(s): {_excerpt_at(text, hidden[0])}"
        )


def _payloads(where: str, text: str) -> Iterator[Finding]:
    if _DATA_URI.search(text):
        yield Finding(where, "payload", "carries a base64 data: URI")
        return
    for run in _BASE64.findall(text):
        decoded = _decoded(run, base64.b64decode)
        if decoded:
            yield Finding(where, "payload", f"carries base64 text that decodes to {decoded[:60]!r}")
            return
    for run in _HEX.findall(text):
        decoded = _decoded(run, bytes.fromhex)
        if decoded:
            yield Finding(where, "payload", f"carries hex that decodes to {decoded[:60]!r}")
            return


def _decoded(run: str, decode: Any) -> str:
    """``run`` decoded, if that gives mostly words (a key or a hash gives bytes)."""
    try:
        text = str(decode(run + "=" * (-len(run) % 4) if decode is base64.b64decode else run).decode("utf-8"))
    except (binascii.Error, ValueError, UnicodeDecodeError):
        return ""
    printable = sum(ch.isalpha() or ch == " " for ch in text)
    return text if len(text) >= 20 and printable >= 0.85 * len(text) and " " in text else ""


def long_description(tool: types.Tool | types.Prompt, peers: Sequence[types.Tool | types.Prompt]) -> Iterator[Finding]:
    """A note when ``tool``'s description is far longer than those of ``peers`` (its server's other tools)."""
    size = len(tool.description or "")
    others = [len(peer.description or "") for peer in peers if peer.name != tool.name]
    if size < LONG_FLOOR or not others:
        return
    median = statistics.median(others) or 1
    if size > LONG_FACTOR * median:
        yield Finding("description", "length", f"is {size} characters, {size / median:.0f}x its server's median")


def _scripts(word: str) -> set[str]:
    scripts: set[str] = set()
    for ch in word:
        if ch.isalpha() and not ch.isascii():
            name = unicodedata.name(ch, "")
            scripts.update(s for s in ("CYRILLIC", "GREEK") if name.startswith(s))
        elif ch.isalpha():
            scripts.add("LATIN")
    return scripts if "LATIN" in scripts else set()


def _in_emoji(text: str, index: int) -> bool:
    """A zero-width joiner (or variation selector's neighbour) between two symbols: part of an emoji sequence."""
    if text[index] != "\u200d":
        return False
    before, after = text[index - 1 : index], text[index + 1 : index + 2]
    return bool(before and after) and unicodedata.category(before) == "So" and unicodedata.category(after) == "So"


def _excerpt(text: str, match: re.Match[str]) -> str:
    """The match with about 20 characters either side, cut at word boundaries."""
    start = text.rfind(" ", 0, max(0, match.start() - 20)) + 1
    end = text.find(" ", min(len(text), match.end() + 20))
    end = len(text) if end < 0 else end
    return _shown(("..." if start else "") + " ".join(text[start:end].split()) + ("..." if end < len(text) else ""))


def _excerpt_at(text: str, index: int) -> str:
    return _shown(text[max(0, index - 15) : index + 15])


def _shown(text: str) -> str:
    """``text`` quoted, with every invisible or non-ASCII letter that could pass for another shown as an escape."""
    return (
        "'"
        + "".join(
            ch if ch.isprintable() and (ch.isascii() or not ch.isalpha() or _plain(ch)) else f"\\u{ord(ch):04x}"
            for ch in text[:120]
        )
        + "'"
    )


def _plain(ch: str) -> bool:
    return not unicodedata.name(ch, "").startswith(("CYRILLIC", "GREEK"))
