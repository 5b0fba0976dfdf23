"""The default federation.yaml, as a new user gets it: after scripts/prepare, every backend is ready.

The file and the project's docs/ are copied into a temporary folder (the file's relative paths resolve there, so the
indexes and the ledger stay out of the checkout); scripts/prepare builds the qmd index and the graph for it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import ROOT

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
    assert "estimated from the corpus" in tools["wiki_index"]["description"]
