"""A degraded answer says so where the model reads it: no client gives the model ``_meta`` (Claude Code passes the
structured result, Gemini, LangChain and mcp-use the text, pydantic-ai the structured result), so one line ends the
content and the structured result carries it as ``degraded``.

Real parts: ``gateway serve`` as a process, routes whose first provider is a server that cannot start and whose
fallback is the echo fixture server over stdio.
"""

from __future__ import annotations

import json
from typing import Any

import anyio
import mcp_types as types
import pytest

from gateway.core.record import degradation_note
from gateway.ledger.records import AuditStep
from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session
from tests.fixtures.procs import RunningServer

pytestmark = pytest.mark.anyio

CONFIG = f"""
gateway:
  name: degraded
  audit: {{enabled: false}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv("--stdio")[1:])}
    tools: {{include: []}}
  down:
    transport: stdio
    command: definitely-not-a-command-xyz
routes:
  say: [down/echo, e/echo]
  sum: [down/add, e/add]
  direct: [e/echo]
"""
NOTE = (
    "[gateway] Degraded answer: down/echo could not serve this call (unavailable: command not found: "
    "definitely-not-a-command-xyz); e/echo answered instead."
)


@pytest.fixture
def gateway(gateway_process: Any) -> RunningServer:
    served: RunningServer = gateway_process(CONFIG)
    return served


def _texts(result: types.CallToolResult) -> list[str]:
    return [block.text for block in result.content if isinstance(block, types.TextContent)]


async def test_a_degraded_answer_ends_with_one_line_saying_so_and_carries_it_in_its_structured_result(
    gateway: RunningServer,
) -> None:
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(30):
            said = await session.call_tool("say", {"text": "hello"})
            summed = await session.call_tool("sum", {"a": 2, "b": 3})
    assert (said.meta or {})["mcp-gateway/call"]["status"] == "degraded"
    assert not said.is_error and _texts(said) == ["hello", NOTE]
    assert said.structured_content == {"text": "hello", "server": "echo", "degraded": NOTE}
    assert _texts(summed) == ["5", NOTE.replace("echo", "add")]  # the output schema leaves room for the field
    assert summed.structured_content == {"sum": 5, "degraded": NOTE.replace("echo", "add")}


async def test_an_answer_that_was_not_degraded_carries_no_note(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(30):
            direct = await session.call_tool("direct", {"text": "hello"})
    assert (direct.meta or {})["mcp-gateway/call"]["status"] == "ok"
    assert _texts(direct) == ["hello"]
    assert direct.structured_content == {"text": "hello", "server": "echo"}


def test_the_note_names_the_first_step_that_failed_cut_short_and_counts_the_others() -> None:
    reason = "variant vector is not ready: " + "x" * 300
    steps = [
        AuditStep("qmd/files_search", "deep", "not_ready", reason, 0.1),
        AuditStep("qmd/files_search", "vector", "not_ready", reason, 0.1),
        AuditStep("wiki/wiki_hybrid_search", None, "ok", None, 12.0),
    ]
    note = degradation_note(steps)
    assert note is not None and len(note) < 250
    assert note.startswith("[gateway] Degraded answer: qmd/files_search [deep] could not serve this call (not_ready: ")
    assert note.endswith("…) (and 1 more step); wiki/wiki_hybrid_search answered instead.")
    assert degradation_note(steps[-1:]) is None
