"""Latency of the built-in wiki provider on a generated wiki (default 2,000 pages).

Generates a wiki in a temporary directory (nested folders, front matter, wikilinks by name and by title, relative
markdown links), starts a ``WikiBackend`` on it and prints the index build time and p50/p99 latency of each tool
over N calls, measured through ``call_tool`` (validation, freshness check and the worker thread included).

    .venv/bin/python -m bench.bench_wiki [--pages 2000] [--calls 200] [--seed 1]
"""

from __future__ import annotations

import argparse
import random
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from gateway.backends.wiki.backend import WikiBackend

_WORDS = (
    "transport handshake session backend gateway router index search page link folder cache token budget "
    "decision memory graph query audit ledger timeout fallback keyword vector rerank corpus wiki context agent "
    "cloud local protocol server client stream error retry latency benchmark schema argument title heading"
).split()


def generate(root: Path, pages: int, seed: int) -> list[str]:
    """Write ``pages`` markdown pages under ``root``; return their relative paths."""
    rng = random.Random(seed)
    folders = [f"area{a}/topic{t}" for a in range(8) for t in range(5)] + [""]
    paths = [f"{rng.choice(folders)}/page-{i:04d}.md".lstrip("/") for i in range(pages)]
    titles = [f"Page {i} {rng.choice(_WORDS)}" for i in range(pages)]
    for i, path in enumerate(paths):
        links = []
        for _ in range(4):
            j = rng.randrange(pages)
            links.append(f"[[{titles[j].upper()}]]" if rng.random() < 0.5 else f"[[page-{j:04d}]]")
        j = rng.randrange(pages)
        depth = path.count("/")
        links.append(f"[see]({'../' * depth}{paths[j]}#section)")
        if rng.random() < 0.1:
            links.append("[[No Such Page]]")
        body = "\n\n".join(" ".join(rng.choices(_WORDS, k=rng.randint(40, 120))) for _ in range(rng.randint(2, 6)))
        front = f"---\ntitle: {titles[i]}\ntags: [{rng.choice(_WORDS)}]\n---\n" if i % 2 == 0 else ""
        heading = "" if front else f"# {titles[i]}\n\n"
        target = root / path
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(f"{front}{heading}{body}\n\nLinks: {' '.join(links)}\n", encoding="utf-8")
    return paths


def _pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


async def _time_calls(
    backend: WikiBackend, tool: str, args_list: list[dict[str, Any]], *, errors: bool = False
) -> tuple[float, float]:
    samples = []
    for args in args_list:
        began = time.perf_counter()
        result = await backend.call_tool(tool, args)
        samples.append((time.perf_counter() - began) * 1000)
        assert bool(result.is_error) == errors, result.content
    return _pct(samples, 0.5), _pct(samples, 0.99)


async def main(pages: int, calls: int, seed: int) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        began = time.perf_counter()
        paths = generate(root, pages, seed)
        size = sum((root / p).stat().st_size for p in paths)
        print(f"generated {pages:,} pages ({size / 1e6:.1f} MB) in {time.perf_counter() - began:.2f} s")

        backend = WikiBackend("wiki", root)
        async with anyio.create_task_group() as tg:
            began = time.perf_counter()
            await tg.start(backend.run)
            startup = time.perf_counter() - began
            stats = backend.statistics()
            print(
                f"startup (watch + index build) {startup * 1000:.0f} ms; index build {stats.last_build_s * 1000:.0f} ms"
            )
            print(f"measure(): {backend.measure()}")

            rng = random.Random(seed)
            cases: list[tuple[str, list[dict[str, Any]]]] = [
                ("wiki_index", [{} for _ in range(calls)]),
                ("files_neighbors", [{"path": rng.choice(paths)} for _ in range(calls)]),
                ("files_read", [{"path": rng.choice(paths)} for _ in range(calls)]),
                ("wiki_search", [{"query": " ".join(rng.choices(_WORDS, k=3))} for _ in range(calls)]),
                ("wiki_read_all", [{} for _ in range(max(1, calls // 10))]),
            ]
            for tool, args_list in cases:
                p50, p99 = await _time_calls(backend, tool, args_list)
                print(f"{tool:16} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   ({len(args_list)} calls)")
            missing = [{"path": f"area1/nope-{i}.md"} for i in range(max(1, calls // 10))]
            p50, p99 = await _time_calls(backend, "files_read", missing, errors=True)
            print(
                f"{'(not found)':16} p50 {p50:7.2f} ms   p99 {p99:7.2f} ms   ({len(missing)} calls, with suggestions)"
            )
            assert backend.statistics().generation == stats.generation, "a call re-indexed an unchanged wiki"

            page = root / paths[0]
            began = time.perf_counter()
            page.write_text(page.read_text(encoding="utf-8") + "\nedited\n", encoding="utf-8")
            await backend.wait_index_generation(stats.generation + 1)
            print(
                f"one page edited: re-indexed {(time.perf_counter() - began) * 1000:.0f} ms after the write "
                f"(rebuild {backend.statistics().last_build_s * 1000:.0f} ms, unchanged pages reused)"
            )
            tg.cancel_scope.cancel()


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--calls", type=int, default=200)
    parser.add_argument("--seed", type=int, default=1)
    ns = parser.parse_args()
    anyio.run(main, ns.pages, ns.calls, ns.seed)
