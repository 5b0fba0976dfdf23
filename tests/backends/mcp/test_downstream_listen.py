"""A 2026-07-28 downstream's list changes reach the gateway's catalog and its clients.

That era has no session to notify: the downstream announces a change only on a `subscriptions/listen` stream its
client holds open. The downstream here is tests/fixtures/conformance_server.py over streamable HTTP (its
`test_trigger_tool_change` / `test_trigger_prompt_change` tools change a description and publish the change on its
listen streams only, in that era). The gateway's client is a handshake-era one: it hears the change as
`notifications/*/list_changed` and lists the new description.

The downstream's listen streams come as SSE and, in a second run, as JSON lines in an `application/json` body (the
fixture's `--json-lines`, the framing of the conformance suite's reference server): the gateway reads both.

A listen stream that ends is reopened (backoff, the backend stays ready): tests/fixtures/listen_server.py closes its
streams on command, and a change made after that still reaches the client.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest

from tests.fixtures.gateway_proc import FIXTURES, PYTHON, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer, conformance_server_argv, free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


@pytest.fixture(params=["sse", "json-lines"])
def downstream(request: pytest.FixtureRequest) -> Iterator[RunningServer]:
    """The fixture downstream, its listen streams in SSE or, as some servers of that era send them (the conformance
    suite's reference server among them), as JSON lines in an `application/json` body."""
    port = free_port()
    extra = ("--json-lines",) if request.param == "json-lines" else ()
    with start_http_server(conformance_server_argv(port, *extra), port) as server:
        yield server


def _config(downstream: RunningServer, protocol: str = "2026-07-28") -> str:
    era = f'\n    protocol: "{protocol}"' if protocol == "2026-07-28" else ""  # else the handshake, the default
    return f"""
gateway:
  name: listen-gateway
  audit: {{enabled: false}}
  naming: {{mode: conditional}}
servers:
  modern:
    transport: streamable_http
    url: {downstream.url()}{era}
"""


async def test_a_modern_downstreams_list_changes_reach_the_catalog_and_the_clients(
    downstream: RunningServer, tmp_path: Path
) -> None:
    heard: list[str] = []
    changed = {"tools": anyio.Event(), "prompts": anyio.Event()}

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            heard.append(message.method)
            changed["tools"].set()
        elif isinstance(message, types.PromptListChangedNotification):
            heard.append(message.method)
            changed["prompts"].set()

    with run_gateway(_config(downstream), tmp_path) as gateway:
        async with mcp_session(gateway.url(), message_handler=on_message) as session:
            with anyio.fail_after(30):
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                assert tools["test_dynamic_tool"].description == "A tool whose description changes (version 0)"
                prompts = {prompt.name: prompt for prompt in (await session.list_prompts()).prompts}
                assert "(version 0)" in (prompts["test_dynamic_prompt"].description or ""), prompts

                await session.call_tool("test_trigger_tool_change", {})
                await changed["tools"].wait()
                tools = {tool.name: tool for tool in (await session.list_tools()).tools}
                assert tools["test_dynamic_tool"].description == "A tool whose description changes (version 1)"

                await session.call_tool("test_trigger_prompt_change", {})
                await changed["prompts"].wait()
                prompts = {prompt.name: prompt for prompt in (await session.list_prompts()).prompts}
                assert "(version 1)" in (prompts["test_dynamic_prompt"].description or ""), prompts
    assert heard == ["notifications/tools/list_changed", "notifications/prompts/list_changed"]


@pytest.mark.parametrize("protocol", ["2026-07-28", "2025-11-25"])
async def test_an_announced_change_that_changes_nothing_still_reaches_the_clients(
    protocol: str, tmp_path: Path
) -> None:
    # The downstream announces a tool list change and its list stays the same (as the conformance suite's reference
    # server does): its direct client hears the announcement, so the gateway's client does too, although the
    # catalog rebuilt from the re-read list is the same.
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    port = free_port()
    with (
        start_http_server(conformance_server_argv(port), port) as downstream,
        run_gateway(_config(downstream, protocol), tmp_path) as gateway,
    ):
        async with mcp_session(gateway.url(), message_handler=on_message) as session:
            with anyio.fail_after(30):
                before = (await session.list_tools()).tools
                await session.call_tool("test_announce_unchanged_tools", {})
                await changed.wait()
                assert (await session.list_tools()).tools == before


async def test_a_listen_stream_that_ends_is_reopened_and_still_carries_changes(tmp_path: Path) -> None:
    port = free_port()
    changed = anyio.Event()

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changed.set()

    with start_http_server([PYTHON, str(FIXTURES / "listen_server.py"), "--port", str(port)], port) as downstream:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(10)) as http:

            async def listens() -> dict[str, int]:
                answer: dict[str, int] = (await http.get(downstream.url("/listens"))).json()
                return answer

            async def open_streams(opened: int) -> bool:
                return await listens() == {"opened": opened, "open": 1}

            with run_gateway(_config(downstream), tmp_path) as gateway:
                async with mcp_session(gateway.url(), message_handler=on_message) as session:
                    with anyio.fail_after(30):
                        await eventually(lambda: open_streams(1), within=20)
                        (probe,) = (await session.list_tools()).tools
                        assert probe.description == "probe version 0"

                        assert (await http.post(downstream.url("/close-listens"))).status_code == 200
                        await eventually(lambda: open_streams(2), within=20)  # reopened: one stream again

                        assert (await http.post(downstream.url("/change"))).json() == {"version": 1}
                        await changed.wait()
                        (probe,) = (await session.list_tools()).tools
                        assert probe.description == "probe version 1"
                        backends = (await http.get(gateway.url("/status"))).json()["backends"]
                        assert [(b["name"], b["state"]) for b in backends] == [("modern", "ready")]
