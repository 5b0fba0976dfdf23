"""Headers a tool declares for its arguments (`x-mcp-header`, SEP-2243) are produced on the gateway's request to a
2026-07-28 downstream, whatever era the gateway's own client speaks.

The downstream is tests/fixtures/conformance_server.py over streamable HTTP: its `test_header_mirror` declares
`region` as `Mcp-Param-Region` and `priority` as `Mcp-Param-Priority`, the SDK under it refuses a call whose headers
disagree with the arguments, and the tool answers with the `Mcp-Param-*` headers that reached it.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from tests.fixtures.gateway_proc import mcp_session, one_backend_config, run_gateway
from tests.fixtures.procs import conformance_server_argv, free_port, start_http_server

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


async def test_declared_argument_headers_reach_a_modern_downstream(tmp_path: Path) -> None:
    port = free_port()
    with start_http_server(conformance_server_argv(port), port) as downstream:
        config = one_backend_config(
            "headers-gateway", "modern", transport="streamable_http", url=downstream.url(), protocol="2026-07-28"
        )
        with run_gateway(config, tmp_path) as gateway:
            async with mcp_session(gateway.url()) as session:  # a handshake-era client: it sends no such headers
                with anyio.fail_after(30):
                    result = await session.call_tool(
                        "test_header_mirror", {"region": "eu-west-1", "priority": 3, "query": "not mirrored"}
                    )
    assert not result.is_error, result
    called, headers = result.content
    assert isinstance(called, types.TextContent) and isinstance(headers, types.TextContent)
    assert called.text.startswith("Header mirror called with:"), called.text
    got = json.loads(headers.text.removeprefix("Headers: "))
    assert got == {"mcp-param-region": "eu-west-1", "mcp-param-priority": "3"}
