"""The rest of answers cut to a budget, kept for a while (``gateway://results/ID``) and read back in pages.

A kept answer is a list of units (whole search hits, paragraphs, or items of a structured list) and the page size it
was cut at, in tokens: page 1 is what the call returned, page N packs the units that follow into the same budget
(a unit larger than a page is cut at lines, then words). It belongs to the caller who made the call (``owner``, from
``Caller``): ``read`` and ``listed`` answer another caller as if it did not exist. The store is bounded in time
(``keep_s`` after it was kept) and in bytes (``keep_bytes`` for all answers together, the oldest leaving first), and
lives in this process: behind several replicas, a result is read
from the replica that kept it (sticky sessions do that; docs/configuration.md, "Budgets").
"""

from __future__ import annotations

import json
import secrets
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from gateway.calls import Caller

__all__ = [
    "READ_DESCRIPTION",
    "READ_SCHEMA",
    "READ_TOOL",
    "SCHEME",
    "Kept",
    "KeptResults",
    "Page",
    "owner_of",
    "split_unit",
]

SCHEME = "gateway://results/"
"""The URI prefix of kept results: ``gateway://results/ID`` (page 1), ``gateway://results/ID?page=N``."""

READ_TOOL = "read_result"
"""The built-in tool that reads a kept answer's pages (for clients that do not read resources)."""

READ_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["id"],
    "additionalProperties": False,
    "properties": {
        "id": {"type": "string", "minLength": 1, "description": "The result's id, or its gateway://results/ URI."},
        "page": {
            "type": "integer",
            "minimum": 1,
            "default": 2,
            "description": "Which page (1 is what the call showed).",
        },
    },
}
READ_DESCRIPTION = (
    "Read the rest of an answer that was cut to fit your context budget, one page at a time: the cut answer names "
    "its id and the next page."
)

Owner = tuple[str | None, str | None, str | None]


def owner_of(caller: Caller) -> Owner:
    """Whom a kept result belongs to: the caller's identity (a gateway without tokens has one caller, nobody in
    particular, on loopback only)."""
    return (caller.issuer, caller.subject, caller.name)


@dataclass(frozen=True, slots=True)
class Page:
    """One page of a kept answer: its text, its number, and the units it holds (``first`` to ``last`` - 1, of
    ``units``)."""

    text: str
    number: int
    first: int
    last: int
    units: int
    hits: bool
    structured: list[object] | None = None


@dataclass(slots=True)
class Kept:
    id: str
    owner: Owner
    tool: str
    units: tuple[str, ...]
    hits: bool
    """Units are JSON hits (a page is a JSON array of them), else text (a page joins them with blank lines)."""
    page_tokens: int
    expires: float
    size: int
    tokens: int
    _bounds: list[tuple[int, int]] = field(default_factory=list)


class KeptResults:
    """The store (see the module docstring). ``count`` counts a text's tokens (search/tokens.py)."""

    def __init__(self, count: Callable[[str], int], *, keep_s: float, keep_bytes: int) -> None:
        self._count = count
        self.keep_s = keep_s
        self.keep_bytes = keep_bytes
        self._items: OrderedDict[str, Kept] = OrderedDict()
        self._bytes = 0

    def configure(self, *, keep_s: float, keep_bytes: int) -> None:
        """New bounds (on reload); what no longer fits leaves at once."""
        self.keep_s, self.keep_bytes = keep_s, keep_bytes
        self._evict(0)

    def keep(
        self,
        owner: Owner,
        tool: str,
        units: Sequence[str],
        *,
        hits: bool,
        page_tokens: int,
        first_page: int,
        tokens: int,
    ) -> Kept | None:
        """Keep ``units`` (page 1 is the first ``first_page`` of them); None when they alone exceed ``keep_bytes``."""
        size = sum(len(u.encode("utf-8", "surrogatepass")) for u in units)
        if size > self.keep_bytes:
            return None
        self._evict(size)
        item = Kept(
            secrets.token_urlsafe(12), owner, tool, tuple(units), hits, page_tokens, time.monotonic() + self.keep_s,
            size, tokens, [(0, first_page)],
        )  # fmt: skip
        self._items[item.id] = item
        self._bytes += size
        return item

    def _evict(self, incoming: int) -> None:
        now = time.monotonic()
        for key in [k for k, v in self._items.items() if v.expires <= now]:
            self._drop(key)
        while self._items and self._bytes + incoming > self.keep_bytes:
            self._drop(next(iter(self._items)))

    def _drop(self, key: str) -> None:
        item = self._items.pop(key)
        self._bytes -= item.size

    def get(self, owner: Owner, id: str) -> Kept | None:
        """The kept answer ``id`` if it is ``owner``'s and has not expired."""
        self._evict(0)
        item = self._items.get(id)
        return item if item is not None and item.owner == owner else None

    def listed(self, owner: Owner) -> list[Kept]:
        """``owner``'s kept answers, oldest first."""
        self._evict(0)
        return [item for item in self._items.values() if item.owner == owner]

    def page(self, item: Kept, number: int) -> Page | None:
        """Page ``number`` (from 1) of ``item``; None past the last page."""
        bounds = item._bounds
        while len(bounds) < number and bounds[-1][1] < len(item.units):
            start = bounds[-1][1]
            bounds.append((start, self._fill(item, start)))
        if number < 1 or number > len(bounds):
            return None
        first, last = bounds[number - 1]
        chosen = item.units[first:last]
        if item.hits:
            text = "[\n" + ",\n".join(chosen) + "\n]" if chosen else "[]"
            structured: list[object] | None = [json.loads(u) for u in chosen]
        else:
            text, structured = "\n\n".join(chosen), None
        return Page(text, number, first, last, len(item.units), item.hits, structured)

    def _fill(self, item: Kept, start: int) -> int:
        """The end of the page that starts at unit ``start``: as many whole units as fit in ``page_tokens``, and
        at least one."""
        used, end = 0, start
        while end < len(item.units):
            cost = self._count(item.units[end]) + 2
            if end > start and used + cost > item.page_tokens:
                break
            used += cost
            end += 1
        return end

    def statistics(self) -> dict[str, int]:
        return {"kept": len(self._items), "bytes": self._bytes, "keep_bytes": self.keep_bytes}


def split_unit(text: str, tokens: int, count: Callable[[str], int]) -> list[str]:
    """``text`` (one unit over ``tokens``) as pieces of at most about ``tokens``: at line breaks, else at spaces,
    else at characters."""
    for separator in ("\n", " "):
        parts = text.split(separator)
        if len(parts) > 1:
            pieces: list[str] = []
            current: list[str] = []
            used = 0
            for part in parts:
                cost = count(part) + 1
                if current and used + cost > tokens:
                    pieces.append(separator.join(current))
                    current, used = [], 0
                current.append(part)
                used += cost
            if current:
                pieces.append(separator.join(current))
            if all(count(p) <= tokens for p in pieces):
                return pieces
            return [q for p in pieces for q in (split_unit(p, tokens, count) if count(p) > tokens else [p])]
    width = max(1, tokens * 2)  # no separator: characters, about two per token at worst
    return [text[i : i + width] for i in range(0, len(text), width)]
