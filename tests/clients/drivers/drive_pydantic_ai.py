"""pydantic-ai (PyPI ``pydantic-ai-slim[mcp]``), run in its own venv: an Agent with an ``MCPToolset`` and a scripted
``FunctionModel`` (pydantic-ai's own test model) that asks for the scenario's calls and reads what the agent hands it
back: a tool return, or a retry prompt carrying the error."""

from __future__ import annotations

from typing import Any

from fastmcp.client.transports import StdioTransport
from harness import Report, main
from pydantic_ai import Agent
from pydantic_ai.mcp import MCPToolset
from pydantic_ai.messages import ModelMessage, ModelResponse, RetryPromptPart, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel


def _answers(messages: list[ModelMessage]) -> list[ToolReturnPart | RetryPromptPart]:
    return [
        part
        for message in messages
        for part in getattr(message, "parts", [])
        if isinstance(part, ToolReturnPart | RetryPromptPart)
    ]


async def exercise(scenario: dict[str, Any], report: Report) -> None:
    target = scenario["target"]
    script = scenario["script"]
    if "url" in target:
        toolset: MCPToolset[Any] = MCPToolset(target["url"], headers=target.get("headers") or {})
    else:
        # init_timeout: the default 5 s is shorter than the gateway's stdio start on a loaded 2-core machine
        # (3.7-5.7 s measured: importing the gateway, then each backend's first outcome); docs/clients.md says so.
        transport = StdioTransport(command=target["command"], args=target["args"], env=target["env"])
        toolset = MCPToolset(transport, init_timeout=30)

    def model(messages: list[ModelMessage], info: AgentInfo) -> ModelResponse:
        report.tools = [tool.name for tool in info.function_tools]
        done = len(_answers(messages))
        if done < len(script):
            name, arguments = script[done]
            return ModelResponse(parts=[ToolCallPart(name, arguments)])
        return ModelResponse(parts=[TextPart("done")])

    agent = Agent(FunctionModel(model), toolsets=[toolset])
    async with agent:
        report.connected = True
        result = await agent.run("use the tools")
    for part in _answers(result.all_messages()):
        if isinstance(part, ToolReturnPart):
            report.read(part.tool_name, part.model_response_str(), None)  # an isError result can come back as a return
        else:
            report.read(str(part.tool_name), part.model_response(), True)


if __name__ == "__main__":
    main("pydantic-ai-slim", exercise)
