"""A route's declared result shape: whoever serves the call, the client gets one form (``routes.X.result``).

The router calls ``shape_result`` once, on the answer a route's provider gave, before the gateway's ``_meta`` entry
is added; so a provider added to the route later inherits the shape without any code of its own.

``shape: search_hits`` (docs/configuration.md, "Result shapes"):
  * the hits are read from the answer's ``structuredContent`` (a ``results`` list, or the only list in it), else
    from its text (the first ``[`` to the last ``]``, parsed as JSON);
  * each hit becomes ``{file, title, line, score, snippet}``: ``file`` from the hit's ``file`` / ``path`` /
    ``filepath`` / ``displayPath``, rewritten by the longest matching prefix of ``paths`` (``qmd://docs/x.md`` ->
    ``x.md``), so it is a path ``files_read`` and ``files_neighbors`` accept; ``line`` an integer or null; a
    leading diff-style ``@@ -12,4 @@ ...`` header line, and line-number prefixes (``148: ``) when every line has
    one, are dropped from the snippet;
  * ``score`` is on a 0..1 scale, higher is better, and the answer's ``_meta["mcp-gateway/result"]`` names the
    scale (``SCALES``): the provider's declared one (``scores``; raw BM25 is mapped as s / (1 + s), as qmd maps its
    own), or ``rank`` (1, 1/2, 1/3, ...) when the provider's scores do not tell the hits apart — all equal, all zero
    or missing — as BM25 over a small corpus does (FTS5 clamps the weight of a word most pages contain to ~0);
  * the text is the JSON array (one hit per line) and ``structuredContent`` is ``{"results": [...]}``.

An ``isError`` answer passes untouched. An answer whose hits cannot be read passes untouched too, with the reason
in ``_meta["mcp-gateway/result"]["error"]``: the client still gets what the provider said.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Sequence
from typing import Any

import mcp_types as types

from gateway.config import SearchHitsResult
from gateway.ledger.records import AuditStep

__all__ = ["RESULT_META_KEY", "SCALES", "shape_result"]

RESULT_META_KEY = "mcp-gateway/result"
"""The key, in a shaped answer's ``_meta``, of what the shaping did: the shape, the hit count, the score's scale."""

SCALES = {
    "bm25": "keyword relevance (BM25) mapped to 0..1 as s/(1+s); higher is better",
    "cosine": "semantic similarity of the query's and the passage's embeddings, 0..1; higher is better",
    "rerank": "a reranking model's relevance, 0..1; higher is better",
    "rrf": "reciprocal-rank fusion of several searches, the best hit scaled to 1; only the order means something",
    "rank": "1/rank (1, 0.5, 0.333, ...): the provider's scores did not tell the hits apart (all equal, zero or "
    "missing); only the order means something",
    "unspecified": "as the provider gave it; its meaning is not declared (routes.<name>.result.scores)",
}
"""Every scale a shaped score can be on, and what it means (also sent in ``_meta``)."""

_PATH_KEYS = ("file", "path", "filepath", "displayPath")
_SNIPPET_KEYS = ("snippet", "text", "content")
_HUNK_HEADER = re.compile(r"^@@ [^\n]*@@[^\n]*(\n|$)")
_LINE_NUMBER = re.compile(r"^\d+: ?")


class _Unreadable(Exception):
    pass


def shape_result(
    spec: SearchHitsResult | None, result: types.CallToolResult, steps: Sequence[AuditStep]
) -> types.CallToolResult:
    """``result`` brought to ``spec``'s shape (``result`` itself when there is no shape or it is an error)."""
    served = next((s for s in reversed(steps) if s.outcome == "ok"), None)
    if spec is None or result.is_error or served is None:
        return result
    meta = dict(result.meta or {})
    try:
        raw = _read_hits(result)
    except _Unreadable as exc:
        meta[RESULT_META_KEY] = {"shape": spec.shape, "error": f"{served.provider}: {exc}; passed as given"}
        return result.model_copy(update={"meta": meta})
    declared = _declared_scale(spec, served)
    hits = [_hit(spec, item) for item in raw]
    scale = _rescore(hits, raw, declared)
    text = "[\n" + ",\n".join(json.dumps(h, ensure_ascii=False) for h in hits) + "\n]" if hits else "[]"
    meta[RESULT_META_KEY] = {"shape": spec.shape, "hits": len(hits), "score_scale": scale, "score": SCALES[scale]}
    return types.CallToolResult(
        content=[types.TextContent(type="text", text=text)],
        structured_content={"results": hits},
        is_error=False,
        _meta=meta,
    )


def _read_hits(result: types.CallToolResult) -> list[dict[str, Any]]:
    structured = result.structured_content
    found: Any = None
    if isinstance(structured, dict):
        if isinstance(structured.get("results"), list):
            found = structured["results"]
        else:
            lists = [v for v in structured.values() if isinstance(v, list)]
            found = lists[0] if len(lists) == 1 else None
    if found is None:
        text = "".join(getattr(block, "text", "") for block in result.content)
        start, end = text.find("["), text.rfind("]")
        if start < 0 or end < start:
            raise _Unreadable("no JSON array of hits in the answer")
        try:
            found = json.loads(text[start : end + 1])
        except json.JSONDecodeError as exc:
            raise _Unreadable(f"the answer's array is not JSON ({exc.msg} at char {exc.pos})") from None
    if not isinstance(found, list):
        raise _Unreadable("the answer's hits are not a list")
    return [item for item in found if isinstance(item, dict)]


def _declared_scale(spec: SearchHitsResult, served: AuditStep) -> str:
    if served.variant is not None:
        by_variant = spec.scores.get(f"{served.provider}[{served.variant}]")
        if by_variant is not None:
            return by_variant
    return spec.scores.get(served.provider, "unspecified")


def _hit(spec: SearchHitsResult, item: dict[str, Any]) -> dict[str, Any]:
    path = next((item[k] for k in _PATH_KEYS if isinstance(item.get(k), str) and item[k]), "")
    line = item.get("line")
    snippet = next((item[k] for k in _SNIPPET_KEYS if isinstance(item.get(k), str)), "")
    title = item.get("title")
    return {
        "file": map_path(spec.paths, path),
        "title": title if isinstance(title, str) else "",
        "line": line if isinstance(line, int) and not isinstance(line, bool) else None,
        "score": 0.0,
        "snippet": _clean_snippet(snippet),
    }


def _clean_snippet(snippet: str) -> str:
    """Without line-number prefixes (when every line has one) and a leading ``@@ ... @@`` header line."""
    lines = snippet.split("\n")
    if lines and all(_LINE_NUMBER.match(line) for line in lines):
        snippet = "\n".join(_LINE_NUMBER.sub("", line, count=1) for line in lines)
    return _HUNK_HEADER.sub("", snippet.lstrip("\n"), count=1).strip("\n")


def map_path(paths: dict[str, str], path: str) -> str:
    """``path`` with its longest prefix found in ``paths`` replaced by that prefix's value."""
    for prefix in sorted(paths, key=len, reverse=True):
        if path.startswith(prefix):
            return paths[prefix] + path[len(prefix) :]
    return path


def _rescore(hits: list[dict[str, Any]], raw: list[dict[str, Any]], declared: str) -> str:
    """Fill each hit's score on one 0..1 scale; the scale's name."""
    scores: list[float] = []
    for item in raw:
        value = item.get("score")
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            scores = []
            break
        scores.append(float(value))
    if not hits:
        return "bm25" if declared == "bm25_raw" else declared
    if not scores or (len(set(scores)) == 1 and (len(scores) > 1 or scores[0] == 0)):
        for rank, hit in enumerate(hits, start=1):
            hit["score"] = round(1 / rank, 4)
        return "rank"
    if declared == "bm25_raw":
        scores = [abs(s) / (1 + abs(s)) for s in scores]
        declared = "bm25"
    elif declared == "rrf" and max(scores) > 0:  # fused ranks: only the order means something, the best is 1
        top = max(scores)
        scores = [max(0.0, s) / top for s in scores]
    elif declared == "cosine":  # similarity below 0 is as good as none
        scores = [min(1.0, max(0.0, s)) for s in scores]
    for hit, score in zip(hits, scores, strict=True):
        hit["score"] = round(score, 4)
    return declared
