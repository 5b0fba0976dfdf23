"""Finding the right tool among thousands: a hybrid keyword + semantic index over tool definitions. Pure, blocking.

``ToolIndex.build(docs, embedder)`` indexes each tool's name, description, and parameter names and descriptions:
  * **keyword**: BM25 (``ranking.Bm25``) over words, where names are split at ``_``, ``-``, ``.``, ``/`` and
    camelCase boundaries (``getIssueComments`` -> get, issue, comments), every word lower-cased and lightly stemmed
    (issues -> issue), the name's words counted ``NAME_WEIGHT`` times (a name is the densest summary a tool has);
  * **semantic**: the shared static embedding model (``ranking.Embedder``) over the name's words, the description's
    head and the parameter names, stop words left out, plus the name's own vector (``NAME_VECTOR_WEIGHT``); ranked
    by cosine similarity to the query's vector (its stop words left out too);
  * **hybrid**: both rankings fused by reciprocal rank fusion (``ranking.fuse``), the keyword side weighted
    ``KEYWORD_WEIGHT``. The constants were tuned on the first half of bench/toolsearch_requests.yaml only (see
    docs/benchmarks.md, "Tool search").

Filters (``backends``, ``read_only``, ``destructive``, ``allowed``) are applied before ranking, so a filtered search
still returns ``limit`` tools when that many match. Annotations are read as the MCP spec defines them: a tool without
``readOnlyHint`` is not read-only, and a tool that is not read-only is destructive unless it says
``destructiveHint: false``. Without an embedder (the model could not be loaded) semantic and hybrid searches fall back
to keyword ranking, and ``ToolIndex.semantic_reason`` says why.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import numpy.typing as npt

from gateway.search.ranking import Bm25, Embedder, Vectors, fuse, nearest

__all__ = ["KEYWORD_WEIGHT", "NAME_WEIGHT", "Mode", "ToolDoc", "ToolIndex", "words"]

Mode = Literal["keyword", "semantic", "hybrid"]

NAME_WEIGHT = 4
"""How many times a name's words count in a tool's BM25 document."""
KEYWORD_WEIGHT = 0.5
"""The keyword ranking's weight in the fusion (the semantic ranking's is 1)."""
FUSION_K = 30.0
"""The fusion's rank constant (``ranking.RRF_K``)."""
FUSION_DEPTH = 50
"""How far down each ranking the fusion looks."""
NAME_VECTOR_WEIGHT = 1.0
"""A tool's vector is its text's vector plus this times its name's vector (then normalised): a static embedding
averages every word, and the name says what the tool does in the fewest."""
_EMBED_DESCRIPTION_CHARS = 100  # a static vector blurs as the text grows: the head says what the tool is for
_PARAM_LIMIT = 40  # parameters past this many (a generated schema) add nothing to what a tool is for

_PUNCTUATION = ".,;:!?()[]{}'\"`"
_SPLIT = re.compile(r"[A-Z]+(?=[A-Z][a-z])|[A-Z]?[a-z]+|[A-Z]+|\d+")
_STOPWORDS = frozenset(
    "a an and are as at be but by can do does for from has have how i if in into is it its me my no not of on or "
    "our so that the their then there these they this to was we what when where which who why will with you your "
    "please want need some any all".split()
)


def _stem(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 4 and word.endswith(("sses", "xes", "ches", "shes")):
        return word[:-2]
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    if len(word) > 5 and word.endswith("ing"):
        return word[:-3]
    if len(word) > 4 and word.endswith("ed") and not word.endswith("eed"):
        return word[:-2]
    return word


def words(text: str) -> list[str]:
    """``text``'s words for keyword ranking: identifiers split at ``_``/``-``/``.`` and camelCase, lower-cased,
    stemmed; stop words left out."""
    out = []
    for part in _SPLIT.findall(text):
        word = part.lower()
        if word not in _STOPWORDS:
            out.append(_stem(word))
    return out


@dataclass(frozen=True, slots=True)
class ToolDoc:
    """What the index knows of one tool."""

    name: str
    description: str
    backends: tuple[str, ...]  # the backends that serve it (a route has several)
    input_schema: Mapping[str, Any]
    annotations: Mapping[str, Any]

    @property
    def read_only(self) -> bool:
        return self.annotations.get("readOnlyHint") is True

    @property
    def destructive(self) -> bool:
        return not self.read_only and self.annotations.get("destructiveHint") is not False

    def parameters(self) -> list[tuple[str, str]]:
        """The top-level parameters' names and descriptions."""
        properties = self.input_schema.get("properties")
        if not isinstance(properties, Mapping):
            return []
        found = []
        for name, spec in list(properties.items())[:_PARAM_LIMIT]:
            description = spec.get("description") if isinstance(spec, Mapping) else None
            found.append((str(name), description if isinstance(description, str) else ""))
        return found


def _keyword_counts(doc: ToolDoc) -> Counter[str]:
    counts: Counter[str] = Counter()
    for word in words(doc.name):
        counts[word] += NAME_WEIGHT
    counts.update(words(doc.description))
    for name, description in doc.parameters():
        counts.update(words(name))
        counts.update(words(description))
    return counts


def _content(text: str) -> str:
    """``text`` without its stop words (a static vector is their average too), or as it is if nothing else is left."""
    kept = [w for w in text.split() if w.lower().strip(_PUNCTUATION) not in _STOPWORDS]
    return " ".join(kept) if kept else text


def _name_text(doc: ToolDoc) -> str:
    return " ".join(_SPLIT.findall(doc.name)).lower()


def _embedding_text(doc: ToolDoc) -> str:
    head = doc.description.strip()
    if len(head) > _EMBED_DESCRIPTION_CHARS:
        head = head[:_EMBED_DESCRIPTION_CHARS]
    params = " ".join(" ".join(_SPLIT.findall(name)).lower() for name, _ in doc.parameters())
    return _content(f"{_name_text(doc)}. {head} {params}".strip())


def _vectors(embedder: Embedder, docs: Sequence[ToolDoc]) -> Vectors:
    matrix = embedder.embed([_embedding_text(doc) for doc in docs])
    matrix += NAME_VECTOR_WEIGHT * embedder.embed([_name_text(doc) for doc in docs])
    norms = np.linalg.norm(matrix, axis=1, keepdims=True)
    np.divide(matrix, norms, out=matrix, where=norms > 0)
    return matrix


@dataclass(frozen=True)
class ToolIndex:
    """One immutable snapshot: the tools, their BM25 postings and (when the model loaded) their vectors."""

    docs: tuple[ToolDoc, ...]
    bm25: Bm25
    matrix: Vectors | None
    embedder: Embedder | None
    semantic_reason: str | None
    build_s: float

    @classmethod
    def build(cls, docs: Sequence[ToolDoc], embedder: Embedder | None, reason: str | None = None) -> ToolIndex:
        """Index ``docs``; with ``embedder`` None, ``reason`` says why searches are keyword only."""
        began = time.perf_counter()
        docs = tuple(docs)
        bm25 = Bm25([_keyword_counts(doc) for doc in docs])
        matrix = None
        if embedder is not None:
            matrix = _vectors(embedder, docs) if docs else None
        return cls(docs, bm25, matrix, embedder, None if embedder is not None else reason, time.perf_counter() - began)

    def __len__(self) -> int:
        return len(self.docs)

    def mask(
        self,
        backends: Collection[str] | None = None,
        read_only: bool | None = None,
        destructive: bool | None = None,
        allowed: Collection[str] | None = None,
    ) -> npt.NDArray[np.bool_] | None:
        """Which tools pass the filters (None: all of them)."""
        if backends is None and read_only is None and destructive is None and allowed is None:
            return None
        keep = np.ones(len(self.docs), dtype=bool)
        for i, doc in enumerate(self.docs):
            if backends is not None and not any(b in backends for b in doc.backends):
                keep[i] = False
            elif read_only is not None and doc.read_only is not read_only:
                keep[i] = False
            elif destructive is not None and doc.destructive is not destructive:
                keep[i] = False
            elif allowed is not None and doc.name not in allowed:
                keep[i] = False
        return keep

    def keyword(self, query: str, limit: int, keep: npt.NDArray[np.bool_] | None = None) -> list[tuple[int, float]]:
        scores = self.bm25.dense(words(query))
        if keep is not None:
            scores[~keep] = 0.0
        matched = int(np.count_nonzero(scores))
        count = min(limit, matched)
        if count <= 0:
            return []
        top = np.argpartition(-scores, count - 1)[:count]
        ranked = sorted(top.tolist(), key=lambda i: (-float(scores[i]), i))
        return [(i, float(scores[i])) for i in ranked]

    def semantic(self, query: str, limit: int, keep: npt.NDArray[np.bool_] | None = None) -> list[tuple[int, float]]:
        if self.embedder is None or self.matrix is None:
            return self.keyword(query, limit, keep)
        return nearest(self.matrix, self.embedder.embed([_content(query)])[0], limit, keep)

    def search(
        self,
        query: str,
        limit: int = 8,
        mode: Mode = "hybrid",
        *,
        backends: Collection[str] | None = None,
        read_only: bool | None = None,
        destructive: bool | None = None,
        allowed: Collection[str] | None = None,
    ) -> list[tuple[int, float]]:
        """The ``limit`` best tools for ``query`` among those passing the filters: (position in ``docs``, score),
        best first. ``allowed`` is the seam for per-caller policies: the names a caller may see."""
        keep = self.mask(backends, read_only, destructive, allowed)
        if keep is not None and not keep.any():
            return []
        if mode == "keyword" or self.embedder is None:
            return self.keyword(query, limit, keep)
        if mode == "semantic":
            return self.semantic(query, limit, keep)
        depth = max(limit, FUSION_DEPTH)
        return fuse(
            (self.keyword(query, depth, keep), self.semantic(query, depth, keep)),
            limit,
            FUSION_K,
            (KEYWORD_WEIGHT, 1.0),
        )
