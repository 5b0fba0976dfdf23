"""Finding the right tool among thousands: a keyword + semantic index over tool definitions, and a calibrated
re-ranker that says how likely each hit fits and when nothing does. Pure, blocking.

``ToolIndex.build(docs, embedder)`` indexes each tool's name, description, parameters and backend:
  * **keyword**: BM25 (``ranking.Bm25``) over words, where names are split at ``_``, ``-``, ``.``, ``/`` and
    camelCase boundaries (``getIssueComments`` -> get, issue, comments), every word lower-cased and lightly stemmed
    (issues -> issue), the name's words counted ``NAME_WEIGHT`` times (a name is the densest summary a tool has) and
    the backend's name's ``BACKEND_WEIGHT`` times (a request often names the product: "in Redis");
  * **semantic**: the shared sentence model (``ranking.load_embedder``) over the name's words and the description's
    head, plus ``NAME_VECTOR_WEIGHT`` times the name's own vector; ranked by cosine similarity to the request's;
  * **hybrid**: the ``CANDIDATES`` best of each ranking are scored by a logistic model over eight features of the
    two (``FEATURES``): the score is the probability that the tool fits the request. A request whose best hit is
    unlikely, whose words the catalog barely knows, and whose nearest vector is far gets ``Ranking.fits`` False
    (a second logistic model, ``NOTHING_WEIGHTS``, over those three, with the threshold ``NOTHING_FITS``).
    Every weight was fitted on the development half of bench/toolsearch_blind/ by ``bench/toolsearch_fit.py``, in
    the whole catalog and in random subsets of its servers, so a score means the same among 30 tools as among
    1,259 (docs/benchmarks.md, "Tool search").

``build`` takes the previous index of the same model and embeds only the texts it did not hold (a catalog change
costs its new tools, not the whole catalog).

Filters (``backends``, ``read_only``, ``destructive``, ``allowed``) are applied before ranking, so a filtered search
still returns ``limit`` tools when that many match; ``learned`` (``search/learning.py``) adds what a caller's team
chose after earlier searches. Annotations are read as the MCP spec defines them: a tool without
``readOnlyHint`` is not read-only, and a tool that is not read-only is destructive unless it says
``destructiveHint: false``. Without an embedder (the model could not be loaded) semantic and hybrid searches fall back
to keyword ranking (scored by BM25, fitting when any word matches), and ``ToolIndex.semantic_reason`` says why.
"""

from __future__ import annotations

import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NamedTuple

import numpy as np
import numpy.typing as npt

from gateway.search.ranking import Bm25, Embedder, Vectors, nearest

__all__ = ["NAME_WEIGHT", "NOTHING_FITS", "Mode", "Ranking", "ToolDoc", "ToolIndex", "words"]

Mode = Literal["keyword", "semantic", "hybrid"]

NAME_WEIGHT = 4
"""How many times a name's words count in a tool's BM25 document."""
BACKEND_WEIGHT = 2
"""How many times the backend's name's words count in each of its tools' BM25 documents."""
NAME_VECTOR_WEIGHT = 0.5
"""A tool's vector is its text's vector plus this times its name's vector (then normalised)."""
CANDIDATES = 30
"""How many of each ranking's best the re-ranker scores."""
FEATURES = ("cos", "cos_text", "cos_name", "bm25_relative", "bm25_log", "rr_bm25", "rr_cos", "cos_gap")
FEATURE_WEIGHTS = (0.6381, 0.9714, -0.1387, 0.9040, 0.4687, 1.4995, 2.0325, 2.4053)
"""The re-ranker's weights over ``FEATURES`` and its bias (fitted by bench/toolsearch_fit.py on the dev half)."""
FEATURE_BIAS = -5.7585
NOTHING_WEIGHTS = (-0.4483, -7.9222)
"""The "nothing fits" model's weights over (the best hit's log-odds, the best cosine) and its bias. Features that
depend on the catalog's size (the share of a request's words it knows) were tried and left out: a three-tool
gateway then found nothing for anything."""
NOTHING_BIAS = 2.3306
NOTHING_FITS = 0.792
"""A request whose "nothing fits" probability reaches this is answered with no tool."""
_EMBED_DESCRIPTION_CHARS = 300  # the head says what the tool is for; the model reads at most 128 tokens
_PARAM_LIMIT = 40  # parameters past this many (a generated schema) add nothing to what a tool is for

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
    for backend in doc.backends:
        for word in words(backend):
            counts[word] += BACKEND_WEIGHT
    counts.update(words(doc.description))
    for name, description in doc.parameters():
        counts.update(words(name))
        counts.update(words(description))
    return counts


def _name_text(doc: ToolDoc) -> str:
    return " ".join(_SPLIT.findall(doc.name)).lower()


def _embedding_text(doc: ToolDoc) -> str:
    head = " ".join(doc.description.split())
    if len(head) > _EMBED_DESCRIPTION_CHARS:
        head = head[:_EMBED_DESCRIPTION_CHARS]
    return f"{_name_text(doc)}. {head}".strip()


def _sigmoid(x: npt.NDArray[np.float64]) -> npt.NDArray[np.float64]:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -30.0, 30.0)))


class Features(NamedTuple):
    """What the re-ranker and the "nothing fits" model read of one request."""

    candidates: npt.NDArray[np.int64]  # positions in ``docs``
    rows: npt.NDArray[np.float64]  # one row of ``FEATURES`` per candidate
    best_cos: float  # the best cosine among the tools kept


@dataclass(frozen=True, slots=True)
class Ranking:
    """A search's answer: hits (position in ``docs``, score) best first, and whether any of them fits. In hybrid
    mode a score is the probability that the tool fits; in keyword mode it is BM25's. ``nothing`` is the probability
    that no tool fits (None without the model)."""

    hits: list[tuple[int, float]]
    fits: bool
    nothing: float | None


@dataclass(frozen=True)
class ToolIndex:
    """One immutable snapshot: the tools, their BM25 postings and (when the model loaded) their vectors."""

    docs: tuple[ToolDoc, ...]
    bm25: Bm25
    embedder: Embedder | None
    semantic_reason: str | None
    build_s: float
    texts: tuple[str, ...] = ()
    text_matrix: Vectors | None = None
    name_matrix: Vectors | None = None
    matrix: Vectors | None = None
    embedded: int = 0  # texts embedded by this build (the rest came from the previous index)

    @classmethod
    def build(
        cls,
        docs: Sequence[ToolDoc],
        embedder: Embedder | None,
        reason: str | None = None,
        previous: ToolIndex | None = None,
    ) -> ToolIndex:
        """Index ``docs``; with ``embedder`` None, ``reason`` says why searches are keyword only. Vectors of texts
        ``previous`` (built with the same model) holds are reused."""
        began = time.perf_counter()
        docs = tuple(docs)
        bm25 = Bm25([_keyword_counts(doc) for doc in docs])
        if embedder is None or not docs:
            return cls(docs, bm25, embedder, None if embedder is not None else reason, time.perf_counter() - began)
        texts = tuple(_embedding_text(doc) for doc in docs)
        names = [_name_text(doc) for doc in docs]
        known: dict[str, npt.NDArray[np.float32]] = {}
        if previous is not None and previous.embedder is embedder and previous.text_matrix is not None:
            known.update(zip(previous.texts, previous.text_matrix, strict=True))
            known.update(zip((_name_text(d) for d in previous.docs), previous.name_matrix, strict=True))  # type: ignore[arg-type]
        todo = [t for t in dict.fromkeys([*texts, *names]) if t not in known]
        if todo:
            known.update(zip(todo, embedder.embed(todo), strict=True))
        text_matrix = np.stack([known[t] for t in texts]).astype(np.float32)
        name_matrix = np.stack([known[t] for t in names]).astype(np.float32)
        matrix = text_matrix + NAME_VECTOR_WEIGHT * name_matrix
        norms = np.linalg.norm(matrix, axis=1, keepdims=True)
        np.divide(matrix, norms, out=matrix, where=norms > 0)
        return cls(
            docs, bm25, embedder, None, time.perf_counter() - began, texts, text_matrix, name_matrix, matrix, len(todo)
        )

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
        return _top(scores, min(limit, int(np.count_nonzero(scores))))

    def query_vector(self, query: str) -> Vectors | None:
        """The request's unit vector (None without the model)."""
        return None if self.embedder is None else self.embedder.embed([query])[0]

    def semantic(self, query: str, limit: int, keep: npt.NDArray[np.bool_] | None = None) -> list[tuple[int, float]]:
        if self.embedder is None or self.matrix is None:
            return self.keyword(query, limit, keep)
        return nearest(self.matrix, self.embedder.embed([query])[0], limit, keep)

    def features(self, query: str, vector: Vectors, keep: npt.NDArray[np.bool_] | None = None) -> Features:
        """The re-ranker's candidates and their ``FEATURES`` rows, and the best cosine. Needs the model."""
        assert self.matrix is not None and self.text_matrix is not None and self.name_matrix is not None
        terms = words(query)
        kw = self.bm25.dense(terms)
        cos = (self.matrix @ vector).astype(np.float64)
        if keep is not None:
            kw[~keep] = 0.0
            cos[~keep] = -np.inf
        allowed = len(self.docs) if keep is None else int(keep.sum())
        depth = min(CANDIDATES, allowed)
        by_kw = [i for i, _ in _top(kw, min(depth, int(np.count_nonzero(kw))))]
        by_cos = [i for i, _ in _top(cos, depth)]
        cand = np.fromiter(dict.fromkeys(by_kw + by_cos), dtype=np.int64)
        best_cos = float(cos.max()) if allowed else 0.0
        if not len(cand):
            return Features(cand, np.zeros((0, len(FEATURES))), best_cos)
        kmax = float(kw.max()) or 1.0
        rank_kw = (kw[None, :] > kw[cand][:, None]).sum(axis=1)
        rank_cos = (cos[None, :] > cos[cand][:, None]).sum(axis=1)
        rows = np.column_stack(
            [
                cos[cand],
                self.text_matrix[cand] @ vector,
                self.name_matrix[cand] @ vector,
                kw[cand] / kmax,
                np.log1p(kw[cand]),
                1.0 / (1.0 + rank_kw),
                1.0 / (1.0 + rank_cos),
                cos[cand] - best_cos,
            ]
        ).astype(np.float64)
        return Features(cand, rows, best_cos)

    def rank(
        self,
        query: str,
        limit: int = 8,
        mode: Mode = "hybrid",
        *,
        backends: Collection[str] | None = None,
        read_only: bool | None = None,
        destructive: bool | None = None,
        allowed: Collection[str] | None = None,
        learned: Callable[[Vectors], Mapping[str, float]] | None = None,
    ) -> Ranking:
        """The ``limit`` best tools for ``query`` among those passing the filters, and whether any fits.
        ``allowed`` is the seam for per-caller policies: the names a caller may see; ``learned`` maps the request's
        vector to log-odds to add per tool name (what the caller's team chose after like requests)."""
        keep = self.mask(backends, read_only, destructive, allowed)
        if keep is not None and not keep.any():
            return Ranking([], False, None)
        if mode == "keyword" or self.embedder is None or self.matrix is None:
            hits = self.keyword(query, limit, keep)
            return Ranking(hits, bool(hits), None)
        if mode == "semantic":
            return Ranking(self.semantic(query, limit, keep), True, None)
        vector = self.embedder.embed([query])[0]
        cand, rows, best_cos = self.features(query, vector, keep)
        if not len(cand):
            return Ranking([], False, 1.0)
        logit = rows @ np.asarray(FEATURE_WEIGHTS) + FEATURE_BIAS
        if learned is not None:
            bonus = learned(vector)
            if bonus:
                logit += np.array([bonus.get(self.docs[i].name, 0.0) for i in cand])
        order = np.lexsort((cand, -logit))[:limit]
        prob = _sigmoid(logit)
        best = float(logit[order[0]])
        nothing = float(_sigmoid(np.array(np.dot(NOTHING_WEIGHTS, (best, best_cos)) + NOTHING_BIAS)))
        hits = [(int(cand[n]), round(float(prob[n]), 4)) for n in order]
        return Ranking(hits, nothing < NOTHING_FITS, round(nothing, 4))

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
        """``rank``'s hits alone: (position in ``docs``, score), best first."""
        return self.rank(
            query, limit, mode, backends=backends, read_only=read_only, destructive=destructive, allowed=allowed
        ).hits


def _top(scores: npt.NDArray[np.float64], count: int) -> list[tuple[int, float]]:
    """The ``count`` highest of ``scores``, best first (ties: the lower position)."""
    if count <= 0:
        return []
    top = np.argpartition(-scores, count - 1)[:count]
    ranked = sorted(top.tolist(), key=lambda i: (-float(scores[i]), i))
    return [(i, float(scores[i])) for i in ranked]
