"""The per-request boundary in the MCP face (gateway/server.py): an exception nobody expected while serving one
request becomes that request's error answer, is logged once, and the session serves the next request."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import anyio
import pytest
from mcp.shared.exceptions import MCPError
from structlog.testing import capture_logs

from gateway.testing import InProcess, in_process_gateway

pytestmark = pytest.mark.anyio


@pytest.fixture
async def connected(mode: str) -> AsyncIterator[InProcess]:
    async with in_process_gateway("gateway:\n  audit: {enabled: false}\n", mode=mode) as connected:
        yield connected


@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_an_unexpected_exception_answers_that_request_alone_and_the_session_serves_the_next(
    connected: InProcess, mode: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, gateway = connected
    real_call = gateway.router.call

    async def broken(*args: Any, **kwargs: Any) -> Any:
        raise KeyError("a bug")

    monkeypatch.setattr(gateway.router, "call", broken)
    with capture_logs() as logs, anyio.fail_after(5), pytest.raises(MCPError) as info:
        await client.call_tool("anything", {})
    assert info.value.error.code == -32603
    assert info.value.error.message == (
        "The gateway failed while serving this tools/call request (KeyError); "
        "the session and other requests are not affected."
    )
    assert [entry["event"] for entry in logs if entry["log_level"] == "error"] == ["request.internal_error"]
    monkeypatch.setattr(gateway.router, "call", real_call)
    with anyio.fail_after(5), pytest.raises(MCPError) as info:  # the same session, the next request
        await client.call_tool("no_such_tool", {})
    assert info.value.error.message == "Unknown tool: 'no_such_tool'."
