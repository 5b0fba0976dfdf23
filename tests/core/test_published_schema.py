"""A published tool's input schema is held once, by the gateway, before any provider: a route answers a call that
breaks it with the same sentence whichever mode or provider would have served it, and no provider is asked.

Real parts: ``gateway serve`` as a process, a route whose first provider (keyword mode) is the echo fixture server
over stdio with an argument template, as qmd's MCP server is in the default federation, and whose other provider is
a command-line adapter (tests/fixtures/fake_cli.py) publishing the schema.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest

from tests.fixtures.gateway_proc import FIXTURES, PYTHON, mcp_session
from tests.fixtures.procs import RunningServer

pytestmark = pytest.mark.anyio

SCHEMA = {
    "type": "object",
    "required": ["query"],
    "additionalProperties": False,
    "properties": {
        "query": {"type": "string", "minLength": 1},
        "limit": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
        "mode": {"enum": ["keyword", "vector"], "default": "vector"},
    },
}

CONFIG = f"""
gateway:
  name: schema-gateway
  audit: {{enabled: false}}
servers:
  echo:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps([str(FIXTURES / "echo_server.py"), "--stdio"])}
    tools: {{include: []}}
adapters:
  cli:
    command: {PYTHON}
    tools:
      search:
        input_schema: {json.dumps(SCHEMA)}
        argv: [{json.dumps(str(FIXTURES / "fake_cli.py"))}, echo, "{{query}}", "{{limit}}"]
        output: json_array
routes:
  search:
    providers:
      - provider: echo/echo
        when: {{mode: [keyword]}}
        arguments: {{text: "{{query}}"}}
      - cli/search
"""

BROKEN = [
    ({"query": "x", "bogus": 1}, "argument 'bogus' for tool 'search': unknown argument (expected: query, limit, mode)"),
    ({"query": "x", "limit": 0}, "argument 'limit' for tool 'search': must be between 1 and 50, got 0"),
    ({"query": "x", "limit": 999}, "argument 'limit' for tool 'search': must be between 1 and 50, got 999"),
    ({"query": ""}, "argument 'query' for tool 'search': must not be empty"),
    ({"limit": 3}, "argument 'query' for tool 'search': is required"),
]  # fmt: skip
"""Arguments that break the schema, and what the model reads back (after "Invalid ")."""


@pytest.fixture
def gateway(gateway_process: Any) -> RunningServer:
    served: RunningServer = gateway_process(CONFIG)
    return served


@pytest.mark.parametrize(("arguments", "sentence"), BROKEN)
@pytest.mark.parametrize("mode", ["keyword", "vector"])
async def test_a_call_that_breaks_the_published_schema_is_refused_alike_in_every_mode_before_any_provider(
    gateway: RunningServer, arguments: dict[str, Any], sentence: str, mode: str
) -> None:
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(30):
            result = await session.call_tool("search", {**arguments, "mode": mode})
    assert result.is_error, result
    assert [block.text for block in result.content] == [f"Invalid {sentence}"]  # type: ignore[union-attr]
    call = (result.meta or {})["mcp-gateway/call"]
    assert call["status"] == "refused" and "served_by" not in call and "steps" not in call  # no provider was asked


async def test_a_call_the_schema_accepts_is_served_by_the_provider_of_its_mode(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(30):
            keyword = await session.call_tool("search", {"query": "x", "mode": "keyword"})
            vector = await session.call_tool("search", {"query": "x", "limit": 2})
    assert not keyword.is_error and keyword.content[0].text == "x"  # type: ignore[union-attr]
    assert (keyword.meta or {})["mcp-gateway/call"]["served_by"] == "echo/echo"
    assert not vector.is_error and json.loads(vector.content[0].text) == ["x", "2"]  # type: ignore[union-attr]
    assert (vector.meta or {})["mcp-gateway/call"]["served_by"] == "cli/search"
