"""A server's lists are bounded (backends/mcp/lists.py): one that lists more tools than its ``max_tools``, or a list
larger than its ``max_list_bytes``, fails with that reason and serves none of them, over a real stdio server."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.message import SessionMessage

from gateway.backends.base import BackendState
from gateway.backends.mcp.lists import LIST_TOO_LARGE, screen_lists
from gateway.backends.mcp.session import McpBackend
from gateway.config import StdioServer
from tests.fixtures.gateway_proc import echo_argv

pytestmark = pytest.mark.anyio


async def _first_outcome(tools: int, **limits: Any) -> McpBackend:
    argv = echo_argv("--stdio", "--tools", str(tools))
    config = StdioServer(transport="stdio", command=argv[0], args=tuple(argv[1:]), connect_timeout_s=30, **limits)
    backend = McpBackend("big", config)
    with anyio.fail_after(40):
        async with anyio.create_task_group() as tg:
            await tg.start(backend.run)
            tg.cancel_scope.cancel()
    return backend


@pytest.mark.spawns
async def test_a_server_listing_more_tools_than_the_default_limit_fails_saying_so_and_serves_none() -> None:
    backend = await _first_outcome(5_001)  # the default max_tools is 5,000
    assert backend.status.state is BackendState.FAILED
    assert backend.status.reason == "the server lists more than 5,000 tools (max_tools): it is not served"
    assert backend.tools() == ()


@pytest.mark.spawns
async def test_a_tools_list_over_max_list_bytes_fails_saying_so() -> None:
    backend = await _first_outcome(100, max_list_bytes=5_000)
    assert backend.status.state is BackendState.FAILED
    assert backend.status.reason is not None
    assert backend.status.reason.startswith("the server's tools list is over 5,000 bytes (max_list_bytes) after ")
    assert backend.tools() == ()


@pytest.mark.spawns
async def test_a_server_within_its_limits_is_served_whole() -> None:
    backend = await _first_outcome(100, max_tools=200)
    assert backend.status.state is BackendState.READY, backend.status.reason
    assert len(backend.tools()) > 100


def test_a_page_over_max_tools_is_replaced_by_an_error_before_the_sdk_reads_it() -> None:
    screen = screen_lists(StdioServer(transport="stdio", command="x", max_tools=5))
    tools = [{"name": f"t{i}", "inputSchema": {"type": "object"}} for i in range(6)]
    page = SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=3, result={"tools": tools}))
    screened = screen(page).message
    assert isinstance(screened, types.JSONRPCError) and screened.id == 3
    assert screened.error.code == LIST_TOO_LARGE
    assert screened.error.message == "the server lists more than 5 tools (max_tools): it is not served"
    within = SessionMessage(types.JSONRPCResponse(jsonrpc="2.0", id=4, result={"tools": tools[:5]}))
    assert screen(within) is within
