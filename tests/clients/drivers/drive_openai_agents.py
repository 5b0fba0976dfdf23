"""openai-agents (PyPI), run in its own venv: the function tools its MCP servers become, invoked as the Agents SDK
invokes them for a model (errors through its default failure function, which the model then reads)."""

from __future__ import annotations

import json
from typing import Any

from agents import Agent
from agents.mcp import MCPServerStdio, MCPServerStreamableHttp, MCPUtil
from agents.run_context import RunContextWrapper
from agents.tool_context import ToolContext
from harness import Report, main


def _text(output: Any) -> str:
    if isinstance(output, list):
        return "\n".join(_text(item) for item in output)
    if isinstance(output, dict):
        return str(output.get("text", json.dumps(output)))
    return str(output)


async def exercise(scenario: dict[str, Any], report: Report) -> None:
    target = scenario["target"]
    server: Any
    if "url" in target:
        server = MCPServerStreamableHttp({"url": target["url"], "headers": target.get("headers") or {}}, name="gw")
    else:
        params = {"command": target["command"], "args": target["args"], "env": target["env"]}
        server = MCPServerStdio(params, name="gw")  # type: ignore[arg-type]
    async with server:
        report.connected = True
        tools = await MCPUtil.get_function_tools(server, False, RunContextWrapper(context=None), Agent(name="matrix"))
        by_name = {tool.name: tool for tool in tools}
        report.tools = list(by_name)
        for index, (name, arguments) in enumerate(scenario["script"]):
            payload = json.dumps(arguments)
            context = ToolContext(context=None, tool_name=name, tool_call_id=f"call_{index}", tool_arguments=payload)
            output = await by_name[name].on_invoke_tool(context, payload)  # type: ignore[attr-defined]
            report.read(name, _text(output), None)  # the model gets text only, no error flag


if __name__ == "__main__":
    main("openai-agents", exercise)
