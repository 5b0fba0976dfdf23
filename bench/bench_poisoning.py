"""Poisoning checks (gateway/core/poisoning.py) on a labelled set: how many poisoned definitions they flag (recall) and
how many real ones they leave alone (precision, and flagged tools per thousand clean).

Poisoned: bench/poisoning/poisoned.yaml (40 crafted definitions, written before the checks). Clean: every tool of the
public catalog, bench/catalog/ (1,284 tools of 56 real servers, each inspected among its own server's tools). Both are
split in halves by a hash of each id; the checks were tuned on the ``dev`` half only and the ``test`` half is only
reported. ``--show`` prints what was missed and what was flagged, for the dev half.

    .venv/bin/python -m bench.bench_poisoning [--show]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import time
from pathlib import Path
from typing import Any

import mcp_types as types
import yaml

from gateway.core.poisoning import inspect, long_description, poisoned

_HERE = Path(__file__).resolve().parent


def half(key: str) -> str:
    """``test`` or ``dev``, fixed by the key's hash."""
    return "test" if hashlib.sha256(key.encode()).digest()[0] % 2 == 0 else "dev"


def crafted() -> list[tuple[str, types.Tool]]:
    """The poisoned set, as tools a server would list."""
    tools = []
    for entry in yaml.safe_load((_HERE / "poisoning" / "poisoned.yaml").read_text()):
        described = entry.get("property_descriptions", {})
        properties: dict[str, Any] = {
            name: {"type": kind, **({"description": described[name]} if name in described else {})}
            for name, kind in entry["properties"].items()
        }
        output = (
            {"type": "object", "description": entry["output_description"]} if "output_description" in entry else None
        )
        tool = types.Tool(
            name=entry["name"],
            description=entry["description"],
            input_schema={"type": "object", "properties": properties},
            output_schema=output,
        )
        tools.append((entry["id"], tool))
    return tools


def catalog() -> list[tuple[str, types.Tool, list[types.Tool]]]:
    """Every catalog tool with its server's tools (its peers)."""
    rows = []
    for path in sorted((_HERE / "catalog" / "servers").glob("*.json")):
        data = json.loads(path.read_text())
        tools = [types.Tool.model_validate(tool) for tool in data["tools"]]
        rows.extend((f"{data['variant']}/{tool.name}", tool, tools) for tool in tools)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--show", action="store_true", help="print the dev half's misses and false alarms")
    args = parser.parse_args()
    bad, good = crafted(), catalog()
    started = time.process_time()
    bad_flags = [(key, poisoned(found), found) for key, tool in bad for found in [inspect(tool)]]
    good_flags = []
    for key, tool, peers in good:
        found = [*inspect(tool), *long_description(tool, peers)]
        good_flags.append((key, poisoned(found), found))
    cpu_ms = (time.process_time() - started) * 1000 / (len(bad) + len(good))
    print("| half | poisoned flagged (recall) | clean flagged | precision | clean flagged per 1,000 |")
    print("|---|---|---|---|---|")
    for name in ("dev", "test"):
        hits = [flag for key, flag, _ in bad_flags if half(key) == name]
        alarms = [flag for key, flag, _ in good_flags if half(key) == name]
        tp, fp = sum(hits), sum(alarms)
        precision = tp / (tp + fp) if tp + fp else 1.0
        print(
            f"| {name} | {tp}/{len(hits)} ({tp / len(hits):.2f}) | {fp}/{len(alarms)} | {precision:.2f} "
            f"| {1000 * fp / len(alarms):.1f} |"
        )
    print(f"\nCPU per inspected definition: {cpu_ms:.3f} ms")
    if args.show:
        for key, flag, findings in bad_flags:
            if half(key) == "dev" and not flag:
                print(f"MISSED {key}: {[str(f) for f in findings]}")
        for key, flag, findings in good_flags:
            if half(key) == "dev" and findings:
                print(f"{'FLAGGED' if flag else 'NOTE'} {key}: {[str(f) for f in findings]}")


if __name__ == "__main__":
    main()
