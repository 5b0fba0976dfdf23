"""The tool search index (gateway/toolsearch.py) and the shared ranking parts under it (gateway/ranking.py), with
the real sentence model from its installed wheels."""

from __future__ import annotations

from collections import Counter
from typing import Any

import numpy as np
import pytest

from gateway.search.ranking import Bm25, fuse, load_embedder, nearest
from gateway.search.tools import ToolDoc, ToolIndex, words


def _doc(name: str, description: str, backend: str = "b", params: dict[str, str] | None = None,
         **annotations: Any) -> ToolDoc:  # fmt: skip
    schema = {
        "type": "object",
        "properties": {k: {"type": "string", "description": v} for k, v in (params or {}).items()},
    }
    return ToolDoc(name, description, (backend,), schema, annotations)


CATALOG = [
    _doc("create_issue", "Open a new issue in a GitHub repository.", "github"),
    _doc("list_commits", "List the commits of a branch.", "github", readOnlyHint=True),
    _doc(
        "git_log",
        "Shows the commit logs of the local repository.",
        "git",
        {"max_count": "How many commits"},
        readOnlyHint=True,
    ),  # fmt: skip
    _doc("delete_index", "Delete an Elasticsearch index and all its documents.", "search", destructiveHint=True),
    _doc(
        "maps_directions",
        "Get directions between two points.",
        "maps",
        {"origin": "Start address", "destination": "End address"},
        readOnlyHint=True,
    ),  # fmt: skip
    _doc("takeScreenshot", "Capture an image of the current page.", "browser", readOnlyHint=True),
    _doc(
        "send_message",
        "Post a text to a Slack channel.",
        "slack",
        {"channel_id": "The channel to post to"},
        destructiveHint=False,
    ),  # fmt: skip
]


@pytest.fixture(scope="module")
def index() -> ToolIndex:
    return ToolIndex.build(CATALOG, load_embedder())


def names(index: ToolIndex, hits: list[tuple[int, float]]) -> list[str]:
    return [index.docs[i].name for i, _ in hits]


def test_words_split_identifiers_at_underscores_and_camel_case_and_stem_plurals() -> None:
    assert words("getIssueComments") == ["get", "issue", "comment"]
    assert words("create_merge_request") == ["create", "merge", "request"]
    assert words("API-post-search") == ["api", "post", "search"]
    assert words("How do I list the branches?") == ["list", "branch"]  # stop words left out


def test_keyword_search_matches_the_words_of_a_camel_case_name(index: ToolIndex) -> None:
    assert names(index, index.search("take screenshot", 1, "keyword")) == ["takeScreenshot"]


def test_keyword_search_reads_parameter_descriptions(index: ToolIndex) -> None:
    assert names(index, index.search("start address", 1, "keyword")) == ["maps_directions"]


def test_semantic_search_finds_a_tool_by_meaning_without_its_words(index: ToolIndex) -> None:
    assert names(index, index.search("how do I drive from Paris to Lyon", 1, "semantic")) == ["maps_directions"]


def test_hybrid_search_fuses_both_rankings(index: ToolIndex) -> None:
    hits = names(index, index.search("show the history of commits in my local repo", 3, "hybrid"))
    assert set(hits[:2]) == {"git_log", "list_commits"}


def test_filters_apply_before_ranking_so_a_filtered_search_still_fills_its_limit(index: ToolIndex) -> None:
    assert names(index, index.search("commits", 5, "keyword", backends=("github",))) == ["list_commits"]
    assert names(index, index.search("commits", 5, backends=("github",))) == ["list_commits", "create_issue"]
    read_only = names(index, index.search("delete the index", 10, read_only=True))
    assert set(read_only) == {"list_commits", "git_log", "takeScreenshot", "maps_directions"}
    safe = set(names(index, index.search("post a message", 10, destructive=False)))
    assert safe == {"list_commits", "git_log", "maps_directions", "takeScreenshot", "send_message"}
    assert names(index, index.search("anything at all", 10, allowed={"send_message"})) == ["send_message"]
    assert index.search("commits", 5, backends=("nobody",)) == []


def test_a_tool_without_annotations_counts_as_destructive_as_the_spec_defines() -> None:
    assert _doc("x", "").destructive is True
    assert _doc("x", "", readOnlyHint=True).destructive is False
    assert _doc("x", "", destructiveHint=False).destructive is False


def test_without_a_model_every_mode_ranks_by_keywords_and_says_why() -> None:
    index = ToolIndex.build(CATALOG, None, "the wordllama package is not installed")
    assert index.semantic_reason == "the wordllama package is not installed"
    assert names(index, index.search("take screenshot", 1, "hybrid")) == ["takeScreenshot"]
    assert names(index, index.search("take screenshot", 1, "semantic")) == ["takeScreenshot"]


def test_reciprocal_rank_fusion_rewards_agreement_and_honours_weights() -> None:
    assert fuse([[(1, 9.0), (2, 5.0)], [(2, 0.9), (3, 0.5)]], 3)[0][0] == 2
    assert fuse([[(1, 9.0)], [(3, 0.9)]], 2, k=10, weights=(2.0, 1.0))[0][0] == 1


def test_nearest_ranks_by_cosine_and_skips_rows_not_allowed() -> None:
    matrix = np.eye(3, dtype=np.float32)
    query = np.array([0.6, 0.8, 0.0], dtype=np.float32)
    assert [i for i, _ in nearest(matrix, query, 3)][:2] == [1, 0]
    assert [i for i, _ in nearest(matrix, query, 3, np.array([True, False, True]))] == [0, 2]
    assert nearest(matrix, query, 3, np.zeros(3, dtype=bool)) == []


def test_bm25_dense_scores_are_the_same_sums_as_its_sparse_scores() -> None:
    bm25 = Bm25([Counter({"list": 2, "issue": 1}), Counter({"list": 1, "commit": 3}), Counter({"other": 1})])
    sparse = bm25.scores(["list", "commit", "missing"])
    dense = bm25.dense(["list", "commit", "missing"])
    assert dense.tolist() == pytest.approx([sparse.get(doc, 0.0) for doc in range(3)])
    assert dense[2] == 0.0


def test_bm25_scores_rare_terms_above_common_ones() -> None:
    bm25 = Bm25([Counter({"list": 1, "issue": 1}), Counter({"list": 1, "commit": 1}), Counter({"list": 1})])
    assert bm25.search(["list", "commit"], 1) == [(1, pytest.approx(bm25.scores(["list", "commit"])[1]))]
    assert [doc for doc, _ in bm25.search(["commit"], 5)] == [1]
