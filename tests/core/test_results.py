"""A route's declared result shape (gateway/results.py): every provider's answer becomes the same JSON array.

The answers below are the exact forms measured from each provider of the default files_search route: qmd's MCP
server (hits only in structuredContent, a "Found N results" text, `docs/x.md` paths, line-numbered snippets), the
qmd CLI (a JSON array as text, `qmd://docs/x.md` paths, a diff-style header in the snippet, every BM25 score 0 over a
small corpus) and the built-in wiki (raw BM25, `path` instead of `file`).
"""

from __future__ import annotations

import json
from typing import Any

import mcp_types as types

from gateway.config import SearchHitsResult
from gateway.core.results import RESULT_META_KEY, SCALES, map_path, shape_result
from gateway.ledger.records import AuditStep

SPEC = SearchHitsResult(
    shape="search_hits",
    paths={"qmd://docs/": "", "docs/": "", "qmd://notes/": "notes/"},
    scores={
        "qmd-mcp/query": "rrf",
        "qmd/files_search[keyword]": "bm25",
        "qmd/files_search[vector]": "cosine",
        "wiki/wiki_search": "bm25_raw",
        "wiki/wiki_hybrid_search": "rrf",
        "wiki/wiki_vector_search": "cosine",
    },
)


def _served(provider: str, variant: str | None = None) -> list[AuditStep]:
    return [AuditStep(provider, variant, "ok", None, 1.0)]


def _hits(result: types.CallToolResult) -> list[dict[str, Any]]:
    assert isinstance(result.content[0], types.TextContent)
    parsed = json.loads(result.content[0].text)
    assert result.structured_content == {"results": parsed}
    return list(parsed)


def test_qmds_mcp_answer_becomes_the_array_with_wiki_paths_and_clean_snippets() -> None:
    answer = types.CallToolResult(
        content=[types.TextContent(text='Found 2 results for "reload":\n\n#c31ef0 100% docs/operations.md - Ops')],
        structured_content={
            "results": [
                {"docid": "#c31ef0", "file": "docs/operations.md", "title": "Operating the gateway", "score": 1,
                 "context": None, "line": 147, "snippet": "147: @@ -146,4 @@ (145 before, 611 after)\n148: \n"
                 "149: ### Reloading"},
                {"docid": "#e2a326", "file": "docs/configuration.md", "title": "Configuring", "score": 0.5,
                 "line": 12, "snippet": "12: Edit the file"},
            ]
        },
    )  # fmt: skip
    shaped = shape_result(SPEC, answer, _served("qmd-mcp/query"))
    assert _hits(shaped) == [
        {"file": "operations.md", "title": "Operating the gateway", "line": 147, "score": 1.0,
         "snippet": "### Reloading"},
        {"file": "configuration.md", "title": "Configuring", "line": 12, "score": 0.5, "snippet": "Edit the file"},
    ]  # fmt: skip
    assert shaped.meta == {RESULT_META_KEY: {"shape": "search_hits", "hits": 2, "score_scale": "rrf",
                                             "score": SCALES["rrf"]}}  # fmt: skip


def test_the_cli_floors_zero_scores_become_ranks_and_say_so() -> None:
    text = json.dumps([
        {"docid": "#1", "score": 0, "file": "qmd://docs/configuration.md", "line": 327, "title": "Config",
         "snippet": "@@ -326,4 @@ (325 before, 1270 after)\n| `drain_s` | how long"},
        {"docid": "#2", "score": 0, "file": "qmd://notes/a.md", "line": 5, "title": "A", "snippet": "x"},
        {"docid": "#3", "score": 0, "file": "qmd://docs/conformance.md", "line": 19, "title": "C", "snippet": "y"},
    ])  # fmt: skip
    answer = types.CallToolResult(content=[types.TextContent(text=text)], structured_content={"results": []})
    answer.structured_content = None
    shaped = shape_result(SPEC, answer, _served("qmd/files_search", "keyword"))
    hits = _hits(shaped)
    assert [(h["file"], h["score"]) for h in hits] == [
        ("configuration.md", 1.0), ("notes/a.md", 0.5), ("conformance.md", 0.3333),
    ]  # fmt: skip
    assert hits[0]["snippet"] == "| `drain_s` | how long"
    assert shaped.meta is not None and shaped.meta[RESULT_META_KEY]["score_scale"] == "rank"


def test_raw_bm25_is_mapped_onto_the_keyword_scale_and_path_becomes_file() -> None:
    results = [
        {"path": "ladder.md", "title": "Fallback ladder", "score": 3.0, "line": 2, "snippet": "Deep degrades"},
        {"path": "notes/memory.md", "title": "Memory", "score": 1.0, "line": 0, "snippet": "SQLite"},
    ]
    answer = types.CallToolResult(content=[types.TextContent(text=json.dumps(results))], structured_content=None)
    shaped = shape_result(SPEC, answer, _served("wiki/wiki_search"))
    assert [(h["file"], h["score"], h["line"]) for h in _hits(shaped)] == [
        ("ladder.md", 0.75, 2),
        ("notes/memory.md", 0.5, 0),
    ]
    assert shaped.meta is not None and shaped.meta[RESULT_META_KEY]["score_scale"] == "bm25"


def test_raw_fused_ranks_are_scaled_so_the_best_is_one_and_negative_similarity_is_none() -> None:
    # The wiki's hybrid rung gives raw reciprocal-rank-fusion sums (1/61 + 1/62 at best), its vector rung cosines.
    fused = [
        {"file": "ladder.md", "title": "Ladder", "score": 0.0325, "line": 3, "snippet": "a"},
        {"file": "memory.md", "title": "Memory", "score": 0.01625, "line": 1, "snippet": "b"},
    ]
    answer = types.CallToolResult(content=[types.TextContent(text=json.dumps(fused))])
    shaped = shape_result(SPEC, answer, _served("wiki/wiki_hybrid_search"))
    assert [(h["file"], h["score"]) for h in _hits(shaped)] == [("ladder.md", 1.0), ("memory.md", 0.5)]
    assert shaped.meta is not None and shaped.meta[RESULT_META_KEY]["score_scale"] == "rrf"
    similar = [
        {"file": "ladder.md", "title": "Ladder", "score": 0.62, "line": 3, "snippet": "a"},
        {"file": "memory.md", "title": "Memory", "score": -0.05, "line": 1, "snippet": "b"},
    ]
    answer = types.CallToolResult(content=[types.TextContent(text=json.dumps(similar))])
    shaped = shape_result(SPEC, answer, _served("wiki/wiki_vector_search"))
    assert [(h["file"], h["score"]) for h in _hits(shaped)] == [("ladder.md", 0.62), ("memory.md", 0.0)]


def test_a_variant_scale_wins_over_the_providers_and_an_undeclared_one_is_unspecified() -> None:
    text = json.dumps([{"file": "qmd://docs/a.md", "score": 0.83, "title": "A", "snippet": "s"},
                       {"file": "qmd://docs/b.md", "score": 0.41, "title": "B", "snippet": "t"}])  # fmt: skip
    answer = types.CallToolResult(content=[types.TextContent(text=text)])
    vector = shape_result(SPEC, answer, _served("qmd/files_search", "vector"))
    assert [(h["file"], h["score"], h["line"]) for h in _hits(vector)] == [("a.md", 0.83, None), ("b.md", 0.41, None)]
    assert vector.meta is not None and vector.meta[RESULT_META_KEY]["score_scale"] == "cosine"
    other = shape_result(SPEC, answer, _served("semantic/search"))
    assert other.meta is not None and other.meta[RESULT_META_KEY]["score_scale"] == "unspecified"


def test_errors_pass_untouched_and_unreadable_answers_pass_with_the_reason() -> None:
    error = types.CallToolResult(content=[types.TextContent(text="boom")], is_error=True)
    assert shape_result(SPEC, error, _served("qmd-mcp/query")) is error
    prose = types.CallToolResult(content=[types.TextContent(text="No results found.")])
    shaped = shape_result(SPEC, prose, _served("qmd-mcp/query"))
    assert shaped.content == prose.content
    reason = "qmd-mcp/query: no JSON array of hits in the answer; passed as given"
    assert shaped.meta == {RESULT_META_KEY: {"shape": "search_hits", "error": reason}}
    plain = types.CallToolResult(content=[types.TextContent(text="[]")])
    assert shape_result(None, plain, _served("qmd-mcp/query")) is plain
    empty = shape_result(SPEC, plain, _served("qmd/files_search", "keyword"))
    assert _hits(empty) == [] and empty.meta is not None and empty.meta[RESULT_META_KEY]["hits"] == 0


def test_the_longest_prefix_wins() -> None:
    paths = {"docs/": "", "docs/notes/": "notes/"}
    assert map_path(paths, "docs/notes/a.md") == "notes/a.md"
    assert map_path(paths, "docs/a.md") == "a.md"
    assert map_path(paths, "elsewhere/a.md") == "elsewhere/a.md"
