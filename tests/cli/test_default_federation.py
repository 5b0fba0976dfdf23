"""The default federation.yaml, as a new user gets it: after scripts/prepare, every backend is ready, and the default
loop (files_search -> files_neighbors on its first hit -> files_read) answers with real content in every mode.

The file and the project's docs/ are copied into a temporary folder (the file's relative paths resolve there, so the
indexes and the ledger stay out of the checkout); scripts/prepare builds the qmd index and the graph for it. No
models are installed (offline), so qmd's vector and deep modes cannot run: they must degrade at once, saying why.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from gateway.core.results import SCALES
from tests.conftest import ROOT
from tests.fixtures.gateway_proc import mcp_session, run_gateway
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.node

if shutil.which("qmd") is None or shutil.which("graphify") is None or shutil.which("mcp-server-memory") is None:
    pytest.skip("run scripts/install: qmd / graphify / mcp-server-memory are not on PATH", allow_module_level=True)


@pytest.fixture(scope="module")
def prepared(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("default")
    shutil.copy(ROOT / "federation.yaml", folder / "federation.yaml")
    shutil.copytree(ROOT / "docs", folder / "docs")
    subprocess.run(
        ["bash", str(ROOT / "scripts" / "prepare"), str(folder)], check=True, capture_output=True, timeout=300
    )
    assert (folder / ".cache" / "graphify" / "docs" / "graph.json").is_file()
    assert not (folder / "docs" / "graphify-out").exists()
    return folder


def _gateway(folder: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "gateway", *args, "-c", str(folder / "federation.yaml"), "--json"],
        capture_output=True, text=True, timeout=120, cwd=folder,
    )  # fmt: skip


def test_the_default_federation_passes_check_with_every_backend_ready(prepared: Path) -> None:
    done = _gateway(prepared, "check")
    assert done.returncode == 0, done.stderr
    states = {b["name"]: (b["state"], b["reason"]) for b in json.loads(done.stdout)["backends"]}
    disabled = {name for name, (state, _) in states.items() if state == "disabled"}
    assert disabled == {"qmd-http"}
    assert states["qmd-http"][1] and "not started by default" in states["qmd-http"][1]
    assert {name: state for name, (state, _) in states.items() if name not in disabled} == {
        "qmd-mcp": "ready", "memory": "ready", "qmd": "ready", "graphify": "ready", "wiki": "ready",
    }  # fmt: skip


def test_the_default_catalog_is_the_reference_surface(prepared: Path) -> None:
    done = _gateway(prepared, "tools")
    assert done.returncode == 0, done.stderr
    tools = {t["name"]: t for t in json.loads(done.stdout)}
    assert {
        "wiki_index", "files_read", "files_neighbors", "wiki_read_all", "files_search", "graph_query", "graph_path",
        "memory_recall",
    } <= tools.keys()  # fmt: skip
    assert tools["files_search"]["providers"] == [
        "qmd-mcp/query", "qmd/files_search", "wiki/wiki_hybrid_search", "wiki/wiki_vector_search", "wiki/wiki_search",
    ]  # fmt: skip
    assert tools["memory_recall"]["providers"] == ["memory/search_nodes"]
    for name in ("files_search", "wiki_index", "files_neighbors", "files_read", "wiki_read_all"):
        description = tools[name]["description"]
        assert "Router (which tool fits which question shape" in description, name
        assert "{cost:" not in description, name  # placeholders are filled with measured figures
    assert re.search(r"wiki_index \(~[\d,]+ tokens\)", tools["wiki_index"]["description"])  # the corpus's estimate


def _text(result: Any) -> str:
    text: str = result.content[0].text
    return text


@pytest.mark.anyio
async def test_the_default_loop_works_in_every_mode_within_two_seconds(prepared: Path) -> None:
    config = (prepared / "federation.yaml").read_text()
    with run_gateway(config, prepared) as gateway:

        async def qmd_probed() -> bool:  # its variant probes (qmd doctor) have answered: offline, two cannot run
            async with httpx2.AsyncClient() as http:
                backends = (await http.get(gateway.url("/status"))).json()["backends"]
            return any(b["name"] == "qmd" and len(b["variants_not_ready"]) == 2 for b in backends)

        async def semantic_loaded() -> bool:  # the wiki embeds its sections in a worker thread after it is ready
            return "wiki.semantic_indexed" in gateway.output()  # logged at debug, which the test gateway runs at

        await eventually(qmd_probed, within=30)
        await eventually(semantic_loaded, within=30)
        async with mcp_session(gateway.url()) as session:
            for mode in ("keyword", "vector", "deep"):
                started = time.perf_counter()
                with anyio.fail_after(2):
                    found = await session.call_tool("files_search", {"query": "fallback ladder", "mode": mode})
                    hits = json.loads(_text(found))
                    assert hits, (mode, _text(found))
                    first = hits[0]
                    neighbors = await session.call_tool("files_neighbors", {"path": first["file"]})
                    read = await session.call_tool("files_read", {"path": first["file"], "max_bytes": 2000})
                elapsed = time.perf_counter() - started
                assert not found.is_error and not neighbors.is_error and not read.is_error, (mode, first)
                assert found.structured_content is not None and found.structured_content["results"] == hits
                assert all(set(hit) == {"file", "title", "line", "score", "snippet"} for hit in hits)
                assert all((prepared / "docs" / hit["file"]).is_file() for hit in hits), hits
                assert all(0 <= hit["score"] <= 1 for hit in hits)
                assert hits == sorted(hits, key=lambda h: -h["score"])
                assert found.meta is not None and found.meta["mcp-gateway/result"]["score_scale"] in SCALES
                page_title = first["title"].split(" › ")[0]  # a section hit's title is "Page › Section"
                assert _text(neighbors).startswith(f"{first['file']} — {page_title}")
                assert _text(read).startswith("# " + page_title)
                assert elapsed < 2.0, (mode, elapsed)
                call = found.meta["mcp-gateway/call"]
                if mode == "keyword":
                    assert (call["status"], call["served_by"]) == ("ok", "qmd-mcp/query")
                    continue
                # No models offline: qmd's variants are skipped at once, with qmd doctor's words, and the wiki's own
                # semantic rungs answer: vector search for vector, hybrid (BM25 + vector) for deep.
                served = "wiki/wiki_vector_search" if mode == "vector" else "wiki/wiki_hybrid_search"
                assert (call["status"], call["served_by"]) == ("degraded", served), call
                note = found.content[-1].text  # type: ignore[union-attr]  # where the model reads it, not only _meta
                assert note.startswith(f"[gateway] Degraded answer: qmd/files_search [{mode}] could not serve"), note
                assert note.endswith(f"{served} answered instead.") and "model cache: missing" in note, note
                assert found.structured_content == {"results": hits, "degraded": note}
                skipped = call["steps"][:-1]
                assert [s["variant"] for s in skipped] == (["vector"] if mode == "vector" else ["deep", "vector"])
                for step in skipped:
                    assert step["outcome"] == "not_ready", step
                    assert "model cache: missing" in step["reason"] and "qmd doctor" in step["reason"], step
                    assert step["ms"] < 50, step


@pytest.mark.anyio
async def test_graph_query_speaks_of_its_own_arguments_and_maps_graphifys_names_for_them(prepared: Path) -> None:
    """graphify's hints name its CLI and MCP parameters (--budget, token_budget, context_filter, get_node), which
    graph_query refuses: the adapter says them in graph_query's terms, and a model that used one anyway is told
    which argument it meant."""
    config = (prepared / "federation.yaml").read_text()
    with run_gateway(config, prepared) as gateway:
        async with mcp_session(gateway.url()) as session:
            with anyio.fail_after(60):
                cut = await session.call_tool("graph_query", {"question": "fallback ladder", "budget": 100})
                foreign = await session.call_tool("graph_query", {"question": "fallback ladder", "token_budget": 500})
    text = _text(cut)
    assert not cut.is_error and "TRUNCATED" in text, text
    assert re.search(r"raise the token budget to (\d+) to get all \d+ \(budget=\1\) or narrow the question\.", text)
    for word in ("--budget", "token_budget", "context_filter", "get_node", "CLI:", "MCP:"):
        assert word not in text, (word, text)
    assert foreign.is_error
    assert _text(foreign) == (
        "Invalid argument 'token_budget' for tool 'graph_query': unknown argument; did you mean 'budget'?"
    )


INSPECTOR_IN_README = ".tools/bin/npx -y @modelcontextprotocol/inspector@2.12.0"
README_URL = "http://127.0.0.1:8080/mcp"


def readme_inspector_commands() -> list[list[str]]:
    """The README's Inspector commands (continuation lines joined), as argv lists."""
    text = (ROOT / "README.md").read_text(encoding="utf-8").replace("\\\n", " ")
    return [shlex.split(line) for line in text.splitlines() if line.startswith(INSPECTOR_IN_README)]


def test_the_readmes_inspector_commands_work_on_the_default_federation_wiki_read_all_with_its_header(
    prepared: Path,
) -> None:
    inspector = shutil.which("mcp-inspector")
    if inspector is None:
        pytest.skip("run scripts/install --tests: mcp-inspector is not on PATH")
    commands = readme_inspector_commands()
    tools = {argv[argv.index("--tool-name") + 1] for argv in commands if "--tool-name" in argv}
    assert tools == {"files_search", "wiki_read_all"}
    read_all = next(argv for argv in commands if "wiki_read_all" in argv)
    assert "X-Context-Window: 200000" in read_all  # the context gate lists it only to a large client
    config = (prepared / "federation.yaml").read_text()
    with run_gateway(config, prepared) as gateway:
        env = {**os.environ, "HOME": str(prepared), "MCP_CATALOG_PATH": str(prepared / "catalog.json")}
        for argv in commands:
            run = [inspector, *argv[len(shlex.split(INSPECTOR_IN_README)) :], "--format", "json"]
            run = [gateway.url() if word == README_URL else word for word in run]
            done = subprocess.run(run, capture_output=True, text=True, timeout=120, env=env, cwd=prepared)
            assert done.returncode == 0, (argv, done.stdout + done.stderr)
            answer = json.loads(done.stdout)["result"]
            if "tools/list" in argv:
                assert "wiki_read_all" not in {tool["name"] for tool in answer["tools"]}  # a small client's list
            else:
                assert not answer.get("isError"), answer
            if "wiki_read_all" in argv:
                assert answer["content"][0]["text"].startswith("Wiki: "), answer  # the whole wiki, served
