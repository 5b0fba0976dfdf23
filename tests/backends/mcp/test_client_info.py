"""What a downstream is told of the gateway at its handshake: the gateway's name and its package version."""

from __future__ import annotations

import json

import anyio
import pytest

from gateway.backends.base import BackendState
from gateway.backends.mcp.session import McpBackend
from gateway.config import StdioServer
from gateway.version import VERSION
from tests.fixtures.gateway_proc import PYTHON, first_text

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

# A stdio server of a few lines (no SDK, so it starts at once): its one tool answers with the clientInfo it was given.
TELLER = """
import json, sys
client = None
for line in sys.stdin:
    message = json.loads(line)
    method, rid = message.get("method"), message.get("id")
    if method == "initialize":
        client = message["params"]["clientInfo"]
        result = {"protocolVersion": message["params"]["protocolVersion"], "capabilities": {"tools": {}},
                  "serverInfo": {"name": "teller", "version": "1"}}
    elif method == "tools/list":
        result = {"tools": [{"name": "client", "inputSchema": {"type": "object"}}]}
    elif method == "tools/call":
        result = {"content": [{"type": "text", "text": json.dumps(client)}]}
    elif rid is not None:
        result = {}
    else:
        continue
    print(json.dumps({"jsonrpc": "2.0", "id": rid, "result": result}), flush=True)
"""


async def test_a_backend_given_no_client_info_names_the_gateway_and_its_package_version() -> None:
    backend = McpBackend("teller", StdioServer(transport="stdio", command=PYTHON, args=("-c", TELLER)))
    async with anyio.create_task_group() as tg:
        with anyio.fail_after(20):
            await tg.start(backend.run)
        assert backend.status.state is BackendState.READY, backend.status.reason
        result = await backend.call_tool("client", {})
        tg.cancel_scope.cancel()
    assert json.loads(first_text(result)) == {"name": "mcp-gateway", "version": VERSION}
