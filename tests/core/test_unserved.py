"""A call of a tool the file declares but no backend serves now is still an unknown tool (a JSON-RPC error), but its
message says whose the tool is and why it is off: a disabled server's (by its published name), a disabled adapter's,
a server's that never connected, a route's whose providers are all off. A caller whose policy hides the tool is told
nothing more than "Unknown tool"."""

from __future__ import annotations

import anyio
import pytest
from mcp.shared.exceptions import MCPError

from gateway.calls import Caller
from gateway.core.policies import Views
from gateway.testing import in_process_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]  # the failed server's spawn is attempted

CONFIG = """
gateway:
  audit: {enabled: false}
servers:
  everything:
    transport: stdio
    command: mcp-server-everything
    enabled: false
    disabled_reason: not needed today
    tools: {include: [echo], rename: {echo: say}}
  down:
    transport: stdio
    command: definitely-not-a-command-xyz
    tools: {include: [ping]}
adapters:
  search:
    command: my-search
    enabled: false
    tools:
      find: {argv: [find, "{q}"], input_schema: {type: object, properties: {q: {type: string}}}}
      grep: {argv: [grep, "{q}"], input_schema: {type: object, properties: {q: {type: string}}}}
routes:
  lookup: [search/find]
POLICIES
"""


async def _refusal(name: str, config: str = CONFIG.replace("POLICIES", "")) -> str:
    async with in_process_gateway(config) as (client, _):
        with anyio.fail_after(10), pytest.raises(MCPError) as caught:
            await client.call_tool(name, {})
    assert caught.value.error.code == -32602
    return caught.value.error.message


OFF = "disabled: disabled in the configuration"


@pytest.mark.parametrize(
    ("name", "said"),
    [
        ("say", "Unknown tool: 'say': it is a tool of server 'everything', which is disabled: not needed today."),
        ("everything__say", "it is a tool of server 'everything', which is disabled: not needed today."),
        ("grep", f"Unknown tool: 'grep': it is a tool of adapter 'search', which is {OFF}."),
        ("ping", "it is a tool of server 'down', which is failed: command not found: definitely-not-a-command-xyz."),
        ("lookup", f"Unknown tool: 'lookup': it is a route none of whose providers is available: search ({OFF})."),
        ("echo", "Unknown tool: 'echo'."),  # its downstream name: published as `say`
        ("find", "Unknown tool: 'find'."),  # served under the route's name only
        ("nothing", "Unknown tool: 'nothing'."),
    ],
)
async def test_a_call_of_a_declared_tool_that_is_off_says_whose_it_is_and_why(name: str, said: str) -> None:
    message = await _refusal(name)
    assert message.endswith(said), message


async def test_a_caller_whose_policy_hides_the_tool_is_told_only_that_it_is_unknown() -> None:
    policies = "policies:\n  ops: {callers: [ops]}\n  others: {tools: {exclude: [say]}}\n"
    async with in_process_gateway(CONFIG.replace("POLICIES", policies)) as (_, gateway):
        views = Views()
        ops, other = (views.view(gateway.catalog, Caller(name)) for name in ("ops", "someone"))
    assert ops is not None and other is not None
    assert "say" in ops.tools and "say" not in other.tools
    assert {"grep", "lookup"} <= other.tools
    assert [p["tools"] for p in views.statistics(gateway.catalog)["policies"]] == [0, 0]  # none is served
    message = await _refusal("say", CONFIG.replace("POLICIES", "policies:\n  all: {tools: {exclude: [say]}}\n"))
    assert message == "Unknown tool: 'say'."
