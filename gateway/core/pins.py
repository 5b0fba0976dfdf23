"""Pinned tool definitions: what a downstream server's tool said when the operator approved it, and what is served
when it says something else.

A tool's ``digest`` covers its own name, title, description, input and output schemas and annotations (its definition as
the server lists it, before the file's renames); a prompt's, its name, title, description and arguments (kept under
``prompt:NAME``). Per server, ``pin`` (else ``gateway.pin``) decides what an
unapproved definition does: ``off`` nothing; ``warn`` it is served, and the catalog keeps a problem saying it is new
or changed; ``enforce`` a new tool is withheld and a changed one is served as it was approved (its calls still go to
the server's tool of that name), with the same problem. An unapproved definition's problem also says what in it
speaks to the model (poisoning.py's findings, read once per definition). ``gateway pins approve`` records digests
and definitions (ledger/pins.py); ``gateway pins diff`` shows what waits.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

import mcp_types as types

from gateway.config import Federation
from gateway.core.poisoning import Finding, inspect, long_description
from gateway.ledger.pins import PinRow, read_pins

__all__ = [
    "PROMPT_KEY",
    "Item",
    "Pending",
    "Pin",
    "PinCheck",
    "approval_rows",
    "definition",
    "definition_diff",
    "digest",
    "findings",
    "pin_key",
    "pins_of",
]

Item = types.Tool | types.Prompt
ItemT = TypeVar("ItemT", types.Tool, types.Prompt)
"""What a pin covers: a server's tool or prompt."""

_DEFINED = ("name", "title", "description", "inputSchema", "outputSchema", "annotations", "arguments")
PROMPT_KEY = "prompt:"
"""A prompt's pin is kept under ``prompt:NAME`` (a tool's name cannot hold a colon: they never meet)."""


def pin_key(item: Item) -> str:
    """The name ``item``'s pin is kept and approved under: a tool's name, or ``prompt:`` and a prompt's."""
    return PROMPT_KEY + item.name if isinstance(item, types.Prompt) else item.name


def definition(item: Item) -> dict[str, Any]:
    """The parts of ``item`` a pin covers, in wire shape: a tool's name, title, description, schemas and
    annotations; a prompt's name, title, description and arguments."""
    dumped = item.model_dump(by_alias=True, mode="json", exclude_none=True)
    return {key: dumped[key] for key in _DEFINED if key in dumped}


def definition_diff(approved: Mapping[str, Any] | None, tool: Item) -> str:
    """A unified diff from the approved definition (None: nothing approved yet) to ``tool``'s now, keys sorted."""
    was = json.dumps(dict(approved), indent=2, sort_keys=True).splitlines() if approved is not None else []
    now = json.dumps(definition(tool), indent=2, sort_keys=True).splitlines()
    return "\n".join(difflib.unified_diff(was, now, "approved", "now", lineterm=""))


def approval_rows(server: str, items: Sequence[Item], by: str) -> list[PinRow]:
    """The ledger's pins for ``items`` of ``server`` as they are now, approved by ``by`` (ledger/pins.py
    ``write_pins`` records them)."""
    now = time.time()
    return [(server, pin_key(t), digest(t), json.dumps(definition(t)), by, now) for t in items]


def digest(tool: Item) -> str:
    """The SHA-256 (hex) of ``definition(tool)`` as canonical JSON."""
    text = json.dumps(definition(tool), sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


@dataclass(frozen=True, slots=True)
class Pin:
    """An approved definition: the server, the tool's own name, its digest and definition, who and when."""

    server: str
    tool: str
    digest: str
    definition: Mapping[str, Any]
    approved_by: str | None = None
    approved_at: float = 0.0


@dataclass(frozen=True, slots=True)
class Pending:
    """A server tool new or changed since approval, as one catalog build found it."""

    server: str
    tool: str  # its pin's name (pin_key): a tool's name, or prompt:NAME
    digest: str
    change: str  # "new" or "changed"
    mode: str  # "warn" (served as it is) or "enforce" (withheld, or served as approved)
    findings: int  # what in it speaks to the model (poisoning.py), notes included


@dataclass
class PinCheck:
    """One catalog build's view of the pins: ``admit`` each server tool; ``problems`` and ``pending`` what waits
    for approval."""

    config: Federation
    pins: Mapping[tuple[str, str], Pin]
    problems: list[str] = field(default_factory=list)
    pending: list[Pending] = field(default_factory=list)

    def mode(self, server: str) -> str:
        own = self.config.servers.get(server)
        return own.pin if own is not None and own.pin is not None else self.config.gateway.pin

    def admit(self, server: str, tool: ItemT, peers: Sequence[ItemT] = ()) -> ItemT | None:
        """``tool`` (a tool or a prompt) as it is served under ``server``'s mode: itself, its approved definition, or
        None (withheld). ``peers``: the server's others of its kind (what "far longer" means for a description)."""
        if server not in self.config.servers:
            return tool  # adapters and the wiki: their definitions are the file's and the gateway's own
        mode = self.mode(server)
        if mode == "off":
            return tool
        key, name = digest(tool), pin_key(tool)
        pinned = self.pins.get((server, name))
        if pinned is not None and pinned.digest == key:
            return tool
        what = "prompt" if isinstance(tool, types.Prompt) else "tool"
        label, enforce = f"{what} {server}/{tool.name}", mode == "enforce"
        found = findings(tool, key, peers)
        said = f"; {len(found)} finding(s), first {found[0]}" if found else ""
        change = "new" if pinned is None else "changed"
        self.pending.append(Pending(server, name, key, change, mode, len(found)))
        if pinned is None:
            held = "withheld" if enforce else "served"
            self.problems.append(f"{label} is new and not approved (pin: {mode}): {held}{said}; see gateway pins diff")
            return None if enforce else tool
        held = "the approved definition is served" if enforce else "served as changed"
        self.problems.append(
            f"{label} changed since it was approved (pin: {mode}): {held}{said}; see gateway pins diff"
        )
        return type(tool).model_validate(dict(pinned.definition)) if enforce else tool


_FOUND: dict[str, tuple[Finding, ...]] = {}
_FOUND_MAX = 50_000


def findings(tool: Item, key: str | None = None, peers: Sequence[Item] = ()) -> tuple[Finding, ...]:
    """What in ``tool``'s definition speaks to the model (poisoning.py), read once per definition (``key``, its
    digest), and the length note among ``peers``."""
    key = key or digest(tool)
    found = _FOUND.get(key)
    if found is None:
        if len(_FOUND) >= _FOUND_MAX:
            _FOUND.clear()
        found = _FOUND[key] = tuple(inspect(tool))
    return found + tuple(long_description(tool, peers))


def pins_of(config: Federation) -> dict[tuple[str, str], Pin]:
    """The approved pins in the ledger (``gateway.audit.url``, else ``gateway.audit.path``); none while every
    server's pin is off.

    Raises:
        AuditError: a PostgreSQL ledger cannot be read.
    """
    if config.gateway.pin == "off" and all(s.pin in (None, "off") for s in config.servers.values()):
        return {}
    return {
        (server, tool): Pin(server, tool, digest_, json.loads(text), by, at)
        for server, tool, digest_, text, by, at in read_pins(config.gateway.audit.url or config.gateway.audit.path)
    }
