"""An adapter's probes never hold a client's handshake: its tools come from the file, so it reports ready once its
command is found, and its probes answer later (they decide its rungs, or fail it).

Real parts: ``gateway serve --stdio`` spawned by the SDK's stdio client, as Claude Code or pydantic-ai spawn it, with
one adapter whose health probe and variant probe are a real program (tests/fixtures/fake_cli.py ``gate``) that
runs until the test releases it: the handshake and the list are answered while both probes are still running.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import anyio
import pytest
from mcp.client.session import ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client

from tests.fixtures.gateway_proc import FIXTURES, PYTHON

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

FAKE_CLI = str(FIXTURES / "fake_cli.py")


def _config(gate: Path) -> str:
    probe = [FAKE_CLI, "gate", str(gate)]
    return f"""
gateway:
  name: probes-later
  audit: {{enabled: false}}
adapters:
  slow:
    command: {PYTHON}
    probe: {json.dumps(probe)}
    tools:
      say:
        argv: [{json.dumps(FAKE_CLI)}, echo, "{{text}}"]
        input_schema: {{type: object, required: [text], properties: {{text: {{type: string}}}}}}
        output: json_array
      find:
        input_schema: {{type: object, properties: {{mode: {{enum: [fast, full], default: full}}}}}}
        switch: mode
        variants:
          fast: {{argv: [{json.dumps(FAKE_CLI)}, echo, fast]}}
          full:
            argv: [{json.dumps(FAKE_CLI)}, echo, full]
            probe: {{argv: {json.dumps(probe)}, timeout_s: 60, unready_when: ["cannot run"]}}
        ladder: {{full: fast}}
        output: json_array
"""


async def test_the_stdio_handshake_and_list_are_answered_while_the_adapters_probes_still_run(tmp_path: Path) -> None:
    gate = tmp_path / "gate"
    gate.mkdir()
    config = tmp_path / "federation.yaml"
    config.write_text(_config(gate))
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "gateway", "serve", "--stdio", "-c", str(config)],
        env={**os.environ},
        cwd=tmp_path,
    )
    with anyio.fail_after(60):
        async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            listed = {tool.name for tool in (await session.list_tools()).tools}  # no probe can have answered yet
            assert listed == {"say", "find"}
            (gate / "release").touch()  # the probes answer now: the adapter is ready, both variants too
            said = await session.call_tool("say", {"text": "hi"})
            found = await session.call_tool("find", {})
    assert not said.is_error and json.loads(said.content[0].text) == ["hi"]  # type: ignore[union-attr]
    assert not found.is_error and json.loads(found.content[0].text) == ["full"]  # type: ignore[union-attr]
    call = (found.meta or {})["mcp-gateway/call"]
    assert (call["status"], call["served_by"], call["variant"]) == ("ok", "slow/find", "full")
