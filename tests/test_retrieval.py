"""The retrieval system of the reference, hosted by the real gateway over real qmd and graphify command lines.

A wiki of markdown pages is generated per module; qmd indexes it (its state kept in the test's folder) and graphify
builds its graph. files_search is routed qmd-mcp (keyword) -> qmd CLI (deep -> vector -> keyword) -> the built-in
BM25 floor; graph_query and graph_path are graphify adapters. Skipped when scripts/install has not put qmd and
graphify on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.fixtures.gateway_proc import mcp_session, run_gateway
from tests.fixtures.procs import RunningServer
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.node]

QMD = shutil.which("qmd")
GRAPHIFY = shutil.which("graphify")
if QMD is None or GRAPHIFY is None:
    pytest.skip("run scripts/install: qmd / graphify are not on PATH", allow_module_level=True)

TOKEN = "retrieval-token"
DEEP_TIMEOUT_S = 3  # offline, `qmd query` hangs for minutes: the ladder must cut it here and degrade

PAGES = {
    "transport.md": "---\ntitle: Transport decisions\n---\n# Transport\nThe HTTP handshake answered an HTML error "
    "page, so the search server was disabled. See [[Fallback ladder]].\n",
    "ladder.md": "# Fallback ladder\nDeep degrades to vector, vector to keyword; keyword is the floor.\n"
    "Related: [transport](transport.md).\n",
    "notes/memory.md": "# Memory\nWe decided on SQLite for the audit ledger in November.\n",
}


def _qmd_env(state: Path) -> dict[str, str]:
    return {**os.environ, "XDG_CACHE_HOME": str(state / "cache"), "XDG_CONFIG_HOME": str(state / "config")}


@pytest.fixture(scope="module")
def wiki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("retrieval")
    docs = root / "docs"
    for name, text in PAGES.items():
        (docs / name).parent.mkdir(parents=True, exist_ok=True)
        (docs / name).write_text(text)
    env = _qmd_env(root)
    subprocess.run([str(QMD), "collection", "add", str(docs), "--name", "docs"], env=env, check=True,
                   capture_output=True, timeout=120)  # fmt: skip
    subprocess.run([str(QMD), "update"], env=env, check=True, capture_output=True, timeout=120)
    graph_dir = root / "graph"
    graph_dir.mkdir()
    subprocess.run([str(GRAPHIFY), "update", str(docs)], env={**os.environ, "GRAPHIFY_OUT": str(graph_dir)},
                   check=True, capture_output=True, timeout=120)  # fmt: skip
    assert (graph_dir / "graph.json").is_file()
    assert not (docs / "graphify-out").exists()
    return root


def _federation(root: Path, *, qmd_mcp_enabled: bool = True) -> str:
    state = {"XDG_CACHE_HOME": str(root / "cache"), "XDG_CONFIG_HOME": str(root / "config")}
    enabled = "" if qmd_mcp_enabled else "\n    enabled: false\n    disabled_reason: switched off by the test"
    return f"""
gateway:
  audit: {{path: {root}/audit.db}}
servers:
  qmd-mcp:
    transport: stdio
    command: {QMD}
    args: [mcp]
    env: {json.dumps(state)}
    timeout_s: 15
    tools: {{include: []}}{enabled}
adapters:
  qmd:
    command: {QMD}
    env: {json.dumps(state)}
    tools:
      files_search:
        router: true
        description: Find the best snippets.
        input_schema:
          type: object
          required: [query]
          additionalProperties: false
          properties:
            query: {{type: string, minLength: 1}}
            limit: {{type: integer, minimum: 1, maximum: 50, default: 10}}
            mode: {{enum: [keyword, vector, deep], default: vector}}
        switch: mode
        variants:
          keyword: {{argv: [search, -n, "{{limit}}", --json, --, "{{query}}"], timeout_s: 15}}
          vector:
            argv: [vsearch, -n, "{{limit}}", --json, --, "{{query}}"]
            timeout_s: 30
            thin_when: {{empty: true, stderr_contains: "need embeddings"}}
          deep: {{argv: [query, -n, "{{limit}}", --json, --, "{{query}}"], timeout_s: {DEEP_TIMEOUT_S}}}
        ladder: {{deep: vector, vector: keyword}}
        output: json_array
  graphify:
    command: {GRAPHIFY}
    tools:
      graph_query:
        input_schema:
          type: object
          required: [question]
          properties:
            question: {{type: string, minLength: 1}}
            budget: {{type: integer, default: 2000}}
        argv: [query, --, "{{question}}", --graph, {root}/graph/graph.json, --budget, "{{budget}}"]
        exit_codes: {{ok: [0], no_result: [4]}}
      graph_path:
        input_schema:
          type: object
          required: [source, target]
          properties:
            source: {{type: string}}
            target: {{type: string}}
        argv: [path, --, "{{source}}", "{{target}}", --graph, {root}/graph/graph.json]
        exit_codes: {{ok: [0], no_result: [3, 4]}}
wiki:
  root: {root}/docs
routes:
  files_search:
    providers:
      - provider: qmd-mcp/query
        when: {{mode: [keyword]}}
        arguments: {{searches: [{{type: lex, query: "{{query}}"}}], limit: "{{limit}}", rerank: false}}
      - qmd/files_search
      - provider: wiki/wiki_search
        arguments: {{query: "{{query}}", limit: "{{limit}}"}}
"""


@pytest.fixture(scope="module")
def gateway(wiki: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    with run_gateway(_federation(wiki), tmp_path_factory.mktemp("gw"), tokens=TOKEN) as server:
        yield server


def _meta(result: Any) -> dict[str, Any]:
    meta: dict[str, Any] = result.meta["mcp-gateway/call"]
    return meta


async def test_keyword_mode_is_served_by_qmds_mcp_server(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        result = await session.call_tool("files_search", {"query": "handshake", "mode": "keyword"})
    assert not result.is_error
    assert _meta(result)["served_by"] == "qmd-mcp/query", _meta(result)["steps"]
    assert _meta(result)["status"] == "ok"
    assert "transport.md" in json.dumps(result.structured_content)


async def test_vector_mode_without_embeddings_degrades_to_keyword_visibly(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        result = await session.call_tool("files_search", {"query": "handshake"})
    meta = _meta(result)
    assert not result.is_error
    assert meta["status"] == "degraded"
    assert (meta["served_by"], meta["variant"]) == ("qmd/files_search", "keyword")
    assert meta["requested"] == {"provider": "qmd/files_search", "variant": "vector"}
    assert meta["steps"][0]["outcome"] == "thin" and "need embeddings" in meta["steps"][0]["reason"]
    assert "transport.md" in result.content[0].text


async def test_deep_mode_is_cut_at_its_timeout_and_degrades_with_every_step_recorded(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        with anyio.fail_after(DEEP_TIMEOUT_S + 20):
            result = await session.call_tool("files_search", {"query": "ladder floor", "mode": "deep"})
    meta = _meta(result)
    assert not result.is_error
    outcomes = [(s["variant"], s["outcome"]) for s in meta["steps"]]
    assert outcomes[0][0] == "deep" and outcomes[0][1] in ("timeout", "error")
    assert outcomes[-1] == ("keyword", "ok")
    assert meta["steps"][0]["ms"] >= 0 and (outcomes[0][1] != "timeout" or "timed out" in meta["steps"][0]["reason"])
    assert "ladder.md" in result.content[0].text


async def test_no_qmd_process_outlives_its_call(gateway: RunningServer) -> None:
    def qmd_query_processes() -> list[str]:
        out = subprocess.run(["ps", "-eo", "args"], capture_output=True, text=True).stdout
        return [line for line in out.splitlines() if "qmd" in line and " query " in line and "ladder" in line]

    async with mcp_session(gateway.url(), token=TOKEN) as session:
        await session.call_tool("files_search", {"query": "ladder floor", "mode": "deep"})
    await eventually(lambda: not qmd_query_processes(), within=5)


async def test_a_query_that_looks_like_an_option_stays_a_value(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        result = await session.call_tool("files_search", {"query": "--help", "mode": "keyword", "limit": 3})
    assert not result.is_error
    assert "Usage" not in result.content[0].text


async def test_a_bad_argument_is_refused_naming_it_before_any_spawn(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        result = await session.call_tool("files_search", {"query": "x", "limit": 500, "mode": "vector"})
    assert result.is_error
    assert "limit" in result.content[0].text
    assert _meta(result)["status"] == "refused"


async def test_graph_query_and_graph_path_answer_through_the_gateway(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        query = await session.call_tool("graph_query", {"question": "ladder"})
        path = await session.call_tool("graph_path", {"source": "no-such-node-a", "target": "no-such-node-b"})
        missing = await session.call_tool("graph_query", {"question": "zzzz-nothing-matches"})
    assert not query.is_error and query.content[0].text.strip()
    assert not path.is_error  # unknown node: graphify exits 4, declared "no result", an answer
    assert not missing.is_error and "No matching nodes" in missing.content[0].text
    assert missing.meta is not None


async def test_files_search_falls_back_to_the_cli_when_qmds_mcp_server_dies(wiki: Path, tmp_path: Path) -> None:
    with run_gateway(_federation(wiki), tmp_path, tokens=TOKEN) as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as session:
            first = await session.call_tool("files_search", {"query": "handshake", "mode": "keyword"})
            assert _meta(first)["served_by"] == "qmd-mcp/query"
            pid = _qmd_mcp_pid(gateway)
            os.killpg(os.getpgid(pid), signal.SIGKILL)
            with anyio.fail_after(30):
                while True:
                    result = await session.call_tool("files_search", {"query": "handshake", "mode": "keyword"})
                    if _meta(result)["served_by"] == "qmd/files_search":
                        break
            assert not result.is_error and "transport.md" in result.content[0].text
            assert _meta(result)["status"] == "degraded"
            assert _meta(result)["steps"][0]["provider"] == "qmd-mcp/query"


async def test_files_search_skips_a_declared_disabled_server_and_says_why(wiki: Path, tmp_path: Path) -> None:
    with run_gateway(_federation(wiki, qmd_mcp_enabled=False), tmp_path, tokens=TOKEN) as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as session:
            result = await session.call_tool("files_search", {"query": "handshake", "mode": "keyword"})
    meta = _meta(result)
    assert meta["served_by"] == "qmd/files_search"
    assert meta["steps"][0] == {
        "provider": "qmd-mcp/query", "variant": None, "outcome": "disabled",
        "reason": "switched off by the test", "ms": 0.0,
    }  # fmt: skip


async def test_the_built_in_floor_answers_when_qmd_is_missing(wiki: Path, tmp_path: Path) -> None:
    config = _federation(wiki).replace(f"command: {QMD}", "command: qmd-is-not-installed")
    with run_gateway(config, tmp_path, tokens=TOKEN) as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as session:
            result = await session.call_tool("files_search", {"query": "handshake"})
    meta = _meta(result)
    assert not result.is_error
    assert meta["served_by"] == "wiki/wiki_search"
    assert [s["outcome"] for s in meta["steps"]][-1] == "ok"
    assert "transport.md" in result.content[0].text


def _qmd_mcp_pid(gateway: RunningServer) -> int:
    """The pid of the `qmd mcp` server the gateway spawned (a direct child of the gateway proper, which is the one
    child of the supervisor `gateway serve` starts as; it leads its own process group)."""
    supervisor = subprocess.run(["pgrep", "-P", str(gateway.process.pid)], capture_output=True, text=True)
    [proper] = supervisor.stdout.split()
    done = subprocess.run(["pgrep", "-P", proper, "-f", "qmd mcp"], capture_output=True, text=True)
    pids = [int(pid) for pid in done.stdout.split()]
    assert pids, f"no `qmd mcp` child of {proper}"
    return pids[0]
