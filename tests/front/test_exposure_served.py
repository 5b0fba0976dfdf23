"""Search exposure over real processes: a gateway in front of real MCP servers (npm server-memory and
server-everything, PyPI mcp-server-time, an HTTP echo server), whose tools are found with the search tool and called
through the call tool and directly; an independent client (the MCP Inspector's CLI) sees the same; a backend that
goes down is left out of searches, or shown as down when asked."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from gateway.ledger.engines import open_reader
from gateway.ledger.readers import Filters
from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import GatewayProcesses, echo_argv, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer, free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.node]

EVERYTHING = shutil.which("mcp-server-everything")
MEMORY = shutil.which("mcp-server-memory")
TIME = shutil.which("mcp-server-time")
INSPECTOR = shutil.which("mcp-inspector")
if EVERYTHING is None or MEMORY is None or TIME is None:
    pytest.skip("run scripts/install: the npm and PyPI servers are not on PATH", allow_module_level=True)

TOKEN = "disclosure-token"


def _config(echo_url: str, folder: Path, mode: str = "search", extra: str = "") -> str:
    return f"""
gateway:
  router_note: |
    Router: memory questions -> search_nodes; clock questions -> get_current_time.
exposure:
  mode: {mode}
  pinned: [get_current_time]
{extra}
servers:
  time:
    transport: stdio
    command: {TIME}
    args: ["--local-timezone", "UTC"]
  memory:
    transport: stdio
    command: {MEMORY}
    env: {{MEMORY_FILE_PATH: {folder / "memory.jsonl"}}}
  everything:
    transport: stdio
    command: {EVERYTHING}
    args: [stdio]
  echo:
    transport: streamable_http
    url: {echo_url}
"""


ECHO = ("echo", "streamable_http", "--name", "echo", "--prefix", "remote_")


@pytest.fixture(scope="module")
def echo(downstream: Downstreams) -> Downstream:
    return downstream(*ECHO)


@pytest.fixture
def stoppable_echo(downstream: Downstreams) -> Downstream:
    """An echo server of the test's own, which it may stop."""
    return downstream(*ECHO, own=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("exposure")


@pytest.fixture(scope="module")
def gateway(echo: Downstream, folder: Path, gateway_process: GatewayProcesses) -> RunningServer:
    return gateway_process(_config(echo.url(), folder), tokens=TOKEN, folder=folder)


def _payload(result: types.CallToolResult) -> Any:
    assert not result.is_error, result.content
    first = result.content[0]
    assert isinstance(first, types.TextContent)
    return json.loads(first.text)


async def test_search_mode_lists_the_search_and_call_tools_and_the_pins_only(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        listed = await session.list_tools()
        assert [t.name for t in listed.tools] == ["find_tools", "call_tool", "get_current_time"]
        search = listed.tools[0]
        assert "Router: memory questions -> search_nodes" in (search.description or "")  # the router note rides here
        assert "find_tools" in (session.initialize_result.instructions or "")  # type: ignore[attr-defined]


async def test_a_tool_found_by_search_is_called_through_the_call_tool_and_directly(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        found = _payload(await session.call_tool("find_tools", {"query": "add entities to the knowledge graph"}))
        names = [t["name"] for t in found["tools"]]
        assert "create_entities" in names[:5], names
        hit = next(t for t in found["tools"] if t["name"] == "create_entities")
        assert hit["backend"] == "memory" and hit["health"] == "ready"
        assert hit["inputSchema"]["properties"]["entities"]["type"] == "array"
        assert hit["cost"] == "not measured yet"

        entity = {"name": "Alice", "entityType": "person", "observations": ["works at Acme"]}
        made = await session.call_tool("call_tool", {"name": "create_entities", "arguments": {"entities": [entity]}})
        assert not made.is_error, made.content
        direct = await session.call_tool("search_nodes", {"query": "Alice"})  # not listed, still callable by name
        assert not direct.is_error and "works at Acme" in str(direct.content)

        summed = await session.call_tool("call_tool", {"name": "get-sum", "arguments": {"a": 2, "b": 3}})
        assert "5" in str(summed.content)


async def test_the_call_tool_is_audited_under_the_real_tools_name(gateway: RunningServer, folder: Path) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        await session.call_tool("call_tool", {"name": "get-sum", "arguments": {"a": 1, "b": 1}})
    ledger = folder / "audit.db"

    def recorded() -> bool:
        return ledger.exists() and bool(open_reader(ledger).query(Filters(tool="get-sum")))

    await eventually(recorded, within=10)
    assert open_reader(ledger).query(Filters(tool="call_tool")) == []
    async with httpx2.AsyncClient() as http:
        status = (await http.get(gateway.url("/status"), headers={"Authorization": f"Bearer {TOKEN}"})).json()
    assert status["catalog"]["tools"] > 20  # the whole catalog is still served, only listed differently


async def test_filters_and_bad_arguments_of_the_search_tool(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        only_time = _payload(await session.call_tool("find_tools", {"query": "time", "backend": "time"}))
        assert {t["name"] for t in only_time["tools"]} == {"get_current_time", "convert_time"}
        safe = _payload(await session.call_tool("find_tools", {"query": "delete", "destructive": False, "limit": 50}))
        assert "delete_entities" not in {t["name"] for t in safe["tools"]}
        with pytest.raises(MCPError, match="Invalid argument 'query' for tool 'find_tools'"):
            await session.call_tool("find_tools", {"query": ""})
        with pytest.raises(MCPError, match="Unknown tool: 'no_such_tool'"):  # as a direct call of that name would
            await session.call_tool("call_tool", {"name": "no_such_tool", "arguments": {}})


async def test_a_backend_that_goes_down_is_left_out_of_searches_or_shown_as_down(
    stoppable_echo: Downstream, tmp_path: Path
) -> None:
    echo = stoppable_echo
    with run_gateway(_config(echo.url(), tmp_path), tmp_path, tokens=TOKEN) as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as session:
            up = _payload(await session.call_tool("find_tools", {"query": "echo the text back", "backend": "echo"}))
            assert up["tools"] and all(t["health"] == "ready" for t in up["tools"])
            echo.process.kill()

            async def echo_down() -> bool:
                async with httpx2.AsyncClient() as http:
                    status = await http.get(gateway.url("/status"), headers={"Authorization": f"Bearer {TOKEN}"})
                backends = status.json()["backends"]
                state = next(b["state"] for b in backends if b["name"] == "echo")
                return bool(state != "ready")

            await eventually(echo_down, within=20)
            gone = _payload(await session.call_tool("find_tools", {"query": "echo the text back", "backend": "echo"}))
            assert gone["tools"] == []
            shown = _payload(await session.call_tool(
                "find_tools", {"query": "echo the text back", "backend": "echo", "include_unavailable": True}
            ))  # fmt: skip
            assert shown["tools"] and all(t["health"] != "ready" for t in shown["tools"])


async def test_all_mode_lists_every_tool_and_auto_mode_searches_for_a_small_client(
    echo: Downstream, tmp_path: Path
) -> None:
    with run_gateway(_config(echo.url(), tmp_path, "auto"), tmp_path, tokens=TOKEN) as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as small:  # no declared context: below the gate
            assert [t.name for t in (await small.list_tools()).tools][:2] == ["find_tools", "call_tool"]
        large = {"X-Context-Window": "200000"}
        async with mcp_session(gateway.url(), token=TOKEN, headers=large) as client:
            names = {t.name for t in (await client.list_tools()).tools}
            assert {"create_entities", "get-sum", "get_current_time"} <= names and "find_tools" not in names
            with pytest.raises(MCPError, match="Unknown tool: 'find_tools'"):  # not offered, so not there
                await client.call_tool("find_tools", {"query": "x"})


@pytest.mark.skipif(INSPECTOR is None, reason="run scripts/install: mcp-inspector is not on PATH")
def test_the_inspector_finds_and_calls_a_tool_in_search_mode(gateway: RunningServer, tmp_path: Path) -> None:
    def inspector(*args: str) -> Any:
        command = [str(INSPECTOR), "--cli", gateway.url(), "--header", f"Authorization: Bearer {TOKEN}", *args,
                   "--format", "json"]  # fmt: skip
        env = {**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json"), "HOME": str(tmp_path)}
        done = subprocess.run(command, capture_output=True, text=True, timeout=90, env=env, cwd=tmp_path)
        assert done.returncode == 0, done.stdout + done.stderr
        return json.loads(done.stdout)["result"]

    listed = inspector("--method", "tools/list")
    assert [t["name"] for t in listed["tools"]] == ["find_tools", "call_tool", "get_current_time"]
    found = inspector("--method", "tools/call", "--tool-name", "find_tools", "--tool-arg", "query=add two numbers")
    names = [t["name"] for t in found["structuredContent"]["tools"]]
    assert "get-sum" in names, names
    called = inspector("--method", "tools/call", "--tool-name", "call_tool", "--tool-args-json",
                       json.dumps({"name": "get-sum", "arguments": {"a": 20, "b": 22}}))  # fmt: skip
    assert "42" in json.dumps(called)


def _late_joiner_config(port: int, pinned: str, steady: str, argv: list[str]) -> str:
    """The client ``searcher`` in search mode, ``pinned`` tools, the stdio backend ``steady`` running ``argv``, and
    ``late``, at ``port`` on loopback, which joins once the test starts it there."""
    return f"""
exposure:
  clients: {{searcher: search}}
  pinned: {pinned}
servers:
  {steady}:
    transport: stdio
    command: {json.dumps(argv[0])}
    args: {json.dumps(argv[1:])}
  late:
    transport: streamable_http
    url: http://127.0.0.1:{port}/mcp
    connect_timeout_s: 2
"""


async def test_a_search_mode_client_is_told_of_list_changes_only_when_its_pins_change(tmp_path: Path) -> None:
    """A backend joining changes the catalog: an all-mode client is told to re-list, a search-mode client (whose
    list, the search and call tools, did not change) is not; a reload that pins another tool tells the search-mode
    client only."""
    port = free_port()

    def config(pinned: str) -> str:
        return _late_joiner_config(port, pinned, "time", [str(TIME), "--local-timezone", "UTC"])

    heard: dict[str, list[str]] = {"searcher": [], "lister": []}

    def handler(who: str) -> Any:
        async def on_message(message: Any) -> None:
            if isinstance(message, types.ToolListChangedNotification):
                heard[who].append("tools")

        return on_message

    searcher = types.Implementation(name="searcher", version="1")
    with run_gateway(config("[]"), tmp_path, tokens=TOKEN) as gateway:
        async with (
            mcp_session(gateway.url(), token=TOKEN, client_info=searcher, message_handler=handler("searcher")) as a,
            mcp_session(gateway.url(), token=TOKEN, message_handler=handler("lister")) as b,
        ):
            assert [t.name for t in (await a.list_tools()).tools] == ["find_tools", "call_tool"]
            assert "late_echo" not in {t.name for t in (await b.list_tools()).tools}
            late = echo_argv("--http", str(port), "--name", "late", "--prefix", "late_")
            with start_http_server(late, port):
                await eventually(lambda: heard["lister"] == ["tools"], within=40)  # the backend joined
                assert "late_echo" in {t.name for t in (await b.list_tools()).tools}
                (tmp_path / "federation.yaml").write_text(config("[get_current_time]"))
                await eventually(lambda: len(heard["searcher"]) == 1, within=20)  # the pins changed
                listed = [t.name for t in (await a.list_tools()).tools]
                assert listed == ["find_tools", "call_tool", "get_current_time"]
                # In order on one stream: had the join been announced to the searcher, it would have come first.
                assert heard["searcher"] == ["tools"]
                assert "get_current_time" in {t.name for t in (await b.list_tools()).tools}
                assert heard["lister"] == ["tools"]  # the pins are not part of the all-mode list


@pytest.mark.skipif(INSPECTOR is None, reason="run scripts/install: mcp-inspector is not on PATH")
def test_the_inspector_in_auto_mode_searches_unless_it_declares_a_large_context(
    echo: Downstream, tmp_path: Path
) -> None:
    def listed(*headers: str) -> list[str]:
        command = [str(INSPECTOR), "--cli", gateway.url(), "--header", f"Authorization: Bearer {TOKEN}"]
        for header in headers:
            command += ["--header", header]
        env = {**os.environ, "MCP_CATALOG_PATH": str(tmp_path / "catalog.json"), "HOME": str(tmp_path)}
        done = subprocess.run([*command, "--method", "tools/list", "--format", "json"], capture_output=True,
                              text=True, timeout=90, env=env, cwd=tmp_path)  # fmt: skip
        assert done.returncode == 0, done.stdout + done.stderr
        return [t["name"] for t in json.loads(done.stdout)["result"]["tools"]]

    with run_gateway(_config(echo.url(), tmp_path, "auto"), tmp_path, tokens=TOKEN) as gateway:
        assert listed() == ["find_tools", "call_tool", "get_current_time"]  # an unknown client counts as small
        every = listed("X-Context-Window: 200000")
        assert {"get-sum", "create_entities", "remote_echo"} <= set(every) and "find_tools" not in every


async def test_search_mode_respects_the_callers_policy(echo: Downstream, tmp_path: Path) -> None:
    """A caller whose policy shows only the time backend finds only its tools, is not pinned what it cannot see,
    and a call through the call tool to a hidden tool is answered as an unknown tool; another caller sees all."""
    policies = """
  pinned: [get_current_time, create_entities]
policies:
  clock:
    callers: [clock]
    backends: {include: [time]}
  everyone: {}
"""
    config = _config(echo.url(), tmp_path).replace("  pinned: [get_current_time]\n", policies)
    with run_gateway(config, tmp_path, tokens=f"clock={TOKEN},ops=ops-token") as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as clock:
            assert [t.name for t in (await clock.list_tools()).tools] == ["find_tools", "call_tool", "get_current_time"]
            found = _payload(
                await clock.call_tool("find_tools", {"query": "create entities in the graph", "limit": 50})
            )
            shown = found["tools"] + found.get("closest", [])  # none of its tools fits: they are named as closest
            assert {t["name"] for t in shown} == {"get_current_time", "convert_time"}
            with pytest.raises(MCPError, match="Unknown tool: 'create_entities'"):
                await clock.call_tool("call_tool", {"name": "create_entities", "arguments": {"entities": []}})
        async with mcp_session(gateway.url(), token="ops-token") as ops:
            names = [t.name for t in (await ops.list_tools()).tools]
            assert names == ["find_tools", "call_tool", "get_current_time", "create_entities"]
            found = _payload(await ops.call_tool("find_tools", {"query": "add entities to the knowledge graph"}))
            assert "create_entities" in [t["name"] for t in found["tools"]]


async def test_a_stateless_2026_client_named_like_a_search_mode_client_gets_the_search_list(tmp_path: Path) -> None:
    """A 2026-07-28 client never sends initialize: its clientInfo rides in every request's ``_meta``, and that is what
    picks its exposure (``exposure.clients``), as the initialize does for a client of an earlier era."""
    from mcp.client import Client
    from mcp.client.streamable_http import streamable_http_client

    config = f"""
exposure:
  clients: {{searcher: search}}
servers:
  e:
    transport: stdio
    command: {json.dumps(echo_argv()[0])}
    args: {json.dumps(echo_argv()[1:])}
"""

    def client(http: httpx2.AsyncClient, url: str, name: str) -> Client:
        info = types.Implementation(name=name, version="1")
        return Client(streamable_http_client(url, http_client=http), mode="2026-07-28", client_info=info, cache=None)

    with run_gateway(config, tmp_path, tokens=TOKEN) as gateway:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(20)) as http:
            async with (
                client(http, gateway.url(), "searcher") as searcher,
                client(http, gateway.url(), "lister") as lister,
            ):
                assert [t.name for t in (await searcher.list_tools()).tools] == ["find_tools", "call_tool"]
                assert "echo" in {t.name for t in (await lister.list_tools()).tools}
                found = _payload(await searcher.call_tool("find_tools", {"query": "echo"}))
                assert "echo" in [hit["name"] for hit in found["tools"]]
                called = await searcher.call_tool("call_tool", {"name": "echo", "arguments": {"text": "hi"}})
                assert not called.is_error and called.structured_content == {"text": "hi", "server": "echo"}


async def test_a_stateless_2026_search_mode_clients_listen_stream_hears_of_its_own_list_changes_only(
    tmp_path: Path,
) -> None:
    """The stateless era's ``subscriptions/listen``: a backend joining is announced on an all-mode client's stream,
    not on a search-mode one's (its list, the search and call tools, did not change); a reload that pins a tool is
    announced on the search-mode stream. The mode comes from the clientInfo of the listen request's ``_meta``."""
    port = free_port()

    def config(pinned: str) -> str:
        return _late_joiner_config(port, pinned, "e", echo_argv())

    heard: dict[str, list[str]] = {"searcher": [], "lister": []}
    acknowledged: set[str] = set()

    async def listen(http: httpx2.AsyncClient, url: str, name: str) -> None:
        meta = {
            "io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": name, "version": "1"},
        }
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "subscriptions/listen",
            "params": {"_meta": meta, "notifications": {"toolsListChanged": True}},
        }
        headers = {
            "Authorization": f"Bearer {TOKEN}",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "subscriptions/listen",
            "Accept": "application/json, text/event-stream",
        }
        async with http.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data:") and line[5:].strip():
                    method = json.loads(line[5:])["method"]
                    if method == "notifications/subscriptions/acknowledged":
                        acknowledged.add(name)
                    else:
                        heard[name].append(method)

    tools = "notifications/tools/list_changed"
    with run_gateway(config("[]"), tmp_path, tokens=TOKEN) as gateway:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(60)) as http, anyio.create_task_group() as streams:

            async def e_ready() -> bool:
                return (await http.get(gateway.url("/healthz"))).json()["backends"]["e"] == "ready"

            # Streams opened while `e` still starts would hear `e` join as well as `late` (a busy machine's order).
            await eventually(e_ready, within=20)
            streams.start_soon(listen, http, gateway.url(), "searcher")
            streams.start_soon(listen, http, gateway.url(), "lister")
            await eventually(lambda: acknowledged == {"searcher", "lister"}, within=20)
            late = echo_argv("--http", str(port), "--name", "late", "--prefix", "late_")
            with start_http_server(late, port):
                await eventually(lambda: heard["lister"] == [tools], within=40)  # the backend joined
                before = len(heard["searcher"])
                (tmp_path / "federation.yaml").write_text(config("[echo]"))
                await eventually(lambda: len(heard["searcher"]) == before + 1, within=20)  # the pins changed
                # In order on one stream: had the join been announced to the searcher, it would have come first.
                assert heard["searcher"] == [tools]
                assert heard["lister"] == [tools]  # the pins are not part of the all-mode list
            streams.cancel_scope.cancel()
