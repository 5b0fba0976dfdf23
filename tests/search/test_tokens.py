"""The token counter counts exactly what Llama 2's tokenizer counts, run plainly over the whole text: cutting the text
before each word (what lets the tokenizer's word cache serve repeated words) changes no count, on prose, code with
indentation, JSON, runs of spaces, tabs and newlines, CJK and emoji, and text the vocabulary only has bytes for."""

from __future__ import annotations

from pathlib import Path

import pytest

from gateway.search.packages import tokenizer_file
from gateway.search.tokens import EXACT_CHARS, counter

ROOT = Path(__file__).resolve().parents[2]

TEXTS = [
    "",
    " ",
    "x",
    "   leading spaces and trailing   ",
    "def f(x):\n    if x:\n        return  x  *  2\n\treturn None\n",
    '{"query": "weather in Paris", "limit": 10, "hits": [{"name": "a b", "score": 0.5}]}',
    "東京の天気は晴れ。 今日は 🌞🌞 and ünïcödé, ﬁne — “quotes” …",
    "\u0000\u0007 control \u200b zero-width \ufeff",
    "a" * 300 + " " + "b" * 5 + "    " * 10 + "c",
]


@pytest.fixture(scope="module")
def plain() -> object:
    tokenizers = pytest.importorskip("tokenizers")
    path = tokenizer_file()
    if path is None:
        pytest.skip("the wordllama package (which ships the tokenizer) is not installed")
    tokenizer = tokenizers.Tokenizer.from_file(str(path))
    tokenizer.no_padding()
    tokenizer.no_truncation()
    return tokenizer


def _whole(tokenizer: object, text: str) -> int:
    return len(tokenizer.encode(text, add_special_tokens=False).ids)  # type: ignore[attr-defined]


@pytest.mark.parametrize("text", TEXTS)
def test_a_count_is_the_plain_tokenizers_count(plain: object, text: str) -> None:
    found = counter()
    assert found.name == "llama-2 (wordllama)"
    assert found.count(text) == _whole(plain, text)


def test_every_span_of_real_files_counts_as_the_plain_tokenizer_does(plain: object) -> None:
    found = counter()
    files = [ROOT / "README.md", ROOT / "docs" / "configuration.md", ROOT / "gateway" / "core" / "router.py"]
    checked = 0
    for path in files:
        text = path.read_text(encoding="utf-8")
        for start in range(0, len(text) - EXACT_CHARS, EXACT_CHARS * 3):
            span = text[start : start + EXACT_CHARS]
            assert found.count(span) == _whole(plain, span), f"{path.name} at {start}"
            checked += 1
    assert checked >= 10
