"""A downstream's request on a shared stdio session, where nothing ties it to one of the calls in flight: it reaches
the one call that is not already waiting for its own client's answer, and is refused at once (no hang, nobody else's
client asked) when several could have caused it. Real processes: tests/fixtures/fidelity_server.py over stdio behind
a real ``gateway serve``, and SDK client sessions in the handshake era."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientRequestContext

from tests.fixtures.gateway_proc import FIDELITY, PYTHON, answer_sampling, first_text, mcp_session, run_gateway
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

WAIT = 20


def _config(notes: Path) -> str:
    server = {"transport": "stdio", "command": PYTHON, "args": [FIDELITY, "--stdio", "--name", "s"], "timeout_s": 20}
    server["env"] = {"FIXTURE_NOTES": str(notes)}
    return f"gateway:\n  audit: {{enabled: false}}\nservers:\n  s: {json.dumps(server)}\n"


async def test_a_call_waiting_for_its_clients_answer_is_not_the_one_asking_again(tmp_path: Path) -> None:
    second: dict[str, str] = {}
    with run_gateway(_config(tmp_path / "notes"), tmp_path) as gateway:

        async def first_answers_after_a_second_call(context: ClientRequestContext, params: Any) -> Any:
            async with mcp_session(gateway.url(), sampling_callback=answer_sampling("the second's")) as other:
                second["text"] = first_text(await other.call_tool("sample", {"prompt": "me too"}))
            return types.CreateMessageResult(role="assistant", content=types.TextContent(text="first"), model="m")

        async with mcp_session(gateway.url(), sampling_callback=first_answers_after_a_second_call) as session:
            with anyio.fail_after(WAIT * 2):
                first = first_text(await session.call_tool("sample", {"prompt": "first"}))
    assert first == "sampled: first (m)"
    assert second["text"] == "sampled: the second's (test-model)"


async def test_an_ambiguous_request_on_a_shared_stdio_session_is_refused_at_once(tmp_path: Path) -> None:
    notes = tmp_path / "notes"
    with run_gateway(_config(notes), tmp_path) as gateway:
        async with mcp_session(gateway.url()) as sleeper, anyio.create_task_group() as tg:
            tg.start_soon(sleeper.call_tool, "sleep", {"seconds": 60})  # in flight, asking nothing
            await eventually(lambda: notes.exists() and "tools/call sleep" in notes.read_text(), within=WAIT)
            async with mcp_session(gateway.url(), sampling_callback=answer_sampling("never used")) as other:
                with anyio.fail_after(WAIT):
                    text = first_text(await other.call_tool("sample", {"prompt": "which?"}))
            tg.cancel_scope.cancel()
    assert text.startswith("sample failed:") and "2 calls from clients are in flight" in text
