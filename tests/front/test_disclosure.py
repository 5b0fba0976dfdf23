"""What leaves the gateway is scrubbed of its secrets at one point: a backend's reason quoting a registered secret, and
a server URL's password taken from ``${VAR}``, reach no caller, whatever way out they take (``find_tools`` results,
``/status``, ``/ui``, the log). Over a real gateway process with a real adapter whose probe quotes its API key and a
real HTTP server entry whose URL carries a password."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx2
import pytest

from tests.fixtures import FIXTURES
from tests.fixtures.gateway_proc import PYTHON, echo_argv, first_text, mcp_session, run_gateway
from tests.fixtures.procs import free_port
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

FAKE_CLI = str(FIXTURES / "fake_cli.py")
TOKEN = "tok-alice-disclosure"
API_KEY = "sk-live-0123456789abcdef"
PASSWORD = "hunter2-in-the-url"


def config(port: int) -> str:
    probe = [FAKE_CLI, "exit", "1", "", f"401 Unauthorized: invalid api key {API_KEY}"]
    tool = {"description": "Ask the model a question.", "argv": [FAKE_CLI, "echo", "{q}"]}
    tool["input_schema"] = {"type": "object", "properties": {"q": {"type": "string"}}}  # type: ignore[assignment]
    return f"""
gateway:
  audit: {{enabled: false}}
exposure: {{mode: search}}
servers:
  remote:
    transport: streamable_http
    url: "http://alice:${{REMOTE_PASSWORD}}@127.0.0.1:{port}/mcp"
    connect_timeout_s: 2
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv("--stdio")[1:])}
adapters:
  ask:
    command: {PYTHON}
    env: {{OPENAI_API_KEY: "${{OPENAI_API_KEY}}"}}
    probe: {json.dumps(probe)}
    tools:
      ask_question: {json.dumps(tool)}
routes:
  ask_anything: [ask/ask_question, e/echo]   # published while e serves; find_tools names each provider's health
"""


async def test_a_secret_in_a_reason_or_a_url_reaches_no_caller_by_any_way_out(tmp_path: Path) -> None:
    env = {"REMOTE_PASSWORD": PASSWORD, "OPENAI_API_KEY": API_KEY}
    with run_gateway(config(free_port()), tmp_path, tokens=f"alice={TOKEN}", env=env) as gw:
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx2.AsyncClient(headers=headers, timeout=10) as http:

            async def both_failed() -> bool:
                status = (await http.get(gw.url("/status"))).json()
                states = {b["name"]: b["state"] for b in status["backends"]}
                return states == {"remote": "failed", "e": "ready", "ask": "failed"}

            await eventually(both_failed, within=20)
            status = (await http.get(gw.url("/status"))).text
            page = (await http.get(gw.url("/ui/"))).text
        with anyio.fail_after(20):
            async with mcp_session(gw.url(), token=TOKEN) as session:
                found = first_text(
                    await session.call_tool("find_tools", {"query": "ask anything", "include_unavailable": True})
                )
        log = gw.output()
    assert "ask_anything" in found, found
    assert "[redacted]" in found, found  # the reason is there, scrubbed
    assert "[redacted]" in status
    for where, text in {"find_tools": found, "/status": status, "/ui": page, "the log": log}.items():
        assert API_KEY not in text, where
        assert PASSWORD not in text, where
