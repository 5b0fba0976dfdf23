"""A downstream's refusal names its own tool ("Invalid arguments for tool search_nodes"); the client knows the tool by
the name the gateway publishes (renamed, prefixed, or a route), and that is the name its errors carry: in an isError
answer and in a JSON-RPC error passed through. An answer that is no error passes untouched. Real servers over stdio:
a fixture that refuses both ways, and npm's server-memory (whose SDK answers isError)."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from gateway.testing import in_process_gateway
from tests.fixtures import FIXTURES
from tests.fixtures.gateway_proc import PYTHON

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

STRICT = f"""
gateway: {{audit: {{enabled: false}}, naming: {{mode: always}}}}
servers:
  dict:
    transport: stdio
    command: {PYTHON}
    args: [{json.dumps(str(FIXTURES / "strict_server.py"))}]
    tools: {{rename: {{lookup: find_entry}}}}
"""


async def test_a_renamed_tools_errors_name_the_published_name_and_its_answers_pass_untouched() -> None:
    async with in_process_gateway(STRICT) as (client, _):
        with anyio.fail_after(10):
            with pytest.raises(MCPError) as rpc:
                await client.call_tool("dict__find_entry", {})
            soft = await client.call_tool("dict__find_entry", {"key": "soft"})
            fine = await client.call_tool("dict__find_entry", {"key": "a"})
    assert rpc.value.error.message == "Invalid arguments for tool dict__find_entry: 'key' is required"
    assert soft.is_error and soft.content[0].text == (  # type: ignore[union-attr]
        "MCP error -32602: Invalid arguments for tool dict__find_entry: 'soft' is not a key (see tool "
        "'dict__find_entry' docs)"
    )
    assert not fine.is_error and fine.content[0].text == "value of a (the lookup tool)"  # type: ignore[union-attr]


@pytest.mark.node
async def test_a_refusal_of_the_renamed_memory_tool_names_memory_recall_not_search_nodes(tmp_path: Path) -> None:
    memory = json.dumps(str(tmp_path / "memory.jsonl"))
    config = f"""
gateway: {{audit: {{enabled: false}}}}
servers:
  memory:
    transport: stdio
    command: mcp-server-memory
    env: {{MEMORY_FILE_PATH: {memory}}}
    tools: {{include: [search_nodes], rename: {{search_nodes: memory_recall}}}}
"""
    async with in_process_gateway(config, settle_s=30) as (client, _):
        with anyio.fail_after(20):
            refused = await client.call_tool("memory_recall", {})
    text = refused.content[0].text  # type: ignore[union-attr]
    assert refused.is_error and "for tool 'memory_recall'" in text, text  # refused by the published schema, by name
    assert "search_nodes" not in text
