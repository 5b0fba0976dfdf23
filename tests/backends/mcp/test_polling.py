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
from typing import Any

import anyio
import httpx2
import pytest

from gateway.backends.mcp.polling import HeldRetries, HeldRetry, resume_key
from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import GatewayProcesses
from tests.fixtures.procs import RunningServer
from tests.fixtures.raw_http import sse_events

pytestmark = pytest.mark.anyio

RESULT_WITHIN_S = 2.0
"""The bound on a resumed call's result: well under the downstream's 5 s `retry`."""
HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
DONE = "Reconnection test completed successfully"


@pytest.fixture(scope="module")
def polling(downstream: Downstreams) -> Downstream:
    return downstream("conformance", "streamable_http", "--reference-polling")


@pytest.fixture(scope="module")
def gateway(polling: Downstream, gateway_process: GatewayProcesses) -> RunningServer:
    config = f"""
gateway:
  audit: {{enabled: false}}
servers:
  conf:
    transport: streamable_http
    url: {polling.url()}
    timeout_s: 10
"""
    return gateway_process(config)


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
        events = sse_events(first.text)
        assert events and not any('"id":2' in event["data"] for event in events)  # closed before the result
        await anyio.sleep(resume_after_s)  # the client's own pace, not a synchronisation
        resume = {**session, "last-event-id": events[-1]["id"]}
        with anyio.move_on_after(RESULT_WITHIN_S):
            async with http.stream("GET", url, headers=resume) as resumed:
                async for line in resumed.aiter_lines():
                    if line.startswith("data:") and '"id":2' in line:
                        return json.loads(line.removeprefix("data:")), time.monotonic() - closed
    return None, time.monotonic() - closed


async def test_the_reference_like_server_keeps_the_result_only_for_a_prompt_resume(polling: Downstream) -> None:
    """The fixture is the faithful stand-in: directly, a resume at once gets the result, a late one does not."""
    result, _ = await _call_and_resume(polling.url())
    assert result is not None and result["result"]["content"][0]["text"].startswith(DONE)
    late, _ = await _call_and_resume(polling.url(), resume_after_s=0.5)
    assert late is None


async def test_a_client_resuming_at_once_through_the_gateway_gets_the_result(gateway: RunningServer) -> None:
    result, seconds = await _call_and_resume(gateway.url())
    assert result is not None and result["result"]["content"][0]["text"].startswith(DONE)
    assert seconds < RESULT_WITHIN_S  # not after the downstream's 5 s retry


async def test_the_gateway_resumes_the_downstream_no_sooner_than_its_client(gateway: RunningServer) -> None:
    """A client that resumes late loses the result through the gateway as it does directly: had the gateway resumed
    the downstream at once on its own, the result would wait in the gateway's event store for the late resume."""
    late, _ = await _call_and_resume(gateway.url(), resume_after_s=0.5)
    assert late is None


async def test_a_session_cannot_resume_another_sessions_stream(gateway: RunningServer) -> None:
    """Every session numbers its requests from 1 and the SDK names a request's stream by its id: session B asking to
    resume from an event of session A's request 2 must get nothing of A's, and its own stream 2 only its own."""
    url = gateway.url()
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(10)) as http:
        a, b = await _open(http, url), await _open(http, url)

        def call(token: str) -> dict[str, Any]:  # with progress: answered on a stream, which a client may resume
            params = {"name": "test_tool_with_progress", "_meta": {"progressToken": token}}
            return {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}

        with anyio.fail_after(10):
            mine = sse_events((await http.post(url, headers=b, json=call("b"))).text)
            theirs = sse_events((await http.post(url, headers=a, json=call("a"))).text)
            replayed = {}
            for start in (theirs[0]["id"], mine[0]["id"]):  # A's priming event, then B's own
                replayed[start] = []
                async with http.stream("GET", url, headers={**b, "last-event-id": start}) as resumed:
                    async for line in resumed.aiter_lines():
                        message = json.loads(line[5:]) if line.startswith("data:") and line[5:].strip() else {}
                        replayed[start] += [message["params"]["progressToken"]] if "params" in message else []
                        if "result" in message:
                            replayed[start].append(message["id"])
                            break  # B's own replay stays open for what its stream sends next
    assert replayed[theirs[0]["id"]] == []
    assert replayed[mine[0]["id"]] == ["b", "b", "b", 2]  # its three progress notifications, then its answer


async def _open(http: httpx2.AsyncClient, url: str) -> dict[str, str]:
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    opened = await http.post(
        url, headers=HEADERS, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
    )
    session = {**HEADERS, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
    await http.post(url, headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
    return session


class _Chunks(httpx2.AsyncByteStream):
    def __init__(self, chunks: list[bytes]) -> None:
        self._chunks = chunks

    async def __aiter__(self) -> Any:
        for chunk in self._chunks:
            yield chunk


async def test_the_downstreams_retry_is_zeroed_and_held_for_the_resume_whatever_the_chunking() -> None:
    """The SDK is handed `retry: 0` (it resumes at once) and the pool keeps the 5000 ms for the resume from the last
    event id the SDK saw; every other byte passes unchanged, a long data line without being held back."""
    big = b"data: " + b"x" * 5000
    body = b"id: 7\r\nretry: 5000\r\ndata:\r\n\r\nid: 8\ndata: {}\n\n" + big + b"\n\nid: 9\ndata:"
    request = httpx2.Request("POST", "http://127.0.0.1:1/mcp", headers={"mcp-session-id": "abc"})
    for size in (1, 3, 7, 64, 4096, len(body)):
        held = HeldRetries()
        chunks = [body[i : i + size] for i in range(0, len(body), size)]
        out = b"".join([chunk async for chunk in HeldRetry(_Chunks(chunks), request, held, None)])
        assert out == body.replace(b"retry: 5000", b"retry: 0"), size
        assert held.get(resume_key(request, "8")) == 5000, size  # event 9 was never dispatched
        assert held.get(resume_key(request, "9")) is None


async def test_a_stream_read_only_to_its_answer_leaves_nothing_held() -> None:
    body = [b"id: 1\nretry: 5000\ndata:\n\n", b'id: 2\ndata: {"result": {}}\n\n', b"id: 3\n\n"]
    request = httpx2.Request("POST", "http://127.0.0.1:1/mcp")
    held = HeldRetries()
    stream = HeldRetry(_Chunks(body), request, held, None)
    reading = stream.__aiter__()
    await reading.__anext__()
    await reading.__anext__()
    await reading.aclose()  # type: ignore[attr-defined]
    assert held.get(resume_key(request, "2")) is None and held.get(resume_key(request, "1")) is None
