"""Costs measured, not claimed: the bands behind ``{cost:TOOL}`` placeholders in descriptions and the router note.

The reference system tells the model "≈500 tokens", "~200 ms" — numbers nobody measured. Here a placeholder such as
``{cost:wiki_index}`` is replaced by what the gateway observes on the live corpus:

* **tokens** — the typical (median) size of the tool's answers in the audit ledger, divided by 4 (a byte-per-token
  ratio of 4 is the usual estimate for English text and JSON; it is a size, not a tokenizer's count). Until the tool
  has ``MIN_CALLS`` answered calls, the wiki's own estimate of its answers (``Backend.estimates()``) is used;
* **latency** — the median duration of the tool's answered calls in the ledger (last 7 days).

Tool descriptions head every agent's prompt cache, and one list serves every caller: a figure that moved with each
call (a count, a fresh median) made each refresh a new catalog, a ``list_changed`` to every client and a cache miss
for every connected agent. So a figure is published as a **band** of the 1-2-5 series (``~200 ms``, ``~1,000
tokens``), and a published band holds until the measured median leaves it by more than ``HOLD`` (a factor of 1.8:
past the midpoint to the next band, so a median wavering at a boundary never flips it). A band moves when what a tool
costs really changes; bench/bench_costs.py measures how rarely it does otherwise.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from gateway.ledger.readers import ToolStats

__all__ = ["HOLD", "MIN_CALLS", "Cost", "band", "costs_from", "fill_placeholders"]

BYTES_PER_TOKEN = 4
PLACEHOLDER = re.compile(r"\{cost:([A-Za-z0-9_.-]{1,64})\}")
MIN_CALLS = 5
"""Answered calls a tool needs before its measured figures replace the estimate (or "not measured yet")."""
HOLD = 1.8
"""A published band holds while the measured median stays within this factor of it."""
_STEPS = (1, 2, 5)


@dataclass(frozen=True, slots=True)
class Cost:
    """A tool's published cost: ``tokens`` and ``p50_ms`` are bands (values of the 1-2-5 series), or None;
    ``source`` says where they come from (``measured`` or ``estimated``; not published)."""

    tokens: int | None = None
    p50_ms: float | None = None
    source: str = ""

    def text(self) -> str:
        parts = []
        if self.tokens is not None:
            parts.append(f"~{self.tokens:,} tokens")
        if self.p50_ms is not None:
            parts.append(f"~{_ms(self.p50_ms)}")
        return ", ".join(parts) if parts else "cost not measured yet"


def band(value: float, held: float | None = None) -> float:
    """``value`` as a band of the 1-2-5 series (the nearest, on a log scale; at least 1), or ``held`` when it is
    a band ``value`` stays within ``HOLD`` of."""
    value = max(value, 1.0)
    if held is not None and held / HOLD <= value <= held * HOLD:
        return held
    exponent = math.floor(math.log10(value))
    candidates = [step * 10.0**e for e in (exponent - 1, exponent, exponent + 1) for step in _STEPS]
    return min(candidates, key=lambda c: abs(math.log(value / c)))


def _ms(ms: float) -> str:
    return f"{ms / 1000:g} s" if ms >= 1000 else f"{ms:g} ms"


def costs_from(
    stats: Iterable[ToolStats], estimates: Mapping[str, int], published: Mapping[str, Cost] | None = None
) -> dict[str, Cost]:
    """The bands to publish: ledger statistics (measured, once a tool has ``MIN_CALLS`` answered calls), else corpus
    estimates; each band ``published`` before holds while its figure stays within ``HOLD`` of it."""
    published = published or {}
    figures: dict[str, tuple[float | None, float | None, str]] = {
        name: (tokens, None, "estimated") for name, tokens in estimates.items()
    }
    for item in stats:
        if item.answered >= MIN_CALLS:  # refusals measure nothing of the tool itself
            figures[item.tool] = (item.p50_result_bytes / BYTES_PER_TOKEN, item.p50_ms, "measured")
    costs: dict[str, Cost] = {}
    for name, (tokens, ms, source) in figures.items():
        before = published.get(name, Cost())
        costs[name] = Cost(
            int(band(tokens, before.tokens)) if tokens is not None else None,
            band(ms, before.p50_ms) if ms is not None else None,
            source,
        )
    return costs


def fill_placeholders(text: str, costs: Mapping[str, Cost]) -> str:
    """Replace every ``{cost:TOOL}`` in ``text`` with that tool's published cost."""
    if "{cost:" not in text:
        return text

    def replace(match: re.Match[str]) -> str:
        cost = costs.get(match.group(1))
        return cost.text() if cost is not None else "cost not measured yet"

    return PLACEHOLDER.sub(replace, text)
