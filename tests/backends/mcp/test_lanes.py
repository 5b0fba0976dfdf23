"""A server's sessions of its own per client (``session: per_client``): a client whose own session cannot be opened
is told why on its call, and is never put on the session every other client shares (where the server's requests to
it could reach another client, or nobody).

Real processes: the gateway in front of tests/fixtures/fidelity_server.py over stdio, started with ``--once`` so that
the shared session's process is the only one that starts; every later start (a client's own session) exits saying so.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from tests.fixtures.gateway_proc import FIDELITY, PYTHON, answer_sampling, first_text, mcp_session, run_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

WAIT = 20  # seconds: the bound on a call that starts a process and is answered


async def test_a_client_whose_own_session_cannot_open_is_told_why_and_never_shares(tmp_path: Path) -> None:
    marker = tmp_path / "started"
    server = {
        "transport": "stdio",
        "command": PYTHON,
        "args": [FIDELITY, "--stdio", "--name", "p", "--once", str(marker)],
        "session": "per_client",
        "timeout_s": 10,
    }
    config = f"gateway:\n  audit: {{enabled: false}}\nservers:\n  p: {json.dumps(server)}\n"
    with run_gateway(config, tmp_path) as gateway:
        with anyio.fail_after(WAIT):
            async with mcp_session(gateway.url()) as plain:
                shared = first_text(await plain.call_tool("pid", {}))  # a client that cannot be asked shares
                async with mcp_session(gateway.url(), sampling_callback=answer_sampling("x")) as capable:
                    result = await capable.call_tool("sample", {"prompt": "hello"})
                    again = await capable.call_tool("pid", {})  # tries to open it again, and is told again
                assert first_text(await plain.call_tool("pid", {})) == shared  # the shared session is unharmed
    for answer in (result, again):
        assert answer.is_error
        text = first_text(answer)
        assert "no session of its own for this client" in text
        assert "runs once only" in text  # the process's own last words
        assert shared not in text
