"""The handshake is answered at once, never held by a downstream that is still starting.

`gateway serve --stdio` in front of one stdio server that does not start until the test lets it (its shell waits for a
file to appear, then execs tests/fixtures/conformance_server.py, which offers tools, prompts, resources and
completions). The client's `initialize` is answered while that server is certainly still starting: it offers every
capability the server may bring (not knowing yet what it will); a list it asks for meanwhile is answered after a bounded
wait without that server, and once the server is let go the client, holding that list, is told it changed
(`notifications/tools/list_changed`). A client that never listed is not told: it holds nothing stale. Before, the first
handshake waited (up to 10 s) for every backend's first outcome, and a server still starting then was offered as tools
only.
"""

from __future__ import annotations

import contextlib
import json
import os
import shlex
import signal
from pathlib import Path
from typing import Any

import anyio
import pytest
from anyio.abc import Process

from tests.fixtures.gateway_proc import FIXTURES, PYTHON, one_backend_config

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

INIT = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}


class _Lines:
    """The JSON-RPC messages a process writes on stdout, one a line."""

    def __init__(self, process: Process) -> None:
        assert process.stdout is not None
        self._stdout = process.stdout
        self._buffer = b""

    async def next(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            self._buffer += await self._stdout.receive()
        line, _, self._buffer = self._buffer.partition(b"\n")
        message: dict[str, Any] = json.loads(line)
        return message


async def _send(process: Process, *messages: dict[str, Any]) -> None:
    assert process.stdin is not None
    await process.stdin.send(b"".join(json.dumps(m).encode() + b"\n" for m in messages))


async def test_initialize_is_answered_while_a_downstream_is_still_starting_and_its_tools_follow(
    tmp_path: Path,
) -> None:
    go = tmp_path / "go"
    fixture = shlex.join([PYTHON, str(FIXTURES / "conformance_server.py"), "--stdio"])
    wait_then_run = f"while [ ! -e {shlex.quote(str(go))} ]; do sleep 0.05; done; exec {fixture}"
    config = tmp_path / "federation.yaml"
    config.write_text(
        one_backend_config("startup", "late", transport="stdio", command="sh", args=["-c", wait_then_run])
    )
    process = await anyio.open_process(
        [PYTHON, "-m", "gateway", "serve", "--stdio", "-c", str(config)], cwd=tmp_path, start_new_session=True
    )
    lines = _Lines(process)
    try:
        with anyio.fail_after(30):
            await _send(process, {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": INIT})
            answer = await lines.next()
            assert not go.exists()  # the downstream cannot have started: the handshake did not wait for it
            capabilities = answer["result"]["capabilities"]
            # What the server will offer is not known yet: everything it may bring is offered.
            assert capabilities["tools"] == {"listChanged": True}, answer
            assert capabilities["prompts"] == {"listChanged": True}, answer
            assert capabilities["resources"] == {"subscribe": True, "listChanged": True}, answer
            assert capabilities["completions"] == {}, answer
            await _send(
                process,
                {"jsonrpc": "2.0", "method": "notifications/initialized"},
                {"jsonrpc": "2.0", "id": 2, "method": "ping"},
            )
            assert await lines.next() == {"jsonrpc": "2.0", "id": 2, "result": {}}
            # A list waits for the backends' first outcomes, bounded (STARTUP_WAIT_S): answered without the server.
            await _send(process, {"jsonrpc": "2.0", "id": 3, "method": "tools/list"})
            assert (await lines.next()) == {"jsonrpc": "2.0", "id": 3, "result": {"tools": []}}
            go.touch()  # the downstream starts now; the client holds a list without its tools: told they changed
            assert (await lines.next()).get("method") == "notifications/tools/list_changed"
            await _send(process, {"jsonrpc": "2.0", "id": 4, "method": "tools/list"})
            listed = await lines.next()
            assert listed["id"] == 4 and listed["result"]["tools"], listed
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        await process.aclose()
