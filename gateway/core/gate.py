"""What each client may see: the context gate.

Some tools only make sense for a client with a large context window (``wiki_read_all`` returns the whole corpus).
The reference system only *advises* small clients against them; here the gate is enforced: such tools are listed
and callable only for clients whose declared context is at or above ``clients.large_context_tokens``, and any tool
may declare the window it needs (``clients.min_context``); ``ClientPolicy.listing`` filters those from a list.

How a client declares its context, in order:
  1. the request header named by ``clients.context_header`` (default ``X-Context-Window``), a number of tokens —
     explicit and per request, so a user can set it in any client that lets them add headers (the Inspector's
     ``--header``), or a proxy can add it;
  2. otherwise its ``clientInfo`` from ``initialize`` matched against ``clients.known`` (``name`` or
     ``name@version`` glob patterns, case-insensitive) — every MCP client sends it, no setup needed;
  3. otherwise the client is unknown, and an unknown client counts as small.

A small client is not told about the tools it cannot see either: ``note_without`` takes the router note's items
that name a gated tool out of the descriptions in its listing.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Collection, Mapping
from typing import Any

from gateway.calls import Declared
from gateway.config import Clients

__all__ = ["ClientPolicy", "note_without", "with_note"]


def with_note(tool: Mapping[str, Any], note: str, replacement: str) -> Mapping[str, Any]:
    """A dumped tool whose description ends with ``note``, with ``replacement`` in its place."""
    description = tool.get("description")
    if not note or note == replacement or not isinstance(description, str) or not description.endswith(note):
        return tool
    return {**tool, "description": description[: len(description) - len(note)] + replacement}


_ITEM = re.compile(r"^(\s*)([-*•]|\d+[.)])\s")


def note_without(note: str, names: Collection[str]) -> str:
    """``note`` without the list items that name one of ``names`` (as a whole word); an item is a line starting
    with ``-``, ``*``, ``•`` or ``1.`` plus the lines after it indented deeper. Other lines are kept as written."""
    if not names:
        return note
    named = re.compile(r"(?<![\w.-])(" + "|".join(re.escape(n) for n in sorted(names)) + r")(?![\w-])")
    out: list[str] = []
    item: list[str] = []
    depth = -1

    def flush() -> None:
        if item and not named.search("\n".join(item)):
            out.extend(item)
        item.clear()

    for line in note.split("\n"):
        start = _ITEM.match(line)
        indent = len(line) - len(line.lstrip())
        if start is not None:
            flush()
            item.append(line)
            depth = len(start.group(1))
        elif item and line.strip() and indent > depth:
            item.append(line)
        else:
            flush()
            out.append(line)
    flush()
    return "\n".join(out)


class ClientPolicy:
    def __init__(self, config: Clients) -> None:
        self._config = config
        self._header = config.context_header.lower()
        self._patterns = [(pattern.lower(), tokens) for pattern, tokens in config.known.items()]
        self._needs = {name: config.large_context_tokens for name in config.large_context_tools}
        self._needs.update(config.min_context)
        self._lists: dict[tuple[int, frozenset[str]], tuple[Mapping[str, Any], Mapping[str, Any]]] = {}

    @property
    def threshold(self) -> int:
        return self._config.large_context_tokens

    @property
    def gated(self) -> frozenset[str]:
        """Every tool that needs a declared window to be listed and called."""
        return frozenset(self._needs)

    def need(self, tool: str) -> int | None:
        """The window ``tool`` needs, in tokens; None when any client may call it."""
        return self._needs.get(tool)

    def allowed(self, tool: str, declared: Declared) -> bool:
        """Whether a client that declared ``declared`` may list and call ``tool`` (an unknown window is small)."""
        need = self._needs.get(tool)
        return need is None or (declared.tokens is not None and declared.tokens >= need)

    def hidden(self, declared: Declared) -> frozenset[str]:
        """The tools this client may not list or call."""
        return frozenset(t for t, need in self._needs.items() if declared.tokens is None or declared.tokens < need)

    def listing(self, listing: Mapping[str, Any], note: str, declared: Declared) -> Mapping[str, Any]:
        """``listing`` without the ``min_context`` tools this client's window is below (the large-context tools are
        already out of the small list), the router note's items naming them taken out too; cached per listing."""
        hidden = frozenset(t for t in self.hidden(declared) if t in self._config.min_context)
        if not hidden:
            return listing
        key = (id(listing), hidden)
        found = self._lists.get(key)
        if found is not None and found[0] is listing:
            return found[1]
        shown = note_without(note, hidden) if note else note
        tools = [with_note(t, note, shown) for t in listing["tools"] if t["name"] not in hidden]
        kept = {**listing, "tools": tools}
        if len(self._lists) > 64:
            self._lists.clear()
        self._lists[key] = (listing, kept)
        return kept

    def declared(self, name: str | None, version: str | None, headers: Mapping[str, str] | None = None) -> Declared:
        if headers is not None:
            raw = headers.get(self._header)
            if raw is not None:
                try:
                    value = int(raw.strip().replace("_", "").replace(",", ""))
                except ValueError:
                    value = -1
                if value > 0:
                    return Declared(value, "header")
        if name:
            full = f"{name}@{version or ''}".lower()
            for pattern, tokens in self._patterns:
                target = full if "@" in pattern else name.lower()
                if fnmatch.fnmatchcase(target, pattern):
                    return Declared(tokens, "clientInfo")
        return Declared(None, "unknown")

    def is_large(self, declared: Declared) -> bool:
        return declared.tokens is not None and declared.tokens >= self.threshold

    def refusal(self, tool: str, declared: Declared) -> str:
        """Why a client below the gate may not call ``tool``: what to do instead, and how a large client says so
        (the header with a value that passes, as a person sets it in the Inspector's ``--header``)."""
        need = self._needs.get(tool, self.threshold)
        return (
            f"{tool} is only available to clients with a context window of at least {need:,} tokens; "
            f"this client has {declared.describe()}. Use files_search to find the page, then files_neighbors to "
            f"read it with everything linked to it. (A client with a large context declares it in a request "
            f"header, e.g. `{self._config.context_header}: {need}`; the tool is listed to it then.)"
        )
