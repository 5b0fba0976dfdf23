"""A 2026-07-28 downstream's list changes reach the gateway's catalog and its clients.

That era has no session to notify: the downstream announces a change only on a `subscriptions/listen` stream its
client holds open. The downstream here is tests/fixtures/conformance_server.py over streamable HTTP (its
`test_trigger_tool_change` / `test_trigger_prompt_change` tools change a description and publish the change on its
listen streams only, in that era). The gateway's client is a handshake-era one: it hears the change as
`notifications/*/list_changed` and lists the new description.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from tests.fixtures.gateway_proc import mcp_session, run_gateway
from tests.fixtures.procs import RunningServer, conformance_server_argv, free_port, start_http_server

pytestmark = pytest.mark.anyio


@pytest.fixture
def downstream() -> Iterator[RunningServer]:
    port = free_port()
    with start_http_server(conformance_server_argv(port), port) as server:
        yield server


def _config(downstream: RunningServer) -> str:
    return f"""
gateway:
  name: listen-gateway
  audit: {{enabled: false}}
  naming: {{mode: conditional}}
servers:
  modern:
    transport: streamable_http
    url: {downstream.url()}
    protocol: "2026-07-28"
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
