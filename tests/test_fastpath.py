"""The direct path (gateway/backends/fastpath.py) keeps every promise of the SDK path it replaces.

A handshake-era ``tools/call`` routed to a ready streamable HTTP server on its shared session is sent straight on
that session as one JSON-RPC POST. Real processes: the gateway (``python -m gateway serve``, audit ledger on) in
front of tests/fixtures/fidelity_server.py and tests/fixtures/echo_server.py over streamable HTTP, both of which
print the id of every ``tools/call`` they receive; the direct path's ids are strings (``gw-N``), the SDK session's
integers, so each test first shows the call took the direct path, then that the promise held: the audit row is
committed before the answer leaves, the ``_meta`` entry is added, progress is relayed, a cancelled call and a
timed-out one are cancelled downstream, a downstream's elicitation and sampling reach the client (and its giving up
reaches the client too), a log message sent during the call reaches its client, and an oversized answer fails that
call alone. tests/test_fidelity.py runs the same promises through the same path (its ``h`` server) against a direct
client, with stream resumption (SEP-1699) besides.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.client.session import ClientRequestContext
from mcp.shared.exceptions import MCPError

from gateway.audit import query
from gateway.router import META_KEY
from tests.fixtures.gateway_proc import (
    FIXTURES,
    PYTHON,
    call_abandoning_sampling,
    echo_argv,
    first_text,
    mcp_session,
    run_gateway,
)
from tests.fixtures.procs import RunningServer, free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.anyio

FIDELITY = str(FIXTURES / "fidelity_server.py")
WAIT = 10  # seconds: the bound on every wait for something another process sends
LIMIT = 4096  # the echo server's max_answer_bytes


@pytest.fixture(scope="module")
def fid_http() -> Iterator[RunningServer]:
    port = free_port()
    with start_http_server([PYTHON, FIDELITY, "--http", str(port), "--name", "h"], port) as server:
        yield server


@pytest.fixture(scope="module")
def echo_http() -> Iterator[RunningServer]:
    port = free_port()
    env = {**os.environ, "ECHO_LOG_IDS": "1"}
    with start_http_server(echo_argv("--http", str(port)), port, env=env) as server:
        yield server


@pytest.fixture(scope="module")
def ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fastpath-ledger") / "audit.db"


@pytest.fixture(scope="module")
def gateway(
    fid_http: RunningServer, echo_http: RunningServer, ledger: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningServer]:
    config = f"""
gateway:
  audit: {{enabled: true, path: {json.dumps(str(ledger))}}}
  naming: {{mode: always}}
servers:
  h:
    transport: streamable_http
    url: {fid_http.url()}
    timeout_s: 10
  t:
    transport: streamable_http
    url: {fid_http.url()}
    timeout_s: 1
  e:
    transport: streamable_http
    url: {echo_http.url()}
    max_answer_bytes: {LIMIT}
"""
    with run_gateway(config, tmp_path_factory.mktemp("fastpath")) as server:
        yield server


def ids_of(server: RunningServer, tool: str) -> list[str]:
    """The ids of the ``tool`` calls ``server`` received so far, as it printed them (repr: 'gw-3' or 7)."""
    return re.findall(rf"tools/call {re.escape(tool)} id=(\S+)", server.output())


def direct_ids(server: RunningServer, tool: str) -> int:
    return sum(1 for found in ids_of(server, tool) if found.startswith("'gw-"))


async def test_the_ledger_row_is_committed_before_the_answer_and_the_answer_carries_the_meta_entry(
    gateway: RunningServer, echo_http: RunningServer, ledger: Path
) -> None:
    before = direct_ids(echo_http, "echo")
    async with mcp_session(gateway.url()) as session:
        for n in range(5):
            with anyio.fail_after(WAIT):
                result = await session.call_tool("e__echo", {"text": f"row {n}"})
            assert first_text(result) == f"row {n}" and result.structured_content == {
                "text": f"row {n}",
                "server": "echo",
            }
            assert result.meta is not None
            entry = result.meta[META_KEY]
            rows = {r.correlation_id: r for r in query(ledger, limit=None)}  # read at once: no wait, no retry
            assert entry["id"] in rows
            row = rows[entry["id"]]
            assert (row.tool, row.status) == ("e__echo", "ok")
            assert [(step.provider, step.outcome) for step in row.chain] == [("e/echo", "ok")]
    assert direct_ids(echo_http, "echo") == before + 5  # every one of them went the direct path


async def test_progress_reaches_the_client_under_its_own_token(gateway: RunningServer, fid_http: RunningServer) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    before = direct_ids(fid_http, "progress")
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(WAIT):
            result = await session.call_tool("h__progress", {"steps": 3}, progress_callback=on_progress)
    assert first_text(result) == "done"
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert direct_ids(fid_http, "progress") == before + 1


async def test_a_client_cancelling_its_call_cancels_it_downstream_and_the_row_says_cancelled(
    gateway: RunningServer, fid_http: RunningServer, ledger: Path
) -> None:
    cancelled = fid_http.output().count("cancelled sleep")
    before = direct_ids(fid_http, "sleep")
    async with mcp_session(gateway.url()) as session:
        with pytest.raises(MCPError):
            await session.call_tool("h__sleep", {"seconds": 60}, read_timeout_seconds=0.5)
        await eventually(lambda: fid_http.output().count("cancelled sleep") == cancelled + 1, within=WAIT)
        # The session goes on: the next call on it is answered.
        with anyio.fail_after(WAIT):
            assert first_text(await session.call_tool("h__progress", {"steps": 1})) == "done"
    assert direct_ids(fid_http, "sleep") == before + 1
    await eventually(lambda: any(r.status == "cancelled" and r.tool == "h__sleep" for r in query(ledger)), within=WAIT)


async def test_a_call_past_its_timeout_is_cancelled_downstream_and_answered_as_timed_out(
    gateway: RunningServer, fid_http: RunningServer, ledger: Path
) -> None:
    cancelled = fid_http.output().count("cancelled sleep")
    before = direct_ids(fid_http, "sleep")
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(WAIT):
            result = await session.call_tool("t__sleep", {"seconds": 30})
    assert direct_ids(fid_http, "sleep") == before + 1
    assert result.is_error
    assert "timed out after 1 s (cancellation sent downstream)" in first_text(result)
    await eventually(lambda: fid_http.output().count("cancelled sleep") == cancelled + 1, within=WAIT)
    correlation = result.meta[META_KEY]["id"] if result.meta else None
    assert {r.correlation_id: r.status for r in query(ledger, limit=None)}[correlation] == "timeout"


async def test_a_downstreams_elicitation_and_sampling_during_a_call_reach_the_client(
    gateway: RunningServer, fid_http: RunningServer
) -> None:
    async def elicitation(context: ClientRequestContext, params: types.ElicitRequestParams) -> Any:
        return types.ElicitResult(action="accept", content={"answer": f"yes to {params.message}"})

    async def sampling(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> Any:
        return types.CreateMessageResult(role="assistant", content=types.TextContent(text="hi"), model="m1")

    before = direct_ids(fid_http, "elicit_twice") + direct_ids(fid_http, "sample")
    async with mcp_session(gateway.url(), elicitation_callback=elicitation, sampling_callback=sampling) as session:
        with anyio.fail_after(WAIT):
            twice = await session.call_tool("h__elicit_twice", {"message": "go"})
            sampled = await session.call_tool("h__sample", {"prompt": "say hi"})
    assert first_text(twice) == 'twice: {"answer": "yes to go 1"} {"answer": "yes to go 2"}'
    assert first_text(sampled) == "sampled: hi (m1)"
    assert direct_ids(fid_http, "elicit_twice") + direct_ids(fid_http, "sample") == before + 2


async def test_a_downstream_giving_up_on_its_request_cancels_it_at_the_client(
    gateway: RunningServer, fid_http: RunningServer
) -> None:
    before = direct_ids(fid_http, "sample_abandon")
    result = await call_abandoning_sampling(gateway.url(), "h__sample_abandon", within=WAIT)
    assert first_text(result) == "gave up"
    assert direct_ids(fid_http, "sample_abandon") == before + 1


async def test_an_oversized_answer_fails_that_call_alone_naming_size_and_limit(
    gateway: RunningServer, echo_http: RunningServer
) -> None:
    before = direct_ids(echo_http, "echo")
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(WAIT):
            big = await session.call_tool("e__echo", {"text": "x" * (4 * LIMIT)})
            small = await session.call_tool("e__echo", {"text": "still here"})
    assert big.is_error
    assert f"over this server's max_answer_bytes of {LIMIT:,}" in first_text(big)
    assert first_text(small) == "still here"
    assert direct_ids(echo_http, "echo") == before + 2


async def test_a_log_message_sent_during_a_call_reaches_its_client(
    gateway: RunningServer, fid_http: RunningServer
) -> None:
    arrived: list[Any] = []
    got = anyio.Event()

    async def inbox(message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification):
            arrived.append(message.params.data)
            got.set()

    before = direct_ids(fid_http, "log")
    async with mcp_session(gateway.url(), message_handler=inbox) as session:
        with anyio.fail_after(WAIT):
            await session.call_tool("h__log", {"level": "error", "message": "in the call"})
            await got.wait()
    assert arrived == ["in the call"]
    assert direct_ids(fid_http, "log") == before + 1


async def test_the_direct_path_makes_the_sdks_client_span_under_the_step_in_the_calls_trace(
    echo_http: RunningServer, tmp_path: Path
) -> None:
    from tests.test_observability import _spans_in, _stop

    config = f"""
gateway:
  audit: {{enabled: false}}
  tracing: {{exporter: console, service_name: traced-gateway}}
servers:
  e:
    transport: streamable_http
    url: {echo_http.url()}
"""
    before = direct_ids(echo_http, "echo")
    with run_gateway(config, tmp_path) as traced:
        async with mcp_session(traced.url()) as session:
            with anyio.fail_after(WAIT):
                result = await session.call_tool("echo", {"text": "traced"})
        output = _stop(traced)
    assert first_text(result) == "traced" and direct_ids(echo_http, "echo") == before + 1
    by_name = {span["name"]: span for span in _spans_in(output)}
    call, step, send = by_name["tools/call echo"], by_name["step e/echo"], by_name["MCP send tools/call echo"]
    assert step["parent_id"] == call["context"]["span_id"]
    assert send["parent_id"] == step["context"]["span_id"]
    assert send["kind"] == "SpanKind.CLIENT" and send["attributes"]["mcp.method.name"] == "tools/call"
    assert send["context"]["trace_id"] == call["context"]["trace_id"]


async def test_an_answered_stream_is_read_to_its_end_so_no_async_generator_is_left_to_the_garbage_collector(
    echo_http: RunningServer,
) -> None:
    # An event iterator abandoned after the answer leaves its chain of async generators (httpx2's SSE, text and
    # byte iterators, the transport's streams) suspended; the garbage collector then finalizes each through
    # asyncio's hook, which wakes the loop through its self-pipe and spawns a task to close it: seven per call.
    import gc
    import sys

    import httpx2

    from gateway.backends.fastpath import HttpLane

    first_iter, finalizer = sys.get_asyncgen_hooks()
    assert finalizer is not None
    finalized: list[str] = []

    def counting(agen: Any) -> None:
        finalized.append(agen.__qualname__)
        finalizer(agen)

    async def ignore(_: Any) -> None:
        return None

    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    async with httpx2.AsyncClient(trust_env=False) as client:
        init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
        with anyio.fail_after(WAIT):
            answered = await client.post(echo_http.url(), json=init, headers=headers)
        lane = HttpLane(client, echo_http.url(), max_event_size=1 << 20)
        lane.session_id, lane.version = answered.headers["mcp-session-id"], "2025-06-18"
        done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        await client.post(echo_http.url(), json=done, headers=lane._headers())
        sys.set_asyncgen_hooks(first_iter, counting)
        try:
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as closer:  # its end waits for every answered stream's close
                    lane.closer = closer
                    for n in range(3):
                        result = await lane.request(
                            "tools/call",
                            {"name": "echo", "arguments": {"text": f"t{n}"}},
                            timeout_s=WAIT,
                            progress=None,
                            answer=ignore,
                            notify=ignore,
                        )
                        assert result["content"][0]["text"] == f"t{n}"
            gc.collect()
        finally:
            sys.set_asyncgen_hooks(first_iter, finalizer)
    assert finalized == []
