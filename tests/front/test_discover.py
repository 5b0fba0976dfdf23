"""What a stateless (2026-07-28) client is offered: `server/discover`, and `subscriptions/listen` streams.

`server/discover` offers what the ready backends offer, as `initialize` does.

The backend here starts slowly (a shell sleeps before it execs the conformance fixture over stdio), so the first
`server/discover` arrives while it is still connecting. It is answered at once (never held by a backend's start) and,
what that backend will bring being unknown yet, offers everything it may: offered tools only, a client that caches
the answer (its `ttlMs`) would never look for resources or prompts.

A listen stream is acknowledged with what the gateway will deliver on it: the list changes asked for, never the
`resourceSubscriptions` (it does not feed them; resource updates go to handshake-era subscribers).
"""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.fixtures.gateway_proc import FIXTURES, PYTHON, one_backend_config, run_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

MODERN = "2026-07-28"
START_DELAY_S = 1.5


META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}


def _discover_body(request_id: int) -> dict[str, Any]:
    return {"jsonrpc": "2.0", "id": request_id, "method": "server/discover", "params": {"_meta": META}}


def _config(start_delay_s: float) -> str:
    fixture = shlex.join([PYTHON, str(FIXTURES / "conformance_server.py"), "--stdio"])
    command = f"sleep {start_delay_s} && exec {fixture}" if start_delay_s else f"exec {fixture}"
    return one_backend_config("discover-gateway", "slow", transport="stdio", command="sh", args=["-c", command])


async def _discover(http: httpx2.AsyncClient, url: str, request_id: int) -> dict[str, Any]:
    headers = {
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "server/discover",
        "Accept": "application/json, text/event-stream",
    }
    response = await http.post(url, json=_discover_body(request_id), headers=headers)
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["id"] == request_id, body
    result: dict[str, Any] = body["result"]
    return result


async def test_the_first_discovery_is_answered_while_a_slow_backend_starts_and_offers_what_it_may(
    tmp_path: Path,
) -> None:
    with run_gateway(_config(START_DELAY_S), tmp_path, started=False) as gateway:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http:
            with anyio.fail_after(30):
                first = await _discover(http, gateway.url(), 1)
                again = await _discover(http, gateway.url(), 2)

    capabilities = first["capabilities"]
    # Everything the fixture offers, each list with listChanged (served on subscriptions/listen streams).
    assert capabilities["tools"] == {"listChanged": True}, first
    assert capabilities["prompts"] == {"listChanged": True}, first
    assert capabilities["resources"] == {"subscribe": True, "listChanged": True}, first
    assert capabilities["completions"] == {}, first
    assert first["supportedVersions"] == [MODERN], first
    assert first["_meta"]["io.modelcontextprotocol/serverInfo"]["name"] == "discover-gateway", first
    assert again["capabilities"] == capabilities, again


async def test_a_listen_stream_is_acknowledged_with_what_the_gateway_delivers(tmp_path: Path) -> None:
    # List changes, and the resource subscription: the backend serves the URI and takes resources/subscribe.
    watched = "test://watched-resource"
    body = {
        "jsonrpc": "2.0",
        "id": 7,
        "method": "subscriptions/listen",
        "params": {
            "_meta": META,
            "notifications": {"toolsListChanged": True, "promptsListChanged": True, "resourceSubscriptions": [watched]},
        },
    }
    headers = {
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "subscriptions/listen",
        "Accept": "application/json, text/event-stream",
    }
    with run_gateway(_config(0), tmp_path) as gateway:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(30)) as http:
            with anyio.fail_after(30):
                async with http.stream("POST", gateway.url(), json=body, headers=headers) as response:
                    assert response.status_code == 200
                    first: dict[str, Any] | None = None
                    async for line in response.aiter_lines():
                        if line.startswith("data:") and line[5:].strip():
                            first = json.loads(line[5:])
                            break
    assert first is not None
    assert first["method"] == "notifications/subscriptions/acknowledged", first
    assert first["params"]["notifications"] == {
        "toolsListChanged": True,
        "promptsListChanged": True,
        "resourceSubscriptions": [watched],
    }, first
    assert first["params"]["_meta"]["io.modelcontextprotocol/subscriptionId"] == 7, first
