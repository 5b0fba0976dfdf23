"""mcp-use (PyPI), run in its own venv: a session of its MCPClient, configured as its users write the config."""

from __future__ import annotations

from typing import Any

from harness import Report, main, text_of
from mcp_use import MCPClient


async def exercise(scenario: dict[str, Any], report: Report) -> None:
    server: dict[str, Any] = dict(scenario["target"])
    headers = dict(server.pop("headers", None) or {})
    bearer = headers.pop("Authorization", "").removeprefix("Bearer ")
    if "url" in server:
        # A token goes in `auth`, as mcp-use documents it: with `auth` unset it starts its own OAuth flow against a
        # server that publishes OAuth metadata, whatever Authorization header it was given.
        server |= {"headers": headers, **({"auth": bearer} if bearer else {})}
    client = MCPClient(config={"mcpServers": {"gw": server}})
    try:
        session = await client.create_session("gw")
        report.connected = True
        report.tools = [tool.name for tool in await session.list_tools()]
        for name, arguments in scenario["script"]:
            result = await session.call_tool(name, arguments)
            report.read(name, text_of(result.content), bool(result.isError))
    finally:
        await client.close_all_sessions()


if __name__ == "__main__":
    main("mcp-use", exercise)
