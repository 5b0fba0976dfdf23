"""Semantic and hybrid search over the wiki's sections, by pure, blocking functions.

Each page is cut into sections at its headings (outside fenced code), one over ``SECTION_WORDS`` words into windows
at paragraph boundaries, and each is embedded with its page title and heading in front by the gateway's static
embedding model (search/ranking.py; ``SemanticUnavailable`` when it cannot be loaded). ``build_semantic`` makes one
immutable ``SemanticIndex``, embedding only the pages whose parse the keyword index did not reuse. ``vector`` ranks
sections by cosine similarity; ``hybrid`` fuses that ranking with BM25's over the same sections by reciprocal rank
fusion. A hit is ``{file, title, line, score, snippet}``: ``file`` is the path ``files_read`` takes, ``line`` the
1-based line the snippet starts at.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from gateway.backends.wiki.index import _WORD, _front_matter, _Index, _Parsed, _tokens
from gateway.search.ranking import (
    RRF_K,
    Embedder,
    SemanticUnavailable,
    Vectors,
    fuse,
    load_embedder,
    load_from,
    nearest,
)
from gateway.search.ranking import Bm25 as _Bm25

__all__ = [
    "SECTION_WORDS",
    "Embedder",
    "SemanticIndex",
    "SemanticUnavailable",
    "Section",
    "build_semantic",
    "load_embedder",
    "load_from",
    "sections_of",
]

SECTION_WORDS = 200
"""A section longer than this many words is cut into windows at paragraph boundaries (static vectors blur when long)."""
EMBED_CHUNK = 64
"""Sections embedded between two checks that the build should go on (a tenth of a second or so on 2 cores)."""
_FUSION_DEPTH = 50  # how far down each ranking hybrid search looks before fusing
_MAX_SECTIONS_PER_PAGE = 2_000  # a pathological page cannot flood the index
_SNIPPET_CHARS = 300
# Words that carry no topic: left out of the keyword half of a search (unless nothing else is left), so a section
# does not rank for "how do I ..." on its "the"s and "a"s alone; the vector half still sees the whole question.
_STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from has have how i if in into is it its me my no not of on or "
    "our so that the their then there these they this to was we what when where which who why will with you "
    "your".split()
)
_HEADING_LINE = re.compile(r"^[ ]{0,3}(#{1,6})[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$")
_FENCE = re.compile(r"^[ \t]*(`{3,}|~{3,})")


@dataclass(frozen=True, slots=True)
class Section:
    """One searchable piece of a page: a heading's section, or a window of a long one."""

    path: str
    title: str  # the page title, then the section heading when it differs
    line: int  # 1-based line of the window's first line in the file
    lines: tuple[str, ...]  # the window's lines, as in the file
    heading: str


# --------------------------------------------------------------------------------------------------- sections


def sections_of(path: str, title: str, text: str) -> tuple[Section, ...]:
    """Cut one page into sections at its headings (not inside fenced code), long ones into paragraph windows."""
    _, body = _front_matter(text)
    first_line = text.count("\n", 0, body) + 1
    lines = text[body:].splitlines()
    found: list[Section] = []
    heading = title
    start = 0
    fence: str | None = None
    for number, line in enumerate(lines):
        opened = _FENCE.match(line)
        if opened is not None:
            marker = opened.group(1)
            if fence is None:
                fence = marker[0] * 3
            elif marker.startswith(fence):
                fence = None
            continue
        if fence is not None:
            continue
        match = _HEADING_LINE.match(line)
        if match is not None and number > start:
            _windows(found, path, title, heading, lines[start:number], first_line + start)
            start = number
        if match is not None:
            heading = match.group(2).strip()
    _windows(found, path, title, heading, lines[start:], first_line + start)
    return tuple(found[:_MAX_SECTIONS_PER_PAGE])


def _windows(out: list[Section], path: str, title: str, heading: str, lines: list[str], line: int) -> None:
    """Append ``lines`` (one section) as windows of at most about ``SECTION_WORDS`` words, cut at blank lines."""
    label = title if heading in ("", title) else f"{title} › {heading}"
    window: list[str] = []
    words = 0
    begin = 0
    for offset, text in enumerate(lines):
        count = len(_WORD.findall(text))
        if window and not text.strip() and words >= SECTION_WORDS:
            _add(out, path, label, heading, window, line + begin)
            window, words, begin = [], 0, offset + 1
            continue
        if not window and not text.strip():
            begin = offset + 1
            continue
        window.append(text)
        words += count
        if words >= 3 * SECTION_WORDS:  # one huge paragraph: cut it anyway
            _add(out, path, label, heading, window, line + begin)
            window, words, begin = [], 0, offset + 1
    _add(out, path, label, heading, window, line + begin)


def _add(out: list[Section], path: str, label: str, heading: str, window: list[str], line: int) -> None:
    while window and not window[-1].strip():
        window.pop()
    if window and any(_WORD.search(text) for text in window):
        out.append(Section(path, label, line, tuple(window), heading))


def _embedding_text(section: Section) -> str:
    return section.title + "\n" + "\n".join(section.lines)


# --------------------------------------------------------------------------------------------------- the index


@dataclass(frozen=True, slots=True)
class _PageVectors:
    parsed: _Parsed
    sections: tuple[Section, ...]
    vectors: Vectors
    counts: tuple[Counter[str], ...]  # each section's words, for the BM25 postings


@dataclass(frozen=True, slots=True)
class SemanticIndex:
    """One immutable snapshot: every section of the wiki, its vector and its BM25 postings."""

    source: _Index  # the keyword index it was built from
    sections: tuple[Section, ...]
    matrix: Vectors  # (sections, dimensions), unit rows
    bm25: _Bm25
    pages: Mapping[str, _PageVectors]
    embedded: int  # sections embedded by this build (the rest were reused)
    build_s: float

    def vector(self, embedder: Embedder, query: str, limit: int) -> list[tuple[int, float]]:
        """The ``limit`` sections nearest to ``query`` (cosine similarity), best first."""
        if not self.sections:
            return []
        return nearest(self.matrix, embedder.embed([query])[0], limit)

    def keyword(self, query: str, limit: int) -> list[tuple[int, float]]:
        """The ``limit`` sections with the highest BM25 score for ``query``'s words (stop words left out unless
        they are all there is), best first."""
        words = _tokens(query)
        return self.bm25.search([w for w in words if w not in _STOPWORDS] or words, limit)

    def hybrid(self, embedder: Embedder, query: str, limit: int) -> list[tuple[int, float]]:
        """BM25 and vector rankings fused by reciprocal rank fusion, best first."""
        depth = max(limit, _FUSION_DEPTH)
        return fuse((self.keyword(query, depth), self.vector(embedder, query, depth)), limit, RRF_K)

    def result(self, i: int, score: float, query: str) -> dict[str, Any]:
        """The documented result shape for section ``i``."""
        section = self.sections[i]
        line, snippet = _snippet(section, set(_tokens(query)))
        return {"file": section.path, "title": section.title, "line": line, "score": round(score, 4),
                "snippet": snippet}  # fmt: skip


def build_semantic(
    embedder: Embedder,
    index: _Index,
    previous: SemanticIndex | None = None,
    checkpoint: Callable[[], None] = lambda: None,
) -> SemanticIndex:
    """The semantic snapshot of ``index``; pages whose parse is unchanged keep their vectors. Blocking.

    The sections are embedded ``EMBED_CHUNK`` at a time, ``checkpoint()`` called before each chunk: it raises to
    stop the build (in a worker thread, ``anyio.from_thread.check_cancelled``), so a stopping gateway waits for one
    chunk, not for a whole wiki's embedding."""
    began = time.perf_counter()
    old = previous.pages if previous is not None else {}
    pages: dict[str, _PageVectors] = {}
    todo: list[tuple[str, _Parsed, tuple[Section, ...]]] = []
    for path, parsed in index.parsed.items():
        kept = old.get(path)
        if kept is not None and kept.parsed is parsed:
            pages[path] = kept
        else:
            todo.append((path, parsed, sections_of(path, parsed.page.title, parsed.text)))
    texts = [_embedding_text(s) for _, _, sections in todo for s in sections]
    chunks = []
    for start in range(0, len(texts), EMBED_CHUNK):
        checkpoint()
        chunks.append(embedder.embed(texts[start : start + EMBED_CHUNK]))
    vectors = np.concatenate(chunks) if chunks else np.zeros((0, embedder.dimensions), dtype=np.float32)
    at = 0
    for path, parsed, sections in todo:
        counts = tuple(Counter(_tokens(_embedding_text(s))) for s in sections)
        pages[path] = _PageVectors(parsed, sections, vectors[at : at + len(sections)], counts)
        at += len(sections)
    ordered = [pages[path] for path in index.parsed]
    all_sections = tuple(s for page in ordered for s in page.sections)
    matrix = (
        np.ascontiguousarray(np.concatenate([page.vectors for page in ordered]), dtype=np.float32)
        if ordered
        else np.zeros((0, embedder.dimensions), dtype=np.float32)
    )
    bm25 = _Bm25([c for page in ordered for c in page.counts])
    return SemanticIndex(index, all_sections, matrix, bm25, pages, len(texts), time.perf_counter() - began)


def _snippet(section: Section, terms: set[str]) -> tuple[int, str]:
    """The section's line with the most query words (else its first line of text after the heading), and a snippet
    of up to ``_SNIPPET_CHARS`` characters starting there."""
    lines = section.lines
    best, best_hits = 0, -1
    for number, text in enumerate(lines):
        if not text.strip():
            continue
        hits = len(terms.intersection(_tokens(text)))
        if _HEADING_LINE.match(text) and len(lines) > 1:
            hits -= 1  # prefer the text under a heading to the heading itself
        if hits > best_hits:
            best, best_hits = number, hits
    snippet = " ".join(text.strip() for text in lines[best : best + 4] if text.strip())
    if len(snippet) > _SNIPPET_CHARS:
        snippet = snippet[: _SNIPPET_CHARS - 1].rstrip() + "…"
    return section.line + best, snippet
