"""Token budgets, measured (docs/benchmarks.md, "Token budgets"):

1. agreement: the gateway's count (search/tokens.py: Llama 2's tokenizer from the wordllama wheel, sampled past 4 KB)
   against the whole text through the same tokenizer, Anthropic's published tokenizer (npm ``@anthropic-ai/tokenizer``,
   when ``--anthropic DIR`` names its installed folder), Claude Code's own local estimate of a tool result (characters
   / 4, read from its 2.1.332 bundle) and bytes / 4, on the project's docs, a search answer, Python code and CJK text;
2. cost: what counting costs a 100 KB answer against the call itself (an in-process gateway, the wiki's files_read);
3. savings: the labelled questions of retrieval_questions.yaml over docs/, each run as the default loop (files_search,
   then files_neighbors of the first hit), by a client that declares no window and by clients declaring 8K, 32K and
   128K: the tokens each receives, and recall@5 of the search results it is shown against the uncut results;
4. catalog: what the default federation's tools/list costs, the router note in every router tool or placed once.

    .venv/bin/python -m bench.bench_tokens [--anthropic /path/to/node_modules/@anthropic-ai/tokenizer] [--calls N]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import yaml

from gateway.observe.logs import configure_logging
from gateway.search.ranking import tokenizer_file
from gateway.search.tokens import count_tokens, counter
from gateway.testing import in_process_gateway

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
WINDOWS = (None, 8_000, 32_000, 128_000)


def _exact() -> Any:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_file()))
    tok.no_padding()
    tok.no_truncation()
    return lambda text: len(tok.encode(text, add_special_tokens=False).ids)


def _anthropic(folder: str | None, texts: list[str]) -> list[int] | None:
    if folder is None:
        return None
    script = (
        "const t=require(process.argv[1]);let s='';process.stdin.on('data',d=>s+=d);"
        "process.stdin.on('end',()=>{console.log(JSON.stringify(JSON.parse(s).map(x=>t.countTokens(x))))})"
    )
    done = subprocess.run(
        ["node", "-e", script, folder], input=json.dumps(texts), capture_output=True, text=True, check=True
    )
    return list(json.loads(done.stdout))


def _samples() -> dict[str, str]:
    texts = {f"docs/{p.name}": p.read_text(encoding="utf-8") for p in sorted(DOCS.glob("*.md"))}
    hits = [
        {"file": "configuration.md", "title": f"Section {n}", "line": 10 * n, "score": round(1 / (n + 1), 4),
         "snippet": texts["docs/configuration.md"][n * 400 : n * 400 + 380]}
        for n in range(10)
    ]  # fmt: skip
    texts["a search answer (10 hits, JSON)"] = (
        "[\n" + ",\n".join(json.dumps(h, ensure_ascii=False) for h in hits) + "\n]"
    )
    texts["gateway/core/*.py (code)"] = "".join(p.read_text() for p in sorted((ROOT / "gateway/core").glob("*.py")))
    texts["CJK and emoji"] = "日本語のテキストと中文文本，한국어 텍스트 😀 mixed with English words. " * 400
    return texts


def agreement(anthropic: str | None) -> None:
    exact = _exact()
    texts = _samples()
    theirs = _anthropic(anthropic, list(texts.values()))
    print(f"\n### Agreement ({counter().name}; the reference is Anthropic's tokenizer where given)\n")
    print(
        "| text | KB | Llama 2 whole | gateway (sampled past 4 KB) | sample vs whole | Anthropic | chars/4 (Claude "
        "Code) | bytes/4 | gateway vs Anthropic | chars/4 vs Anthropic | bytes/4 vs Anthropic |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for n, (name, text) in enumerate(texts.items()):
        whole, ours = exact(text), count_tokens(text)
        chars, size = math.ceil(len(text) / 4), math.ceil(len(text.encode()) / 4)
        ref = theirs[n] if theirs is not None else None
        ratios = [f"{v / ref:.2f}" if ref else "-" for v in (ours, chars, size)]
        print(
            f"| {name} | {len(text.encode()) / 1024:.1f} | {whole:,} | {ours:,} | {(ours - whole) / whole:+.1%} | "
            f"{ref if ref is not None else '-':,} | {chars:,} | {size:,} | {' | '.join(ratios)} |"
        )


def _big_wiki(folder: Path) -> None:
    paragraph = (DOCS / "configuration.md").read_text(encoding="utf-8")
    (folder / "big.md").write_text(paragraph[:100_000], encoding="utf-8")


def _config(root: Path, budget: bool, extra: str = "") -> str:
    lines = "  budget: {answer_share: 0.1}\n" if budget else ""
    return (
        f"version: 1\ngateway: {{audit: {{enabled: false}}}}\nwiki: {{root: {root}}}\n"
        f"clients:\n  known: {{w8k: 8000, w32k: 32000, w128k: 128000}}\n{lines}{extra}"
    )


async def _timed_calls(config: str, client: str, calls: int) -> tuple[float, int]:
    """The p50 CPU time of one call (client and gateway both run in this process) and the bytes delivered."""
    info = types.Implementation(name=client, version="1")
    async with in_process_gateway(config, client_info=info) as (session, _):
        await session.call_tool("files_read", {"path": "big.md", "max_bytes": 200_000})
        times = []
        for _ in range(calls):
            began = time.process_time()
            result = await session.call_tool("files_read", {"path": "big.md", "max_bytes": 200_000})
            times.append(time.process_time() - began)
    size = sum(len(b.text.encode()) for b in result.content if isinstance(b, types.TextContent))
    return statistics.median(times) * 1000, size


def cost(calls: int) -> None:
    with tempfile.TemporaryDirectory() as folder:
        _big_wiki(Path(folder))
        text = (Path(folder) / "big.md").read_text(encoding="utf-8")
        count_tokens("warm up")
        counting = []
        for _ in range(calls):
            began = time.process_time()
            count_tokens(text)
            counting.append(time.process_time() - began)
        exact = _exact()
        began = time.process_time()
        exact(text)
        whole_ms = (time.process_time() - began) * 1000
        plain = anyio.run(_timed_calls, _config(Path(folder), False), "w128k", calls)
        cut = anyio.run(_timed_calls, _config(Path(folder), True), "w8k", calls)
    size = len(text.encode()) / 1024
    print(f"\n### Cost on a {size:.0f} KB answer (CPU, p50 of {calls}; in-process gateway, files_read)\n")
    print("| what | CPU ms |")
    print("|---|---|")
    print(f"| counting its tokens (sampled, what every call pays) | {statistics.median(counting) * 1000:.2f} |")
    print(f"| counting every token of it (the whole text through the tokenizer) | {whole_ms:.1f} |")
    print(f"| the call, no budget (a large client): {plain[1]:,} bytes delivered | {plain[0]:.2f} |")
    print(f"| the call cut to an 8K client's budget (800 tokens), the rest kept: {cut[1]:,} bytes | {cut[0]:.2f} |")


def _in_section(hit: dict[str, Any], label: dict[str, Any], ranges: dict[tuple[str, str], tuple[int, int]]) -> bool:
    start, end = ranges[(label["file"], label["section"])]
    line = hit.get("line")
    return hit.get("file") == label["file"] and isinstance(line, int) and start <= line < end


def _ranges(labels: list[dict[str, Any]]) -> dict[tuple[str, str], tuple[int, int]]:
    """The line range of each label's section; a label whose section the docs no longer have is left out."""
    from bench.bench_retrieval import _section_range

    found = {}
    for lab in labels:
        try:
            found[(lab["file"], lab["section"])] = _section_range(DOCS, lab["file"], lab["section"])
        except SystemExit:
            continue
    return found


async def _loop(client: str, labels: list[dict[str, Any]], budget: bool) -> tuple[list[int], list[bool], list[int]]:
    """Per question: tokens received (search + neighbours), whether a hit is in the shown top 5, hits shown."""
    info = types.Implementation(name=client, version="1")
    route = (
        "routes:\n  files_search:\n    providers:\n      - {provider: wiki/wiki_hybrid_search, "
        'arguments: {query: "{query}", limit: "{limit}"}}\n'
    )
    tokens, found, shown = [], [], []
    ranges = _ranges(labels)
    async with in_process_gateway(_config(DOCS, budget, route), client_info=info) as (session, _):
        with anyio.fail_after(60):  # the semantic index builds in the background after the start
            while (await session.call_tool("files_search", {"query": "ready?"})).is_error:  # noqa: ASYNC110 (no event to wait on)
                await anyio.sleep(0.2)
        for label in labels:
            search = await session.call_tool("files_search", {"query": label["q"], "limit": 10})
            texts = [b.text for b in search.content if isinstance(b, types.TextContent)]
            hits = json.loads(texts[0])
            received = sum(count_tokens(t) for t in texts)
            if hits:
                near = await session.call_tool("files_neighbors", {"path": hits[0]["file"]})
                received += sum(count_tokens(b.text) for b in near.content if isinstance(b, types.TextContent))
            tokens.append(received)
            found.append(any(_in_section(h, label, ranges) for h in hits[:5]))
            shown.append(len(hits))
    return tokens, found, shown


def savings(windows: tuple[int | None, ...]) -> None:
    every = yaml.safe_load((ROOT / "bench" / "retrieval_questions.yaml").read_text(encoding="utf-8"))
    ranges = _ranges(every)
    labels = [lab for lab in every if (lab["file"], lab["section"]) in ranges]
    if len(labels) < len(every):
        print(f"({len(every) - len(labels)} of {len(every)} labels name a section docs/ no longer has: left out)")
    names = {None: "no window declared (no budget)", 8_000: "w8k", 32_000: "w32k", 128_000: "w128k"}
    base = anyio.run(_loop, "none", labels, False)
    print(f"\n### Savings on docs/ ({len(labels)} labelled questions; search (hybrid, limit 10) then neighbours)\n")
    print(
        "| client | budget per answer | tokens received, total | vs no budget | median per question | hits shown "
        "(median) | recall@5 of shown hits | uncut recall@5 |"
    )
    print("|---|---|---|---|---|---|---|---|")
    for window in windows:
        tokens, found, shown = base if window is None else anyio.run(_loop, names[window], labels, True)
        budget = "-" if window is None else f"{window // 10:,}"
        print(
            f"| {names[window]} | {budget} | {sum(tokens):,} | {sum(tokens) / sum(base[0]):.0%} | "
            f"{statistics.median(tokens):,.0f} | {statistics.median(shown):.0f} | {sum(found) / len(found):.3f} | "
            f"{sum(base[1]) / len(base[1]):.3f} |"
        )


def catalog() -> None:
    """What the default federation's tools/list costs with the router note in every router tool and placed once."""
    import sys

    text = (ROOT / "federation.yaml").read_text(encoding="utf-8")
    once = text.replace("  router_note: |", "  router_note_in: once\n  router_note: |", 1)
    rows = []
    for name, body in (("each (as the reference system)", text), ("once (instructions + one tool)", once)):
        variant = ROOT / ".bench-federation.yaml"  # beside the real one: its relative paths resolve the same
        variant.write_text(body, encoding="utf-8")
        try:
            found = [
                subprocess.run(
                    [sys.executable, "-m", "gateway", "tools", "-c", str(variant), *extra],
                    capture_output=True, text=True, check=True, cwd=ROOT, timeout=300,
                ).stdout
                for extra in (["--json"], [])
            ]  # fmt: skip
        finally:
            variant.unlink()
        tools = json.loads(found[0])
        notes = sum("Router (which tool" in (t["description"] or "") for t in tools)
        size = sum(len((t["description"] or "").encode()) for t in tools)
        costs = re.search(r"costs a client ~([\d,]+) tokens \(large context\), ~([\d,]+)", found[1])
        assert costs is not None, found[1][-300:]
        rows.append((name, len(tools), notes, size, costs.group(1), costs.group(2)))
    print("\n### The default catalog's cost\n")
    print(
        "| router note | tools | descriptions with the note | description bytes | tools/list tokens, large / others |"
    )
    print("|---|---|---|---|---|")
    for name, count, notes, size, large, small in rows:
        print(f"| {name} | {count} | {notes} | {size:,} | {large} / {small} |")


def main() -> None:
    configure_logging("warning")
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--anthropic", help="the folder of an installed npm @anthropic-ai/tokenizer (needs node)")
    parser.add_argument("--calls", type=int, default=50, help="calls per timing")
    parser.add_argument("--only", choices=("agreement", "cost", "savings", "catalog"), action="append")
    args = parser.parse_args()
    only = set(args.only or ("agreement", "cost", "savings", "catalog"))
    if "agreement" in only:
        agreement(args.anthropic)
    if "cost" in only:
        cost(args.calls)
    if "savings" in only:
        savings(WINDOWS)
    if "catalog" in only:
        catalog()


if __name__ == "__main__":
    main()
