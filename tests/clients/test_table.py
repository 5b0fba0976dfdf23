"""docs/clients.md is what a green run of the client matrix generates, and the model stand-in the agent CLIs talk to
scripts their tool calls and keeps what they send back (in-process: no client is started here)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.clients.matrix import CHECKS, CLIENTS_UNDER_TEST, EXPECTED, ROOT
from tests.clients.standin import ModelStandin
from tests.clients.table import expected, render

DOC = ROOT / "docs" / "clients.md"


def test_docs_clients_md_is_what_a_green_matrix_run_generates() -> None:
    """A flipped cell (a fix landed, its EXPECTED entry removed) or a new pin changes the page: regenerate it with
    scripts/clients-matrix (or `python -m tests.clients.table --expected docs/clients.md`)."""
    assert DOC.read_text() == render(*expected()), "docs/clients.md is stale: run scripts/clients-matrix"


def test_every_expected_failure_names_a_cell_of_the_matrix() -> None:
    cells = {
        (client.key, transport, check.key)
        for client in CLIENTS_UNDER_TEST
        for transport in client.transports
        for check in CHECKS
    }
    assert set(EXPECTED) <= cells


def test_the_page_marks_a_failed_cell_and_a_fixed_one() -> None:
    outcomes, versions = expected()
    key = next(iter(EXPECTED))
    fixed = render({**outcomes, key: {"outcome": "passed"}}, versions)
    failed = render({**outcomes, ("claude-code", "http", "call"): {"outcome": "failed"}}, versions)
    assert fixed != render(outcomes, versions)
    assert "| FAILED |" in failed


def _anthropic(standin: ModelStandin, messages: list[dict[str, Any]], tools: list[str]) -> list[dict[str, Any]]:
    """One streamed /v1/messages exchange; the SSE events' data."""
    body = {"model": "m", "stream": True, "messages": messages, "tools": [{"name": name} for name in tools]}
    answer = httpx2.post(f"{standin.url}/v1/messages", json=body, timeout=5)
    assert answer.status_code == 200
    return [json.loads(line[6:]) for line in answer.text.splitlines() if line.startswith("data: ")]


def test_the_standin_asks_for_each_scripted_call_and_keeps_what_the_cli_sends_back() -> None:
    with ModelStandin([("echo", {"text": "hi"}), ("add", {"a": 1})]) as standin:
        tools = ["Bash", "mcp__gw__echo", "mcp__gw__add"]
        events = _anthropic(standin, [{"role": "user", "content": "go"}], tools)
        start = next(event for event in events if event["type"] == "content_block_start")
        assert start["content_block"]["name"] == "mcp__gw__echo"
        use_id = start["content_block"]["id"]
        delta = next(event for event in events if event["type"] == "content_block_delta")
        assert json.loads(delta["delta"]["partial_json"]) == {"text": "hi"}
        reply = {"type": "tool_result", "tool_use_id": use_id, "content": [{"type": "text", "text": "hi"}]}
        history = [
            {"role": "user", "content": "go"},
            {"role": "assistant", "content": [start["content_block"]]},
            {"role": "user", "content": [reply]},
        ]
        events = _anthropic(standin, history, tools)
        assert next(e for e in events if e["type"] == "content_block_start")["content_block"]["name"] == "mcp__gw__add"
        assert [(r.tool, r.text, r.error) for r in standin.results] == [("mcp__gw__echo", "hi", False)]
        side = _anthropic(standin, [{"role": "user", "content": "a title please"}], [])
        assert next(e for e in side if e["type"] == "content_block_start")["content_block"]["type"] == "text"


def test_the_standin_answers_gemini_with_a_function_call_and_a_side_call_with_json() -> None:
    with ModelStandin([("echo", {"text": "hi"})]) as standin:
        body = {"contents": [], "tools": [{"functionDeclarations": [{"name": "mcp_gw_echo"}]}]}
        url = f"{standin.url}/v1beta/models/m:streamGenerateContent?alt=sse"
        answer = httpx2.post(url, json=body, timeout=5)
        chunk = json.loads(next(line[6:] for line in answer.text.splitlines() if line.startswith("data: ")))
        assert chunk["candidates"][0]["content"]["parts"][0]["functionCall"] == {
            "name": "mcp_gw_echo",
            "args": {"text": "hi"},
        }
        schema = {"type": "object", "properties": {"next_speaker": {"type": "string", "enum": ["user", "model"]}}}
        side = httpx2.post(
            f"{standin.url}/v1beta/models/m:generateContent",
            json={"contents": [], "generationConfig": {"responseJsonSchema": schema}},
            timeout=5,
        ).json()
        assert json.loads(side["candidates"][0]["content"]["parts"][0]["text"]) == {"next_speaker": "user"}


@pytest.mark.parametrize("path", sorted((ROOT / "tools" / "clients").iterdir()))
def test_every_client_tree_is_pinned_with_a_lock(path: Path) -> None:
    """A tree is an npm package with its lock, or a pip freeze: nothing floats."""
    if (path / "package.json").exists():
        assert (path / "package-lock.json").exists()
        assert all(
            not v.startswith(("^", "~", ">"))
            for v in json.loads((path / "package.json").read_text())["dependencies"].values()
        )
    else:
        lines = [line for line in (path / "requirements.txt").read_text().splitlines() if not line.startswith("#")]
        assert lines and all("==" in line for line in lines)
