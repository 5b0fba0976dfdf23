"""A handshake-era (2025-11-25) client served by a downstream that speaks the stateless 2026-07-28 era alone.

Real processes: tests/fixtures/conformance_server.py over streamable HTTP with `--era 2026-07-28` (it refuses
`initialize`, so the gateway learns at connect that it speaks that era only; no `protocol:` is declared) behind a
real `gateway serve`; the client is the SDK's `Client` in the handshake era. What that era does on the session and
the 2026-07-28 era per request is carried across: the client's log level goes in each request's `_meta`, an
input-required result becomes requests on the call's own stream, and `resources/subscribe` is served by the
downstream's `subscriptions/listen` stream.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import one_backend_config, run_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

WATCHED = "test://watched-resource"


@pytest.fixture
def modern(downstream: Downstreams) -> Downstream:
    return downstream("conformance", "streamable_http", "--era", "2026-07-28", own=True)


class Heard:
    """What a handshake-era client hears besides its answers: log messages and resource updates."""

    def __init__(self) -> None:
        self.logs: list[str] = []
        self.updated: list[str] = []
        self.update_seen = anyio.Event()

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(str(params.data))

    async def message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(str(message.params.uri))
            self.update_seen.set()

    async def elicit(self, context: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"response": f"yes to {params.message}"})


@asynccontextmanager
async def handshake_client(url: str, heard: Heard) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(20)) as http:
        async with Client(
            streamable_http_client(url, http_client=http),
            mode="legacy",
            logging_callback=heard.log,
            message_handler=heard.message,
            elicitation_callback=heard.elicit,
            cache=None,
        ) as c:
            yield c


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def _config(modern: Downstream) -> str:
    return one_backend_config("bridge-back", "modern", transport="streamable_http", url=modern.url())


async def test_a_handshake_clients_log_level_reaches_a_stateless_downstream(modern: Downstream, tmp_path: Path) -> None:
    # A 2026-07-28 server sends log messages only at the level a request's _meta asks for (none when absent); a
    # handshake-era client gets every level until it sets one, as it would from a server of its own era.
    with run_gateway(_config(modern), tmp_path) as gateway:
        heard = Heard()
        with anyio.fail_after(40):
            async with handshake_client(gateway.url(), heard) as c:
                assert _text(await c.call_tool("test_tool_with_logging", {})) == (
                    "Tool with logging executed successfully"
                )
                assert heard.logs == ["Tool execution started", "Tool processing data", "Tool execution completed"]
                level = types.SetLevelRequest(params=types.SetLevelRequestParams(level="warning"))
                await c.session.send_request(level, types.EmptyResult)  # the Client's own method warns (2026)
                heard.logs.clear()
                await c.call_tool("test_tool_with_logging", {})
                assert heard.logs == []


async def test_an_input_required_result_is_asked_on_the_handshake_clients_call_stream(
    modern: Downstream, tmp_path: Path
) -> None:
    with run_gateway(_config(modern), tmp_path) as gateway:
        heard = Heard()
        with anyio.fail_after(40):
            async with handshake_client(gateway.url(), heard) as c:
                answered = _text(await c.call_tool("test_elicitation", {"message": "Proceed?"}))
    assert answered == 'User response: action=accept, content={"response": "yes to Proceed?"}'
