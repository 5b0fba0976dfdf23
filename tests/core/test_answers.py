"""Token budgets for answers (core/answers.py, core/kept.py): who gets which budget, the cut at clean boundaries, the
rest read back in pages by the caller who made the call and by nobody else, the daily allowance, and the tokens in
the ledger; through the real gateway in both protocol eras, over a real wiki folder."""

from __future__ import annotations

import json
import random
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from gateway.calls import ANONYMOUS, CallContext, Caller, Declared, Upstream
from gateway.config import parse_config
from gateway.core.answers import Answers
from gateway.ledger.engines import open_reader
from gateway.ledger.readers import Filters
from gateway.search.tokens import count_tokens
from gateway.testing import in_process_gateway, text_result

pytestmark = pytest.mark.anyio

WORDS = "gateway budget token answer search wiki router ledger caller client window context catalog page".split()


def _config(extra: str = "", budget: str = "{answer_share: 0.1}") -> Any:
    text = f"""
version: 1
gateway: {{audit: {{enabled: false}}}}
clients:
  known: {{small-agent: 8000, claude-code: 200000}}
  budget: {budget}
{extra}
"""
    return parse_config(text, file="federation.yaml", env={})


def _ctx(tokens: int | None, caller: Caller = ANONYMOUS, session: str | None = None) -> CallContext:
    return CallContext(upstream=Upstream(caller=caller), declared=Declared(tokens, "header"), session_id=session)


@pytest.fixture
def wiki(tmp_path: Path) -> Path:
    rng = random.Random(7)
    paragraphs = [" ".join(rng.choice(WORDS) for _ in range(60)) + "." for _ in range(200)]
    (tmp_path / "big.md").write_text("# Big page\n\n" + "\n\n".join(paragraphs) + "\n", encoding="utf-8")
    for n in range(30):  # many small pages that all match a search for "budget"
        body = " ".join(rng.choice(WORDS) for _ in range(40))
        (tmp_path / f"note-{n:02d}.md").write_text(f"# Note {n}\n\nbudget {body}\n", encoding="utf-8")
    return tmp_path


def _wiki_config(root: Path, *, audit: Path | None = None, policies: str = "") -> str:
    ledger = f"{{path: {audit}}}" if audit is not None else "{enabled: false}"
    return f"""
version: 1
gateway: {{audit: {ledger}}}
wiki: {{root: {root}}}
clients:
  known: {{small-agent: 8000, claude-code: 200000}}
  budget: {{answer_share: 0.1}}
{policies}
"""


def _client(name: str) -> types.Implementation:
    return types.Implementation(name=name, version="1")


def _text(result: types.CallToolResult) -> list[str]:
    return [b.text for b in result.content if isinstance(b, types.TextContent)]


# -- who gets which budget ----------------------------------------------------------------------------------------


def test_the_budget_is_a_share_of_the_declared_window_and_a_large_or_silent_client_has_none() -> None:
    answers = Answers(lambda: _config())
    assert answers.budget(_ctx(8_000)) == 800
    assert answers.budget(_ctx(32_000)) == 3_200
    assert answers.budget(_ctx(200_000)) is None  # at or above clients.large_context_tokens: no change
    assert answers.budget(_ctx(None)) is None  # declares nothing, no unknown_window: not budgeted


def test_a_fixed_cap_an_assumed_window_and_a_policy_each_lower_the_budget() -> None:
    config = _config(
        "policies:\n  tight: {callers: [bob], budget: {answer_tokens: 500}}\n",
        budget="{answer_share: 0.1, answer_tokens: 2000, unknown_window: 10000, exempt_large: false}",
    )
    answers = Answers(lambda: config)
    assert answers.budget(_ctx(32_000)) == 2_000
    assert answers.budget(_ctx(None)) == 1_000
    assert answers.budget(_ctx(1_000_000)) == 2_000  # exempt_large off: large clients are budgeted too
    assert answers.budget(_ctx(32_000, Caller(name="bob"))) == 500


def test_without_budgets_nothing_is_cut_and_no_reader_tool_is_listed() -> None:
    config = parse_config("version: 1\n", file="federation.yaml", env={})
    answers = Answers(lambda: config)
    assert not answers.on and answers.budget(_ctx(1_000)) is None


# -- the cut ------------------------------------------------------------------------------------------------------


def test_a_search_answer_is_cut_at_whole_hits_its_structured_result_stays_valid_and_says_what_is_left() -> None:
    answers = Answers(lambda: _config())
    hits = [
        {"file": f"p{n}.md", "title": f"P{n}", "line": n, "score": 1 / (n + 1), "snippet": "budget " * 30}
        for n in range(40)
    ]
    text = "[\n" + ",\n".join(json.dumps(h) for h in hits) + "\n]"
    cut = answers.cut(text_result(text, structured_content={"results": hits}), 800, _ctx(8_000), "files_search")
    first, note = _text(cut.result)
    shown = json.loads(first)
    assert 0 < len(shown) < 40 and shown == hits[: len(shown)]  # whole hits, in order
    structured = cut.result.structured_content
    assert structured is not None and structured["results"] == shown
    assert structured["more"]["shown"] == len(shown) and structured["more"]["of"] == 40
    assert count_tokens(first) + count_tokens(note) <= 800
    assert f"hits 1-{len(shown)} of 40" in note and "read_result" in note and "gateway://results/" in note


def test_a_text_answer_is_cut_at_paragraphs_and_a_paragraph_larger_than_the_budget_at_lines() -> None:
    answers = Answers(lambda: _config())
    paragraphs = [f"Paragraph {n}: " + "word " * 80 for n in range(30)]
    cut = answers.cut(text_result("\n\n".join(paragraphs)), 800, _ctx(8_000), "files_read")
    body, note = _text(cut.result)
    assert body.split("\n\n") == paragraphs[: len(body.split("\n\n"))]
    assert cut.shown <= 800 < cut.total
    huge = "\n".join("line " + "x" * 40 for _ in range(400))  # one paragraph, no blank line
    cut = answers.cut(text_result(huge), 800, _ctx(8_000), "files_read")
    body, note = _text(cut.result)
    assert huge.startswith(body) and body.endswith("x") and cut.shown <= 800
    assert "parts 1-" in note


def test_an_answer_within_its_budget_and_an_error_pass_untouched() -> None:
    answers = Answers(lambda: _config())
    small = text_result("a short answer")
    assert answers.cut(small, 800, _ctx(8_000), "t").result is small
    error = text_result("word " * 5_000, is_error=True)
    assert answers.cut(error, 800, _ctx(8_000), "t").result is error


def test_the_rest_is_read_in_pages_by_its_caller_and_nobody_else() -> None:
    answers = Answers(lambda: _config())
    alice, bob = Caller(name="alice"), Caller(name="bob")
    text = "\n\n".join(f"Paragraph {n}: " + "word " * 60 for n in range(40))
    cut = answers.cut(text_result(text), 800, _ctx(8_000, alice), "files_read")
    assert cut.kept is not None
    ident = cut.kept.id
    pages, page = [], answers.read(_ctx(8_000, alice), ident, 2)
    while page is not None:
        pages.append(page)
        page = answers.read(_ctx(8_000, alice), ident, page.number + 1)
    shown = _text(cut.result)[0]
    assert "\n\n".join([shown, *(p.text for p in pages)]) == text  # every part once, in order
    assert all(count_tokens(p.text) <= 800 for p in pages)
    assert answers.read(_ctx(8_000, bob), ident, 2) is None  # another caller: as if it did not exist
    assert answers.resources(_ctx(8_000, bob)) == [] and len(answers.resources(_ctx(8_000, alice))) == 1
    anonymous = answers.cut(text_result(text), 800, _ctx(8_000, session="s1"), "files_read").kept
    assert anonymous is not None and answers.read(_ctx(8_000, alice), anonymous.id, 2) is None
    assert answers.read(_ctx(8_000, session="s2"), anonymous.id, 2) is not None  # one caller without tokens


def test_the_kept_rests_are_bounded_in_bytes_the_oldest_leaving_first() -> None:
    config = _config(budget="{answer_share: 0.1, keep_bytes: 20000}")
    answers = Answers(lambda: config)
    text = "\n\n".join("word " * 60 for _ in range(40))  # about 12 KB each
    first = answers.cut(text_result(text), 800, _ctx(8_000), "t").kept
    second = answers.cut(text_result(text), 800, _ctx(8_000), "t").kept
    assert first is not None and second is not None
    assert answers.read(_ctx(8_000), first.id, 2) is None and answers.read(_ctx(8_000), second.id, 2) is not None
    assert answers.kept.statistics()["bytes"] <= 20_000


def test_a_caller_over_its_daily_allowance_is_refused_with_when_it_resets() -> None:
    config = _config("policies:\n  metered: {callers: [alice], budget: {daily_tokens: 1000}}\n")
    answers = Answers(lambda: config)
    alice = _ctx(None, Caller(name="alice"))
    assert answers.refusal(alice, "files_read") is None
    answers.spend(alice, 1_200)
    refusal = answers.refusal(alice, "files_read")
    assert refusal is not None and refusal.is_error
    text = _text(refusal)[0]
    assert "1,200 tokens" in text and "1,000 tokens" in text and "00:00 UTC" in text
    assert answers.refusal(_ctx(None, Caller(name="carol")), "files_read") is None


# -- through the gateway, in both eras ----------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_small_client_gets_every_answer_within_budget_and_reads_the_rest(wiki: Path, mode: str) -> None:
    async with in_process_gateway(_wiki_config(wiki), mode=mode, client_info=_client("small-agent")) as (client, _):
        listed = await client.list_tools()
        assert "read_result" in [t.name for t in listed.tools]
        result = await client.call_tool("files_read", {"path": "big.md"})
        body, note = _text(result)
        assert count_tokens(body) + count_tokens(note) <= 800 and "parts 1-" in note
        ident = note.split('"id": "')[1].split('"')[0]
        page = await client.call_tool("read_result", {"id": ident, "page": 2})
        assert not page.is_error and "Page 2: parts" in _text(page)[-1]
        assert count_tokens(_text(page)[0]) <= 800
        read = await client.read_resource(f"gateway://results/{ident}?page=2")
        assert read.contents[0].text == _text(page)[0]  # type: ignore[union-attr]
        assert f"gateway://results/{ident}" in [r.uri for r in (await client.list_resources()).resources]
        with pytest.raises(MCPError, match="Resource not found"):
            await client.read_resource("gateway://results/not-a-result")
        hits = await client.call_tool("wiki_search", {"query": "budget", "limit": 30})
        shown = json.loads(_text(hits)[0])
        assert 0 < len(shown) < 30 and hits.structured_content is not None
        assert hits.structured_content["results"] == shown and hits.structured_content["more"]["of"] == 30


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_large_client_sees_no_change(wiki: Path, mode: str) -> None:
    unbudgeted = _wiki_config(wiki).replace("  budget: {answer_share: 0.1}\n", "")
    async with in_process_gateway(unbudgeted, mode=mode, client_info=_client("claude-code")) as (client, _):
        before = (await client.list_tools()).model_dump(exclude={"meta"})
        whole = await client.call_tool("files_read", {"path": "big.md"})
    async with in_process_gateway(_wiki_config(wiki), mode=mode, client_info=_client("claude-code")) as (client, _):
        assert (await client.list_tools()).model_dump(exclude={"meta"}) == before
        again = await client.call_tool("files_read", {"path": "big.md"})
        assert _text(again) == _text(whole) and len(again.content) == 1


async def test_tokens_in_and_out_are_in_the_ledger_as_delivered(wiki: Path, tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    async with in_process_gateway(_wiki_config(wiki, audit=db), client_info=_client("small-agent")) as (client, _):
        cut = await client.call_tool("files_read", {"path": "big.md"})
        whole = await client.call_tool("files_read", {"path": "note-01.md"})
    rows = open_reader(str(db)).query(Filters(tool="files_read"))
    assert [r.tokens_in for r in rows] == [count_tokens('{"path":"big.md"}'), count_tokens('{"path":"note-01.md"}')]
    assert rows[0].tokens_out is not None and 0 < rows[0].tokens_out <= 800 and len(cut.content) == 2
    assert rows[1].tokens_out == count_tokens(_text(whole)[0])


async def test_a_catalog_over_its_share_of_a_clients_window_is_searched_not_listed(wiki: Path) -> None:
    config = (
        _wiki_config(wiki)
        .replace(
            "  budget: {answer_share: 0.1}\n",
            "  budget: {answer_share: 0.1, catalog_share: 0.005}\n  known: {huge: 10000000, claude-code: 200000}\n",
        )
        .replace("  known: {small-agent: 8000, claude-code: 200000}\n", "")
    )
    config += "exposure: {mode: auto}\n"
    for name, searched in (("claude-code", True), ("huge", False)):  # ~1,500 tokens: over 0.5% of 200K, not of 10M
        async with in_process_gateway(config, client_info=_client(name)) as (client, gateway):
            listed = [t.name for t in (await client.list_tools()).tools]
            assert gateway.catalog.tokens[0] > 0.005 * 200_000
            assert ("find_tools" in listed) is searched and ("files_read" in listed) is not searched


def test_a_fenced_code_block_with_blank_lines_stays_in_one_part() -> None:
    answers = Answers(lambda: _config())
    code = "```python\ndef f():\n\n    return 1\n\n\nprint(f())\n```"
    text = "\n\n".join(["Intro " + "word " * 300, code, "After " + "word " * 300, "End " + "word " * 300])
    cut = answers.cut(text_result(text), 800, _ctx(8_000), "files_read")
    assert cut.kept is not None and code in cut.kept.units


async def test_over_the_daily_allowance_a_call_is_refused_and_recorded_as_refused(wiki: Path, tmp_path: Path) -> None:
    db = tmp_path / "audit.db"
    policies = "policies:\n  everyone: {callers: ['*'], budget: {daily_tokens: 100}}\n"
    config = _wiki_config(wiki, audit=db, policies=policies)
    async with in_process_gateway(config, client_info=_client("small-agent")) as (client, _):
        first = await client.call_tool("files_read", {"path": "note-01.md"})  # about 60 tokens: within the day
        second = await client.call_tool("files_read", {"path": "big.md"})  # 800 more: over it afterwards
        third = await client.call_tool("files_read", {"path": "note-02.md"})
    assert not first.is_error and not second.is_error
    assert third.is_error and "daily allowance is 100 tokens" in _text(third)[0] and "00:00 UTC" in _text(third)[0]
    rows = open_reader(str(db)).query(Filters(tool="files_read"))
    assert [r.status for r in rows] == ["ok", "ok", "refused"]
