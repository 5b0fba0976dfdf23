"""langchain-mcp-adapters (PyPI), run in its own venv: the LangChain tools it makes, invoked as an agent's tool node
does; a ToolException is what the model reads as the error."""

from __future__ import annotations

from typing import Any

from harness import Report, describe, main
from langchain_mcp_adapters.client import MultiServerMCPClient


def _text(output: Any) -> str:
    """The text of what a LangChain tool returns: a string, or content blocks."""
    if isinstance(output, list):
        return "\n".join(str(block.get("text", block)) if isinstance(block, dict) else str(block) for block in output)
    return str(output)


async def exercise(scenario: dict[str, Any], report: Report) -> None:
    target = scenario["target"]
    if "url" in target:
        connection: dict[str, Any] = {
            "transport": "streamable_http",
            "url": target["url"],
            "headers": target.get("headers") or {},
        }
    else:
        connection = {"transport": "stdio", "command": target["command"], "args": target["args"], "env": target["env"]}
    client = MultiServerMCPClient({"gw": connection})  # type: ignore[dict-item]
    tools = {tool.name: tool for tool in await client.get_tools()}
    report.connected = True
    report.tools = list(tools)
    for name, arguments in scenario["script"]:
        try:
            output = await tools[name].ainvoke(arguments)
        except Exception as exc:  # a ToolException (or a validation error) is what the model is shown
            report.read(name, describe(exc), True)
        else:
            report.read(name, _text(output), None)  # an isError result comes back as content, not raised


if __name__ == "__main__":
    main("langchain-mcp-adapters", exercise)
