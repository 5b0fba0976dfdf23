"""Third-party MCP servers from the registries behind the gateway, compared with calling them directly.

`mcp-server-time` (PyPI) over stdio; `@modelcontextprotocol/server-everything` (npm) over stdio, streamable HTTP and
SSE. scripts/install puts their launchers in .tools/bin; without them these tests are skipped with the reason.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.client.sse import sse_client
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import GatewayProcesses, mcp_session
from tests.fixtures.procs import RunningServer

pytestmark = [pytest.mark.anyio, pytest.mark.node]

EVERYTHING = shutil.which("mcp-server-everything")
TIME = shutil.which("mcp-server-time")
if EVERYTHING is None or TIME is None:
    pytest.skip("run scripts/install: mcp-server-everything / mcp-server-time are not on PATH", allow_module_level=True)

TOKEN = "third-party-token"


@pytest.fixture(scope="module")
def everything_http(downstream: Downstreams) -> Downstream:
    return downstream("everything", "streamable_http")


@pytest.fixture(scope="module")
def everything_sse(downstream: Downstreams) -> Downstream:
    return downstream("everything", "sse")


@pytest.fixture(scope="module")
def gateway(
    everything_http: Downstream, everything_sse: Downstream, gateway_process: GatewayProcesses
) -> RunningServer:
    config = f"""
gateway:
  naming: {{mode: always, separator: "__"}}
servers:
  time:
    transport: stdio
    command: {TIME}
    args: ["--local-timezone", "UTC"]
  ev_stdio:
    transport: stdio
    command: {EVERYTHING}
    args: ["stdio"]
  ev_http:
    transport: streamable_http
    url: {everything_http.url()}
  ev_sse:
    transport: sse
    url: {everything_sse.url("/sse")}
"""
    return gateway_process(config, tokens=TOKEN)


@asynccontextmanager
async def _stdio(command: str, *args: str) -> AsyncIterator[ClientSession]:
    async with stdio_client(StdioServerParameters(command=command, args=list(args))) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def _sse(url: str) -> AsyncIterator[ClientSession]:
    async with sse_client(url) as (read, write):
        async with ClientSession(read, write) as session:
            await session.initialize()
            yield session


def _comparable(result: types.CallToolResult) -> dict[str, Any]:
    dumped = result.model_dump(by_alias=True, mode="json", exclude_none=True)
    dumped.pop("_meta", None)
    return dumped


async def test_every_transport_backend_is_listed_under_its_prefix(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
    for prefix in ("ev_stdio", "ev_http", "ev_sse"):
        assert {f"{prefix}__echo", f"{prefix}__get-sum", f"{prefix}__get-tiny-image"} <= names
    assert {"time__get_current_time", "time__convert_time"} <= names


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("echo", {"message": "through the gateway"}),
        ("get-sum", {"a": 19, "b": 23}),
        ("get-tiny-image", {}),
        ("get-structured-content", {"location": "New York"}),
    ],
)
async def test_server_everything_answers_the_same_on_every_transport(
    gateway: RunningServer,
    everything_http: Downstream,
    everything_sse: Downstream,
    tool: str,
    arguments: dict[str, Any],
) -> None:
    async with _stdio(str(EVERYTHING), "stdio") as direct:
        expected = _comparable(await direct.call_tool(tool, arguments))
    async with mcp_session(everything_http.url()) as direct_http:
        assert _comparable(await direct_http.call_tool(tool, arguments)) == expected
    async with _sse(everything_sse.url("/sse")) as direct_sse:
        assert _comparable(await direct_sse.call_tool(tool, arguments)) == expected
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        for prefix in ("ev_stdio", "ev_http", "ev_sse"):
            got = await session.call_tool(f"{prefix}__{tool}", arguments)
            assert _comparable(got) == expected, prefix


async def test_mcp_server_time_converts_the_same_directly_and_through_the_gateway(gateway: RunningServer) -> None:
    arguments = {"source_timezone": "UTC", "time": "12:30", "target_timezone": "Asia/Tokyo"}
    async with _stdio(str(TIME), "--local-timezone", "UTC") as direct:
        expected = _comparable(await direct.call_tool("convert_time", arguments))
        tools = {t.name: t for t in (await direct.list_tools()).tools}
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        got = _comparable(await session.call_tool("time__convert_time", arguments))
        via = {t.name: t for t in (await session.list_tools()).tools}
    assert got == expected
    assert json.loads(expected["content"][0]["text"])["target"]["timezone"] == "Asia/Tokyo"
    assert json.dumps(via["time__convert_time"].input_schema) == json.dumps(tools["convert_time"].input_schema)


async def test_long_running_operation_progress_reaches_the_client(gateway: RunningServer) -> None:
    seen: list[float] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append(progress)

    async with mcp_session(gateway.url(), token=TOKEN) as session:
        for prefix in ("ev_stdio", "ev_http"):
            seen.clear()
            result = await session.call_tool(
                f"{prefix}__trigger-long-running-operation",
                {"duration": 0.6, "steps": 3},
                progress_callback=on_progress,
            )
            assert not result.is_error
            assert seen == [1, 2, 3], prefix


def test_gateway_check_reports_every_third_party_backend_ready(gateway: RunningServer, tmp_path: Path) -> None:
    import subprocess
    import sys

    args = list(gateway.process.args)  # type: ignore[arg-type]
    config = Path(args[args.index("-c") + 1]).read_text()  # the federation.yaml the gateway fixture wrote
    path = tmp_path / "federation.yaml"
    path.write_text(config)
    done = subprocess.run(
        [sys.executable, "-m", "gateway", "check", "-c", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=90,
    )
    assert done.returncode == 0, done.stderr
    states = {b["name"]: b["state"] for b in json.loads(done.stdout)["backends"]}
    assert states == {"time": "ready", "ev_stdio": "ready", "ev_http": "ready", "ev_sse": "ready"}
