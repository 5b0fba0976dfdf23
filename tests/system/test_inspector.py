"""The MCP Inspector's CLI (npm @modelcontextprotocol/inspector, Node 22) as an independent client of the gateway."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.downstreams import Downstreams
from tests.fixtures.gateway_proc import PYTHON, GatewayProcesses, echo_argv
from tests.fixtures.procs import RunningServer

pytestmark = pytest.mark.node

INSPECTOR = shutil.which("mcp-inspector")
EVERYTHING = shutil.which("mcp-server-everything")
if INSPECTOR is None or EVERYTHING is None:
    pytest.skip("run scripts/install: mcp-inspector / mcp-server-everything are not on PATH", allow_module_level=True)

TOKEN = "inspector-token"


@pytest.fixture(scope="module")
def gateway(downstream: Downstreams, gateway_process: GatewayProcesses) -> RunningServer:
    http_echo = downstream("echo", "streamable_http", "--name", "b")
    config = f"""
servers:
  a:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv("--name", "a")[1:])}
  b:
    transport: streamable_http
    url: {http_echo.url()}
  everything:
    transport: stdio
    command: {EVERYTHING}
    args: [stdio]
    tools: {{include: [get-sum]}}
"""
    return gateway_process(config, tokens=f"inspector={TOKEN}")


def _inspector(url: str, *args: str, token: str | None = TOKEN, folder: Path) -> tuple[int, Any]:
    command = [str(INSPECTOR), "--cli", url, *args, "--format", "json"]
    if token is not None:
        command[3:3] = ["--header", f"Authorization: Bearer {token}"]
    env = {**os.environ, "MCP_CATALOG_PATH": str(folder / "catalog.json"), "HOME": str(folder)}
    done = subprocess.run(command, capture_output=True, text=True, timeout=90, env=env, cwd=folder)
    try:
        return done.returncode, json.loads(done.stdout)
    except json.JSONDecodeError:
        return done.returncode, done.stdout + done.stderr


def test_the_inspector_lists_the_merged_tools_with_a_bearer_token(gateway: RunningServer, tmp_path: Path) -> None:
    code, doc = _inspector(gateway.url(), "--method", "tools/list", folder=tmp_path)
    assert code == 0, doc
    names = {tool["name"] for tool in doc["result"]["tools"]}
    assert {"a__echo", "b__echo", "get-sum"} <= names


@pytest.mark.parametrize(
    ("tool", "arguments", "expected"),
    [
        ("a__echo", {"text": "from a"}, "from a"),
        ("b__echo", {"text": "from b"}, "from b"),
        ("get-sum", {"a": 2, "b": 3}, "5"),
    ],
)
def test_the_inspector_calls_a_tool_on_every_backend_through_one_url(
    gateway: RunningServer, tmp_path: Path, tool: str, arguments: dict[str, Any], expected: str
) -> None:
    code, doc = _inspector(
        gateway.url(), "--method", "tools/call", "--tool-name", tool, "--tool-args-json", json.dumps(arguments),
        folder=tmp_path,
    )  # fmt: skip
    assert code == 0, doc
    assert expected in doc["result"]["content"][0]["text"]
    assert doc["result"]["_meta"]["mcp-gateway/call"]["status"] == "ok"


def test_the_inspector_without_a_token_is_refused(gateway: RunningServer, tmp_path: Path) -> None:
    code, doc = _inspector(gateway.url(), "--method", "tools/list", token=None, folder=tmp_path)
    assert code != 0
    assert "tools" not in json.dumps(doc)
