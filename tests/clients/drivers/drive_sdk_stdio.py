"""A host speaking MCP over stdio with the MCP Python SDK (the gateway's own venv), to a stdio program that is the
client under test: mcp-remote, the stdio-to-remote bridge that desktop clients spawn for a remote server."""

from __future__ import annotations

from typing import Any

from harness import Report, main, text_of
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client


async def exercise(scenario: dict[str, Any], report: Report) -> None:
    target = scenario["target"]
    parameters = StdioServerParameters(command=target["command"], args=target["args"], env=target["env"])
    async with stdio_client(parameters) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        report.connected = True
        report.tools = [tool.name for tool in (await session.list_tools()).tools]
        for name, arguments in scenario["script"]:
            result = await session.call_tool(name, arguments)
            report.read(name, text_of(result.content), result.is_error)


if __name__ == "__main__":
    main("mcp", exercise)
