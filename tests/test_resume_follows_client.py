"""SEP-1699 polling through the gateway: the downstream's stream is resumed when the gateway's client resumes.

Real processes: tests/fixtures/conformance_server.py with `--reference-polling` (as the conformance repository's
reference server: `test_reconnection` closes its stream, tells clients to wait 5 s before resuming, and loses its
result unless the stream is resumed within 300 ms of the close) and the gateway (`python -m gateway serve`) in front
of it. A client that resumes at once gets the result directly; through the gateway it must too, long before the
downstream's 5 s: the gateway resumes the downstream as soon as its own client resumes, never sooner.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from typing import Any

import anyio
import httpx2
import pytest

from tests.fixtures.gateway_proc import run_gateway
from tests.fixtures.procs import RunningServer, conformance_server_argv, free_port, start_http_server

pytestmark = pytest.mark.anyio

RESULT_WITHIN_S = 2.0
"""The bound on a resumed call's result: well under the downstream's 5 s `retry`."""
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
DONE = "Reconnection test completed successfully"


@pytest.fixture(scope="module")
def polling() -> Iterator[RunningServer]:
    port = free_port()
    with start_http_server(conformance_server_argv(port, "--reference-polling"), port) as server:
        yield server


@pytest.fixture(scope="module")
def gateway(polling: RunningServer, tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    config = f"""
gateway:
  audit: {{enabled: false}}
servers:
  conf:
    transport: streamable_http
    url: {polling.url()}
    timeout_s: 10
"""
    with run_gateway(config, tmp_path_factory.mktemp("resume")) as server:
        yield server


async def _call_and_resume(url: str, *, resume_after_s: float = 0.0) -> tuple[dict[str, Any] | None, float]:
    """Call `test_reconnection` with a raw client that resumes the closed stream after `resume_after_s`: the result
    (None when the resumed stream stays silent for `RESULT_WITHIN_S`), and the seconds from the close to it."""
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10)) as http:
        opened = await http.post(
            url, headers=HEADERS, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
        )
        session = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "test_reconnection"}}
        with anyio.fail_after(10):
            first = await http.post(url, headers=session, json=call)
        closed = time.monotonic()
        events = _sse(first.text)
        assert events and not any('"id":2' in event["data"] for event in events)  # closed before the result
        await anyio.sleep(resume_after_s)  # the client's own pace, not a synchronisation
        resume = {**session, "last-event-id": events[-1]["id"]}
        with anyio.move_on_after(RESULT_WITHIN_S):
            async with http.stream("GET", url, headers=resume) as resumed:
                async for line in resumed.aiter_lines():
                    if line.startswith("data:") and '"id":2' in line:
                        return json.loads(line.removeprefix("data:")), time.monotonic() - closed
    return None, time.monotonic() - closed


async def test_the_reference_like_server_keeps_the_result_only_for_a_prompt_resume(polling: RunningServer) -> None:
    """The fixture is the faithful stand-in: directly, a resume at once gets the result, a late one does not."""
    result, _ = await _call_and_resume(polling.url())
    assert result is not None and result["result"]["content"][0]["text"].startswith(DONE)
    late, _ = await _call_and_resume(polling.url(), resume_after_s=0.5)
    assert late is None


def _sse(text: str) -> list[dict[str, str]]:
    events = []
    for block in text.replace("\r\n", "\n").split("\n\n"):
        fields: dict[str, str] = {}
        for line in block.splitlines():
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        if "id" in fields:
            fields.setdefault("data", "")
            events.append(fields)
    return events
