"""The fastmcp Client (PyPI ``fastmcp``), run in its own venv: what a host built on it gets (text content, isError)."""

from __future__ import annotations

from typing import Any

from fastmcp import Client
from fastmcp.client.transports import StdioTransport, StreamableHttpTransport
from harness import Report, main, text_of


async def exercise(scenario: dict[str, Any], report: Report) -> None:
    target = scenario["target"]
    if "url" in target:
        transport: Any = StreamableHttpTransport(target["url"], headers=target.get("headers") or {})
    else:
        transport = StdioTransport(command=target["command"], args=target["args"], env=target["env"])
    async with Client(transport) as client:
        report.connected = True
        report.tools = [tool.name for tool in await client.list_tools()]
        for tool, arguments in scenario["script"]:
            result = await client.call_tool(tool, arguments, raise_on_error=False)
            report.read(tool, text_of(result.content), result.is_error)


if __name__ == "__main__":
    main("fastmcp", exercise)
