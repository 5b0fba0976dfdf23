"""The retrieval system of the reference, hosted by the real gateway over real qmd and graphify command lines.

A wiki of markdown pages is generated per module; qmd indexes it (its state kept in the test's folder) and graphify
builds its graph. The federation is the shipped federation.yaml's qmd, graphify, wiki and files_search entries,
pointed at that wiki: files_search is routed qmd-mcp (keyword) -> qmd CLI (deep -> vector) -> the wiki's hybrid
(deep) and vector (vector, deep) rungs, on the real wordllama model -> the built-in BM25 floor; graph_query and
graph_path are graphify adapters whose misses are thin. Skipped when scripts/install has not put qmd and graphify
on PATH.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
from pathlib import Path
from typing import Any

import anyio
import pytest
import yaml

from tests.fixtures import ROOT
from tests.fixtures.gateway_proc import GatewayProcesses, mcp_session, run_gateway
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
    "transport.md": "---\ntitle: Transport decisions\n---\n# Transport handshake\nThe HTTP handshake answered an HTML "
    "error page, so the search server was disabled. See [[Fallback ladder]] and [the ladder](ladder.md).\n",
    "ladder.md": "# Fallback ladder\nDeep degrades to vector, vector to keyword; keyword is the floor.\n"
    "Related: [memory](notes/memory.md).\n## Keyword floor\nBM25 answers last.\n",
    "notes/memory.md": "# Audit ledger memory\nWe decided on SQLite for the audit ledger in November.\n",
    "island.md": "# Island\nA page nothing links to and that links nowhere.\n",
}
SHIPPED = yaml.safe_load((ROOT / "federation.yaml").read_text())
SHIPPED_GRAPH = ".cache/graphify/docs/graph.json"


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
    """The shipped federation.yaml's qmd, graphify and files_search entries, pointed at the test's wiki and state."""
    state = {"XDG_CACHE_HOME": str(root / "cache"), "XDG_CONFIG_HOME": str(root / "config")}
    qmd_mcp: dict[str, Any] = {**SHIPPED["servers"]["qmd-mcp"], "command": QMD, "env": state, "cwd": str(root)}
    if not qmd_mcp_enabled:
        qmd_mcp.update(enabled=False, disabled_reason="switched off by the test")
    qmd = {**SHIPPED["adapters"]["qmd"], "command": QMD, "env": state, "cwd": str(root)}
    files_search = json.loads(json.dumps(qmd["tools"]["files_search"]))
    files_search["variants"]["deep"]["timeout_s"] = DEEP_TIMEOUT_S
    # Without its readiness probe, deep runs (and hangs without its models) until its timeout cuts it: the cut and the
    # degradation after it are what the deep test checks. vector keeps its probe, so it is skipped as not ready.
    files_search["variants"]["deep"].pop("probe", None)
    qmd["tools"] = {"files_search": files_search}
    graph_tools = json.loads(
        json.dumps(SHIPPED["adapters"]["graphify"]["tools"]).replace(SHIPPED_GRAPH, f"{root}/graph/graph.json")
    )
    graphify = {**SHIPPED["adapters"]["graphify"], "command": GRAPHIFY, "cwd": str(root), "tools": graph_tools}
    config = {
        "gateway": {"audit": {"path": f"{root}/audit.db"}},
        "servers": {"qmd-mcp": qmd_mcp},
        "adapters": {"qmd": qmd, "graphify": graphify},
        "wiki": {**SHIPPED["wiki"], "root": f"{root}/docs"},
        "routes": {"files_search": SHIPPED["routes"]["files_search"]},
    }
    return yaml.safe_dump(config, sort_keys=False)


@pytest.fixture(scope="module")
def gateway(wiki: Path, gateway_process: GatewayProcesses) -> RunningServer:
    return gateway_process(_federation(wiki), tokens=TOKEN)


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


async def _semantic_ready(session: Any, *, qmd: bool = True) -> None:
    """Bounded: until the qmd adapter is ready (its variant probes, `qmd doctor`, have answered) and the wiki's
    semantic rung answers (the model loads and the sections are embedded after the wiki is READY, off the startup
    path; until then the route serves the BM25 floor)."""
    with anyio.fail_after(60):
        while qmd:
            probe = await session.call_tool("files_search", {"query": "ledger", "mode": "vector", "limit": 1})
            if _meta(probe)["steps"][0]["outcome"] == "not_ready":  # qmd's vector variant, found out by its probe
                break
        while True:
            probe = await session.call_tool("files_search", {"query": "ledger", "mode": "vector", "limit": 1})
            if _meta(probe)["served_by"] == "wiki/wiki_vector_search":
                return


def _files(result: Any) -> list[str]:
    return [r["file"] for r in json.loads(result.content[0].text)]


async def test_vector_mode_without_embeddings_degrades_to_the_wikis_semantic_rung(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        await _semantic_ready(session)
        result = await session.call_tool("files_search", {"query": "which database keeps the record of decisions"})
    meta = _meta(result)
    assert not result.is_error
    assert meta["status"] == "degraded"
    assert meta["served_by"] == "wiki/wiki_vector_search"
    assert meta["requested"] == {"provider": "qmd/files_search", "variant": "vector"}
    # qmd's vector search cannot run offline: its probe (qmd doctor) found that out, so it is skipped at once.
    assert meta["steps"][0]["outcome"] == "not_ready" and "qmd doctor" in meta["steps"][0]["reason"]
    assert [s["provider"] for s in meta["steps"]] == ["qmd/files_search", "wiki/wiki_vector_search"]
    assert _files(result)[0] == "notes/memory.md"
    assert json.loads(result.content[0].text)[0]["line"] == 2


async def test_deep_mode_is_cut_at_its_timeout_and_degrades_with_every_step_recorded(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        await _semantic_ready(session)
        with anyio.fail_after(DEEP_TIMEOUT_S + 20):
            result = await session.call_tool("files_search", {"query": "ladder floor", "mode": "deep"})
    meta = _meta(result)
    assert not result.is_error
    outcomes = [(s["provider"], s["variant"], s["outcome"]) for s in meta["steps"]]
    assert outcomes[0][1] == "deep" and outcomes[0][2] in ("timeout", "error")
    assert outcomes[1] == ("qmd/files_search", "vector", "not_ready")
    assert outcomes[-1] == ("wiki/wiki_hybrid_search", None, "ok")
    assert meta["steps"][0]["ms"] >= 0 and (outcomes[0][2] != "timeout" or "timed out" in meta["steps"][0]["reason"])
    assert json.loads(result.content[0].text)[0]["file"] == "ladder.md"


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


async def test_graph_path_names_the_path_between_two_named_pages(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        result = await session.call_tool("graph_path", {"source": "transport.md", "target": "memory.md"})
    assert not result.is_error, result.content
    assert result.content[0].text.strip() == (
        "Shortest path (2 hops):\n"
        "  transport.md --references [EXTRACTED]--> ladder.md --references [EXTRACTED]--> memory.md"
    )
    assert _meta(result)["status"] == "ok"


async def test_graph_query_finds_the_nodes_that_mention_a_term(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        result = await session.call_tool("graph_query", {"question": "keyword floor"})
    assert not result.is_error, result.content
    text = result.content[0].text
    assert "Start: ['Keyword floor']" in text
    nodes = [line.split(" [src=")[0] for line in text.splitlines() if line.startswith("NODE ")]
    assert nodes == ["NODE Keyword floor", "NODE Fallback ladder", "NODE ladder.md"]
    assert _meta(result)["status"] == "ok"


async def test_no_graph_match_is_an_honest_error_never_an_empty_ok(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        missing = await session.call_tool("graph_query", {"question": "zzzz-nothing-matches"})
        unknown = await session.call_tool("graph_path", {"source": "qqqq-xyzzy", "target": "memory.md"})
        apart = await session.call_tool("graph_path", {"source": "transport.md", "target": "island.md"})
    assert missing.is_error and _meta(missing)["status"] == "error"
    assert "graphify/graph_query: thin (nothing found (exit 4): No matching nodes found.)" in missing.content[0].text
    assert unknown.is_error and _meta(unknown)["status"] == "error"
    assert "thin (nothing found (exit 4): No node matching 'qqqq-xyzzy' found." in unknown.content[0].text
    assert apart.is_error and _meta(apart)["status"] == "error"
    assert "thin (thin result: No path found between 'transport.md' and 'island.md'.)" in apart.content[0].text


async def test_a_graph_value_that_looks_like_an_option_is_refused_naming_it(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        result = await session.call_tool("graph_query", {"question": "--help"})
    assert result.is_error
    assert "question" in result.content[0].text and "starts with '-'" in result.content[0].text
    assert _meta(result)["status"] == "refused"


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


async def test_the_built_in_rungs_answer_when_qmd_is_missing(wiki: Path, tmp_path: Path) -> None:
    config = _federation(wiki).replace(f"command: {QMD}", "command: qmd-is-not-installed")
    with run_gateway(config, tmp_path, tokens=TOKEN) as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as session:
            keyword = await session.call_tool("files_search", {"query": "handshake", "mode": "keyword"})
            await _semantic_ready(session, qmd=False)
            vector = await session.call_tool("files_search", {"query": "an island page without links"})
    meta = _meta(keyword)
    assert not keyword.is_error
    assert meta["served_by"] == "wiki/wiki_search"
    assert [s["outcome"] for s in meta["steps"]][-1] == "ok"
    assert "transport.md" in keyword.content[0].text
    assert _meta(vector)["served_by"] == "wiki/wiki_vector_search"
    assert _files(vector)[0] == "island.md"


def _qmd_mcp_pid(gateway: RunningServer) -> int:
    """The pid of the `qmd mcp` server the gateway spawned (a direct child of the gateway proper, which is the one
    child of the supervisor `gateway serve` starts as; it leads its own process group)."""
    supervisor = subprocess.run(["pgrep", "-P", str(gateway.process.pid)], capture_output=True, text=True)
    [proper] = supervisor.stdout.split()
    done = subprocess.run(["pgrep", "-P", proper, "-f", "qmd mcp"], capture_output=True, text=True)
    pids = [int(pid) for pid in done.stdout.split()]
    assert pids, f"no `qmd mcp` child of {proper}"
    return pids[0]
