"""Tool search: does it find the right tool among 1,259 real ones, how much smaller is search mode's tools/list, and
what does a search cost at 1,000 and 10,000 tools.

Catalog: bench/catalog/ (bench/collect_catalog.py), deduplicated to one tool per (package, name) under the package's
primary variant (its shortest variant name), id ``variant/name``. Requests: bench/toolsearch_requests.yaml (written
before the search code; ids 1-80 tune, 81- are held out). A result is a hit when it is one of the request's tools.

Figures: recall@1, recall@5 and MRR (first hit within the top 10) for keyword, semantic and hybrid, on the tuning
half, the held-out half and all; tokens of tools/list in ``all`` mode (every tool) and ``search`` mode (the search
and call tools, no pins) and of one search answer (5 tools with schemas), counted with the tokenizer inside the
installed wordllama wheel (Llama 2's 32k vocabulary; other models' tokenizers count differently, by tens of
percent, not by the ratio); search latency p50/p99 at the real catalog and at 10x by replication (every tool copied
under a renamed name and backend, ``_r1``..``_r9``); RSS after the model, after each index.

    .venv/bin/python -m bench.bench_toolsearch [--tune] [--queries 300]
"""

from __future__ import annotations

import argparse
import itertools
import json
import statistics
import time
from pathlib import Path
from typing import Any

import yaml

from bench.bench_retrieval import _rss_mb
from gateway.config import Exposure
from gateway.front.exposure import meta_tools
from gateway.search import tools as toolsearch
from gateway.search.ranking import Embedder, load_embedder
from gateway.search.tools import Mode, ToolDoc, ToolIndex

_HERE = Path(__file__).resolve().parent
MODES: tuple[Mode, ...] = ("keyword", "semantic", "hybrid")
TUNE_LAST_ID = 80


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
    return list(yaml.safe_load((_HERE / "toolsearch_requests.yaml").read_text()))


def quality(index: ToolIndex, reqs: list[dict[str, Any]], mode: Mode) -> dict[str, float]:
    r1 = r5 = rr = 0.0
    for req in reqs:
        wanted = set(req["tools"])
        ranked = [index.docs[i].name for i, _ in index.search(req["q"], 10, mode)]
        first = next((rank for rank, name in enumerate(ranked, start=1) if name in wanted), None)
        r1 += first == 1
        r5 += first is not None and first <= 5
        rr += 1.0 / first if first is not None else 0.0
    n = len(reqs) or 1
    return {"recall@1": r1 / n, "recall@5": r5 / n, "mrr": rr / n}


def misses(index: ToolIndex, reqs: list[dict[str, Any]], mode: Mode) -> list[str]:
    out = []
    for req in reqs:
        ranked = [index.docs[i].name for i, _ in index.search(req["q"], 5, mode)]
        if not set(req["tools"]) & set(ranked):
            out.append(f"  {req['id']}: {req['q']!r} wanted {req['tools'][0]} got {ranked[:3]}")
    return out


def tune(docs: list[ToolDoc], embedder: Embedder, reqs: list[dict[str, Any]]) -> None:
    """Grid over the fusion's constants on the tuning half only; prints each setting's hybrid figures."""
    part = [r for r in reqs if r["id"] <= TUNE_LAST_ID]
    rows = []
    for name_weight, vector_weight in itertools.product((1, 2, 3, 4), (0.0, 0.3, 0.6, 1.0)):
        toolsearch.NAME_WEIGHT, toolsearch.NAME_VECTOR_WEIGHT = name_weight, vector_weight
        index = ToolIndex.build(docs, embedder)
        semantic = quality(index, part, "semantic")["recall@5"]
        for weight, k in itertools.product((0.5, 0.75, 1.0, 1.5, 2.0), (10.0, 30.0, 60.0)):
            toolsearch.KEYWORD_WEIGHT, toolsearch.FUSION_K = weight, k
            q = quality(index, part, "hybrid")
            rows.append((q["recall@5"], q["mrr"], name_weight, vector_weight, weight, k, semantic))
    rows.sort(reverse=True)
    print("| recall@5 | MRR | NAME_WEIGHT | NAME_VECTOR_WEIGHT | KEYWORD_WEIGHT | FUSION_K | semantic recall@5 |")
    print("|---|---|---|---|---|---|---|")
    for row in rows[:10]:
        print(f"| {row[0]:.3f} | {row[1]:.3f} | {row[2]} | {row[3]:g} | {row[4]:g} | {row[5]:g} | {row[6]:.3f} |")


def replicate(docs: list[ToolDoc], times: int) -> list[ToolDoc]:
    out = list(docs)
    for n in range(1, times):
        out.extend(
            ToolDoc(
                f"{d.name}_r{n}", d.description, tuple(f"{b}-r{n}" for b in d.backends), d.input_schema, d.annotations
            )  # fmt: skip
            for d in docs
        )
    return out


def latency(index: ToolIndex, queries: list[str], mode: Mode) -> tuple[float, float]:
    samples = []
    for q in queries:
        began = time.perf_counter()
        index.search(q, 5, mode)
        samples.append((time.perf_counter() - began) * 1000)
    samples.sort()
    return statistics.median(samples), samples[min(len(samples) - 1, int(len(samples) * 0.99))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tune", action="store_true", help="grid the fusion constants on the tuning half")
    parser.add_argument("--queries", type=int, default=300, help="latency samples per setting")
    args = parser.parse_args()
    rss0 = _rss_mb()
    embedder = load_embedder()
    rss_model = _rss_mb()
    docs, wire = load_catalog()
    reqs = requests()
    if args.tune:
        tune(docs, embedder, reqs)
        return
    index = ToolIndex.build(docs, embedder)
    rss_index = _rss_mb()
    print(f"catalog: {len(docs)} tools from {len({d.backends[0] for d in docs})} servers; {len(reqs)} requests")
    print(f"constants: NAME_WEIGHT={toolsearch.NAME_WEIGHT} NAME_VECTOR_WEIGHT={toolsearch.NAME_VECTOR_WEIGHT:g} "
          f"KEYWORD_WEIGHT={toolsearch.KEYWORD_WEIGHT:g} FUSION_K={toolsearch.FUSION_K:g}\n")  # fmt: skip
    parts = {
        "tuning (1-80)": [r for r in reqs if r["id"] <= TUNE_LAST_ID],
        "held out (81-)": [r for r in reqs if r["id"] > TUNE_LAST_ID],
        "all": reqs,
    }
    print("| mode | part | n | recall@1 | recall@5 | MRR |\n|---|---|---|---|---|---|")
    for mode in MODES:
        for part, subset in parts.items():
            q = quality(index, subset, mode)
            print(f"| {mode} | {part} | {len(subset)} | {q['recall@1']:.3f} | {q['recall@5']:.3f} | {q['mrr']:.3f} |")
    print("\nhybrid misses at 5 (all):")
    print("\n".join(misses(index, reqs, "hybrid")) or "  none")

    listing_all = json.dumps({"tools": wire}, separators=(",", ":"))
    listing_search = json.dumps({"tools": meta_tools(Exposure())}, separators=(",", ":"))
    hits = index.search(reqs[0]["q"], 5, "hybrid")
    answer = json.dumps(
        {
            "query": reqs[0]["q"],
            "tools": [
                {
                    "name": index.docs[i].name,
                    "description": index.docs[i].description[:160],
                    "inputSchema": index.docs[i].input_schema,
                    "health": "ready",
                    "cost": "not measured yet",
                }
                for i, _ in hits
            ],
        }  # fmt: skip
    )
    t_all, t_search, t_answer = (embedder.count_tokens(x) for x in (listing_all, listing_search, answer))
    print("\n| tools/list | bytes | tokens (Llama 2 tokenizer) |\n|---|---|---|")
    print(f"| all ({len(wire)} tools) | {len(listing_all):,} | {t_all:,} |")
    smaller = 100 * (1 - t_search / t_all)
    print(f"| search (2 tools, no pins) | {len(listing_search):,} | {t_search:,} ({smaller:.2f}% smaller) |")
    print(f"| one search answer (5 tools) | {len(answer):,} | {t_answer:,} |")

    queries = [r["q"] for r in reqs]
    queries = (queries * (args.queries // len(queries) + 1))[: args.queries]
    print("\n| tools | build s | keyword p50/p99 ms | semantic p50/p99 ms | hybrid p50/p99 ms | RSS MB |")
    print("|---|---|---|---|---|---|")
    for times in (1, 10):
        big = index if times == 1 else ToolIndex.build(replicate(docs, times), embedder)
        rss = rss_index if times == 1 else _rss_mb()
        cells = [f"{p50:.2f} / {p99:.2f}" for p50, p99 in (latency(big, queries, m) for m in MODES)]
        print(f"| {len(big):,} | {big.build_s:.2f} | {' | '.join(cells)} | {rss:.0f} |")
    print(f"\nRSS: {rss0:.0f} MB before the model, {rss_model:.0f} MB with it, {rss_index:.0f} MB with the "
          f"{len(docs):,}-tool index; model load {embedder.load_s:.2f} s")  # fmt: skip


if __name__ == "__main__":
    main()
