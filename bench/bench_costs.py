"""How often a ``{cost:TOOL}`` placeholder changes the published text (each change is a new catalog, a
``list_changed`` to every client and a prompt-cache miss for every connected agent), under ordinary use.

Usage: ``python -m bench.bench_costs [--days 7] [--calls-per-hour 60] [--seed 1]``

A simulated ledger: one tool called at a steady rate, each answer's size and duration drawn from a log-normal
distribution; every ``costs_refresh_s`` (60 s, the default) the medians over the calls so far are handed to
``core/costs.py`` ``costs_from`` exactly as the runtime does, and the published text is compared with the last one.
Scenarios: steady tools with narrow and wide spreads, and one whose answers grow fourfold over the run,
where the band should move. The "before" column replays the figures this gateway published until issue 23 (two
significant digits, "median of N calls"). Markdown to stdout.
"""

from __future__ import annotations

import argparse
import bisect
import math
import random
from dataclasses import dataclass

from gateway.core.costs import BYTES_PER_TOKEN, Cost, costs_from
from gateway.ledger.readers import ToolStats

REFRESH_S = 60.0


@dataclass(frozen=True)
class Scenario:
    name: str
    bytes_median: float
    bytes_sigma: float
    ms_median: float
    ms_sigma: float
    growth: float = 1.0  # the answers' median at the end of the run, as a multiple of the start's


SCENARIOS = (
    Scenario("steady, narrow (a listing: wiki_index)", 5_600, 0.05, 4, 0.3),
    Scenario("steady, typical (a search: files_search)", 4_000, 0.5, 170, 0.3),
    Scenario("steady, wide (a page read: files_read)", 6_000, 1.2, 3, 0.8),
    Scenario("slow and jittery (an LLM-backed tool)", 2_000, 0.6, 2_500, 0.9),
    Scenario("growing: its answers grow fourfold over the run", 4_000, 0.5, 170, 0.3, growth=4.0),
)


def _two_digits(value: float) -> int:
    if value <= 0:
        return 0
    return int(round(value, 2 - int(math.floor(math.log10(value))) - 1))


def before_text(tokens: float, ms: float, calls: int) -> str:
    """The text published until issue 23: two significant digits and the call count."""
    latency = f"{_two_digits(ms) / 1000:g} s" if ms >= 1000 else f"{_two_digits(max(ms, 1))} ms"
    return f"~{_two_digits(tokens):,} tokens, p50 {latency}, median of {calls:,} calls"


def _median(ordered: list[float]) -> float:
    n = len(ordered)
    return ordered[n // 2] if n % 2 else (ordered[n // 2 - 1] + ordered[n // 2]) / 2


def simulate(scenario: Scenario, days: float, per_hour: float, seed: int) -> tuple[int, int, int, int, float]:
    """(changes before and now over the whole run, the same in its first day, the hour of the last change now). The
    first text published (from the first refresh on) is no change; "not measured yet" turning into a band is one."""
    rng = random.Random(seed)
    sizes: list[float] = []
    durations: list[float] = []
    published: dict[str, Cost] = {}
    last: tuple[str, str] | None = None
    changes = [0, 0, 0, 0]
    last_change_h = 0.0
    run_s = days * 86_400
    next_call = rng.expovariate(per_hour / 3_600)
    now = 0.0
    while now < run_s:
        now += REFRESH_S
        while next_call <= now:
            grown = scenario.growth ** (next_call / run_s)
            bisect.insort(sizes, rng.lognormvariate(math.log(scenario.bytes_median * grown), scenario.bytes_sigma))
            bisect.insort(durations, rng.lognormvariate(math.log(scenario.ms_median), scenario.ms_sigma))
            next_call += rng.expovariate(per_hour / 3_600)
        if not sizes:
            texts = ("cost not measured yet", "cost not measured yet")
        else:
            size, ms = _median(sizes), _median(durations)
            stats = [ToolStats("t", len(sizes), {"ok": len(sizes)}, 0.0, 0.0, ms, 0, 0, p50_result_bytes=size)]
            published = costs_from(stats, {}, published)
            texts = (before_text(size / BYTES_PER_TOKEN, ms, len(sizes)), published.get("t", Cost()).text())
        first_day = now <= 86_400
        if last is not None and texts[0] != last[0]:
            changes[0] += 1
            changes[2] += first_day
        if last is not None and texts[1] != last[1]:
            changes[1] += 1
            changes[3] += first_day
            last_change_h = now / 3_600
        last = texts
    return changes[0], changes[1], changes[2], changes[3], last_change_h


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--days", type=float, default=7.0)
    parser.add_argument("--calls-per-hour", type=float, default=60.0)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    print(f"{args.days:g} days, {args.calls_per_hour:g} calls an hour, a refresh every {REFRESH_S:g} s")
    print()
    print("| tool's answers | changes before, whole run | now | before, first day | now, first day | last change now |")
    print("|---|---|---|---|---|---|")
    for scenario in SCENARIOS:
        before, now, before_day, now_day, hour = simulate(scenario, args.days, args.calls_per_hour, args.seed)
        print(f"| {scenario.name} | {before:,} | {now:,} | {before_day:,} | {now_day:,} | hour {hour:.1f} |")


if __name__ == "__main__":
    main()
