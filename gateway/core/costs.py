"""Costs measured, not claimed: the figures behind ``{cost:TOOL}`` placeholders in descriptions and the router note.

The reference system tells the model "≈500 tokens", "~200 ms" — numbers nobody measured. Here a placeholder such as
``{cost:wiki_index}`` is replaced by what the gateway observes on the live corpus:

* **tokens** — the typical (median) size of the tool's answers in the audit ledger, divided by 4 (a byte-per-token
  ratio of 4 is the usual estimate for English text and JSON; it is a size, not a tokenizer's count). Before any call
  was recorded, the wiki's own estimate of its answers (``Backend.estimates()``) is used;
* **latency** — the median duration of the tool's calls in the ledger (last 7 days).

Figures are rounded to two significant digits so that small fluctuations do not change the published text (each
change is a new catalog and a ``list_changed`` to every client). A placeholder for a tool with no figure yet
reads "cost not measured yet".
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.ledger.readers import ToolStats

__all__ = ["Cost", "costs_from", "fill_placeholders"]

BYTES_PER_TOKEN = 4
PLACEHOLDER = re.compile(r"\{cost:([A-Za-z0-9_.-]{1,64})\}")


@dataclass(frozen=True, slots=True)
class Cost:
    tokens: int | None = None
    p50_ms: float | None = None
    source: str = ""

    def text(self) -> str:
        parts = []
        if self.tokens is not None:
            parts.append(f"~{_round(self.tokens):,} tokens")
        if self.p50_ms is not None:
            parts.append(f"p50 {_round_ms(self.p50_ms)}")
        if not parts:
            return "cost not measured yet"
        return ", ".join([*parts, self.source] if self.source else parts)


def _round(value: float) -> int:
    if value <= 0:
        return 0
    digits = 2 - int(math.floor(math.log10(value))) - 1
    return int(round(value, digits))


def _round_ms(ms: float) -> str:
    if ms >= 1000:
        return f"{_round(ms) / 1000:g} s"
    return f"{_round(max(ms, 1))} ms"


def costs_from(stats: Iterable[ToolStats], estimates: Mapping[str, int]) -> dict[str, Cost]:
    """Merge ledger statistics (measured) with corpus estimates (used until a tool has recorded calls)."""
    costs: dict[str, Cost] = {
        name: Cost(tokens, None, "estimated from the corpus") for name, tokens in estimates.items()
    }
    for item in stats:
        if item.answered == 0:  # only refusals: nothing measured of the tool itself
            continue
        tokens = math.ceil(item.p50_result_bytes / BYTES_PER_TOKEN)
        costs[item.tool] = Cost(tokens, item.p50_ms, f"median of {item.answered:,} calls")
    return costs


def fill_placeholders(text: str, costs: Mapping[str, Cost]) -> str:
    """Replace every ``{cost:TOOL}`` in ``text`` with that tool's measured cost."""
    if "{cost:" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        cost = costs.get(match.group(1))
        return cost.text() if cost is not None else "cost not measured yet"

    return PLACEHOLDER.sub(replace, text)
