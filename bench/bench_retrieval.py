"""Retrieval quality and latency of the wiki's search modes: keyword (BM25), vector, hybrid; and SQLite FTS5.

Quality: the labelled questions of bench/retrieval_questions.yaml over docs/ (question -> page + section). A result is
a hit when its file is the page and its line lies in that section (sub-sections included). Prints recall@5 and MRR
(first hit within the top 10) for every mode, at section level and at page level.

Modes:
  keyword-page      the hand-written BM25 over whole pages (wiki_search today; line = its snippet line)
  fts5-page         SQLite FTS5 over whole pages, ORDER BY bm25() (line = the same snippet rule)
  keyword-section   the hand-written BM25 over sections (the semantic index's keyword half; stop words left out)
  fts5-section      SQLite FTS5 over the same sections, ORDER BY bm25() (stop words left out the same way)
  vector            cosine similarity of wordllama section vectors
  hybrid            keyword-section and vector fused by reciprocal rank fusion (k = 60)

Latency: build and per-query times of each mode on docs/ and on a generated wiki (bench/bench_wiki.py's generator,
default 2,000 pages), plus the model's load time and the process's RSS before and after (model, then index).

    .venv/bin/python -m bench.bench_retrieval [--docs docs] [--pages 2000] [--queries 200]
"""

from __future__ import annotations

import argparse
import random
import re
import resource
import sqlite3
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from bench.bench_wiki import _WORDS, generate
from gateway.backends.wiki.handlers import _snippet
from gateway.backends.wiki.index import _Bm25, _build_index, _Index, _tokens
from gateway.backends.wiki.semantic import _STOPWORDS, SemanticIndex, build_semantic, load_embedder

_HERE = Path(__file__).resolve().parent
_HEADING = re.compile(r"^(#{1,6})[ \t]+(.+?)[ \t]*$")
Hit = tuple[str, int]  # (file, line)


def _rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _section_range(root: Path, file: str, section: str) -> tuple[int, int]:
    lines = (root / file).read_text(encoding="utf-8").splitlines()
    fence = False
    headings: list[tuple[int, int, str]] = []
    for number, line in enumerate(lines, start=1):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        match = None if fence else _HEADING.match(line)
        if match is not None:
            headings.append((number, len(match.group(1)), match.group(2)))
    for i, (number, level, text) in enumerate(headings):
        if text.startswith(section):
            end = next((n for n, lv, _ in headings[i + 1 :] if lv <= level), len(lines) + 1)
            return number, end
    raise SystemExit(f"label not found: {file} # {section}")


class Fts5:
    """SQLite FTS5 over pages or sections (unicode61 tokenizer, bm25() ranking), in memory."""

    def __init__(self, rows: Sequence[tuple[str, str]], *, stopwords: bool = False) -> None:
        self.stopwords = stopwords  # leave stop words out of the query, as the section keyword search does
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.db.execute("CREATE VIRTUAL TABLE docs USING fts5(title, body, tokenize='unicode61')")
        self.db.executemany("INSERT INTO docs(rowid, title, body) VALUES (?, ?, ?)",
                            [(i, t, b) for i, (t, b) in enumerate(rows)])  # fmt: skip

    def search(self, query: str, limit: int) -> list[tuple[int, float]]:
        words = _tokens(query)
        if self.stopwords:
            words = [w for w in words if w not in _STOPWORDS] or words
        terms = " OR ".join('"' + t.replace('"', '""') + '"' for t in dict.fromkeys(words))
        if not terms:
            return []
        rows = self.db.execute(
            "SELECT rowid, bm25(docs) FROM docs WHERE docs MATCH ? ORDER BY bm25(docs) LIMIT ?", (terms, limit)
        ).fetchall()
        return [(int(r), -float(s)) for r, s in rows]


def _modes(index: _Index, sem: SemanticIndex, embed: Any) -> dict[str, Callable[[str, int], list[Hit]]]:
    pages = list(index.pages)
    fts_pages = Fts5([(index.pages[p].title, index.parsed[p].text) for p in pages])
    fts_sections = Fts5([(s.title, "\n".join(s.lines)) for s in sem.sections], stopwords=True)

    def page_hits(ranked: list[tuple[int, float]], query: str) -> list[Hit]:
        terms = set(_tokens(query))
        return [(pages[d], _snippet(index, pages[d], terms)[0]) for d, _ in ranked]

    def section_hits(ranked: list[tuple[int, float]], query: str) -> list[Hit]:
        return [(r["file"], r["line"]) for r in (sem.result(i, s, query) for i, s in ranked)]

    return {
        "keyword-page": lambda q, k: page_hits(index.bm25.search(_tokens(q), k), q),
        "fts5-page": lambda q, k: page_hits(fts_pages.search(q, k), q),
        "keyword-section": lambda q, k: section_hits(sem.keyword(q, k), q),
        "fts5-section": lambda q, k: section_hits(fts_sections.search(q, k), q),
        "vector": lambda q, k: section_hits(sem.vector(embed, q, k), q),
        "hybrid": lambda q, k: section_hits(sem.hybrid(embed, q, k), q),
    }


def quality(docs: Path) -> None:
    labels = yaml.safe_load((_HERE / "retrieval_questions.yaml").read_text())
    embed = load_embedder()
    index = _build_index(docs.resolve())
    sem = build_semantic(embed, index)
    modes = _modes(index, sem, embed)
    ranges = [(label["file"], _section_range(docs, label["file"], label["section"])) for label in labels]
    print(f"{len(labels)} questions over {docs}/ ({len(index.pages)} pages, {len(sem.sections)} sections)")
    print(f"{'mode':<16} {'recall@1':>9} {'recall@5':>9} {'MRR':>6} {'page recall@5':>14} {'page MRR':>9}")
    for name, search in modes.items():
        first = recall = mrr = page_recall = page_mrr = 0.0
        for label, (file, (start, end)) in zip(labels, ranges, strict=True):
            hits = search(label["q"], 10)
            rank = next((r for r, (f, line) in enumerate(hits, 1) if f == file and start <= line < end), None)
            page_rank = next((r for r, (f, _) in enumerate(hits, 1) if f == file), None)
            first += rank == 1
            recall += rank is not None and rank <= 5
            mrr += 1 / rank if rank else 0
            page_recall += page_rank is not None and page_rank <= 5
            page_mrr += 1 / page_rank if page_rank else 0
        n = len(labels)
        print(
            f"{name:<16} {first / n:>9.2f} {recall / n:>9.2f} {mrr / n:>6.3f} {page_recall / n:>14.2f} "
            f"{page_mrr / n:>9.3f}"
        )


def _ms(fn: Callable[[], object], runs: int = 1) -> float:
    began = time.perf_counter()
    for _ in range(runs):
        fn()
    return (time.perf_counter() - began) * 1000 / runs


def latency(root: Path, label: str, queries: int) -> None:
    rng = random.Random(7)
    embed = load_embedder()
    index = _build_index(root.resolve())
    build_index_ms = _ms(lambda: _build_index(root.resolve()))
    rss_before = _rss_mb()
    began = time.perf_counter()
    sem = build_semantic(embed, index)
    sem_ms = (time.perf_counter() - began) * 1000
    rss_after = _rss_mb()
    again_ms = _ms(lambda: build_semantic(embed, index, sem))
    pages = list(index.pages)
    rows = [(index.pages[p].title, index.parsed[p].text) for p in pages]
    fts_build_ms = _ms(lambda: Fts5(rows))
    postings_ms = _ms(lambda: _Bm25([index.parsed[p].counts for p in pages]))
    one = pages[len(pages) // 2]
    incremental_ms = _ms(lambda: _build_index(root.resolve(), index.parsed, {one}), runs=3)
    fts = Fts5(rows)

    def fts_update() -> None:
        with fts.db:
            fts.db.execute("DELETE FROM docs WHERE rowid = ?", (len(pages) // 2,))
            fts.db.execute(
                "INSERT INTO docs(rowid, title, body) VALUES (?, ?, ?)", (len(pages) // 2, *rows[len(pages) // 2])
            )

    fts_update_ms = _ms(fts_update, runs=3)
    modes = _modes(index, sem, embed)
    words = sorted({w for w in _WORDS}) if label != "docs" else None
    qs = [" ".join(rng.choices(words, k=3)) if words else rng.choice(_DOC_QUERIES) for _ in range(queries)]
    print(f"\n{label}: {len(index.pages):,} pages, {len(sem.sections):,} sections, {index.total_bytes / 1e6:.1f} MB")
    print(
        f"  keyword index build (walk, read, links, hand BM25): {build_index_ms:.0f} ms, of which the BM25 "
        f"postings {postings_ms:.1f} ms; FTS5 build of the same pages (text already read): {fts_build_ms:.0f} ms"
    )
    print(f"  after one page changed: keyword index rebuild (walk, that page, links, postings) {incremental_ms:.0f} ms;"
          f" FTS5 delete + insert of that row {fts_update_ms:.2f} ms")  # fmt: skip
    print(f"  semantic index build (sections embedded + section BM25): {sem_ms:.0f} ms; rebuild, nothing changed: "
          f"{again_ms:.1f} ms; RSS +{rss_after - rss_before:.1f} MB")  # fmt: skip
    for name, search in modes.items():
        samples = []
        for q in qs:
            began = time.perf_counter()
            search(q, 10)
            samples.append((time.perf_counter() - began) * 1000)
        samples.sort()
        print(
            f"  {name:<16} p50 {samples[len(samples) // 2]:6.2f} ms   p99 {samples[int(len(samples) * 0.99)]:6.2f} ms"
        )


_DOC_QUERIES = [
    "how do I turn off a server",
    "audit ledger retention",
    "vector search without embeddings",
    "reload the configuration",
    "bearer token loopback",
    "memory of the gateway process",
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=Path, default=_HERE.parent / "docs")
    parser.add_argument("--pages", type=int, default=2000)
    parser.add_argument("--queries", type=int, default=200)
    args = parser.parse_args()
    rss0 = _rss_mb()
    began = time.perf_counter()
    embed = load_embedder()
    print(f"model: {embed.source}, {embed.dimensions} dimensions; load {(time.perf_counter() - began) * 1000:.0f} ms,"
          f" RSS {rss0:.0f} -> {_rss_mb():.0f} MB")  # fmt: skip
    quality(args.docs)
    latency(args.docs, "docs", args.queries)
    with tempfile.TemporaryDirectory() as tmp:
        generate(Path(tmp), args.pages, 1)
        latency(Path(tmp), f"generated wiki ({args.pages:,} pages)", args.queries)


if __name__ == "__main__":
    main()
