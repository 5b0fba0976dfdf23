"""`server/discover` (2026-07-28): a stateless client is offered what the ready backends offer, as at `initialize`.

The backend here starts slowly (a shell sleeps before it execs the conformance fixture over stdio), so the first
`server/discover` arrives while it is still connecting: answered at once, it would offer tools only, and a client
that caches the answer (its `ttlMs`) would never look for resources or prompts. The gateway waits, bounded, for
every backend's first outcome before its first discovery answer, as it does for the first handshake.
"""

from __future__ import annotations

import shlex
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.fixtures.gateway_proc import FIXTURES, PYTHON, run_gateway

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
START_DELAY_S = 1.5


def _discover_body(request_id: int) -> dict[str, Any]:
    meta = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
    return {"jsonrpc": "2.0", "id": request_id, "method": "server/discover", "params": {"_meta": meta}}


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


async def test_the_first_discovery_waits_for_a_slow_backend_and_offers_what_it_offers(tmp_path: Path) -> None:
    fixture = shlex.join([PYTHON, str(FIXTURES / "conformance_server.py"), "--stdio"])
    config = f"""
gateway:
  name: discover-gateway
  audit: {{enabled: false}}
servers:
  slow:
    transport: stdio
    command: sh
    args: ["-c", {f"sleep {START_DELAY_S} && exec {fixture}"!r}]
"""
    with run_gateway(config, tmp_path) as gateway:
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
