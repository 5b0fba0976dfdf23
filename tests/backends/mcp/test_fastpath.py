"""The direct path (gateway/backends/fastpath.py) keeps every promise of the SDK path it replaces, over both lanes.

A handshake-era ``tools/call`` routed to a ready server on its shared session is sent straight on that session: to
a streamable HTTP server as one JSON-RPC POST (``HttpLane``), to a stdio server as a line written onto its stdin
whose answer the transport's reader takes off stdout (stdio.py ``StdioLane``). Real processes: the gateway
(``python -m gateway serve``, audit ledger on) in front of tests/fixtures/fidelity_server.py and
tests/fixtures/echo_server.py, over streamable HTTP and over stdio, all of which note the id of every ``tools/call``
they receive (an HTTP server on its stderr, a stdio server in its ``FIXTURE_NOTES`` file, since its stderr is the
gateway's). The direct path's ids are strings (``gw-N``), the SDK session's integers, so each test runs once per
lane and first shows the call took the direct path, then that the promise held: the audit row is committed before
the answer leaves, the ``_meta`` entry is added, answers of calls in flight together reach their own callers,
progress is relayed, a cancelled call and a timed-out one are cancelled downstream, a downstream's elicitation and
sampling reach the client (and its giving up reaches the client too), a log message sent during the call reaches
its client, an oversized answer fails that call alone, and the SDK's client span is made; over stdio, a crash
mid-call fails that call and the server comes back. tests/test_fidelity.py runs the same promises through the same
paths (its ``h`` and ``s`` servers) against a direct client, with stream resumption (SEP-1699) besides.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from gateway.core.router import META_KEY
from gateway.ledger.engines import open_reader
from tests.fixtures.downstreams import Downstream as Served
from tests.fixtures.downstreams import Downstreams
from tests.fixtures.gateway_proc import (
    FIDELITY,
    PYTHON,
    GatewayProcesses,
    answer_elicitation,
    answer_sampling,
    call_abandoning_sampling,
    echo_argv,
    first_text,
    mcp_session,
    run_gateway,
)
from tests.fixtures.procs import RunningServer
from tests.fixtures.turns import Handed
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.anyio

WAIT = 10  # seconds: the bound on every wait for something another process sends
LIMIT = 4096  # the echo servers' max_answer_bytes


@dataclass(frozen=True)
class Downstream:
    """One downstream server as the tests see it: its name in the gateway, and what it noted so far."""

    name: str
    text: Callable[[], str]

    def ids(self, tool: str) -> list[str]:
        """The ids of the ``tool`` calls it received so far, as it noted them (repr: 'gw-3' or 7)."""
        return re.findall(rf"tools/call {re.escape(tool)} id=(\S+)", self.text())

    def direct(self, tool: str) -> int:
        return sum(1 for found in self.ids(tool) if found.startswith("'gw-"))

    def count(self, line: str) -> int:
        return self.text().count(line)


@dataclass(frozen=True)
class Lane:
    """The three servers of one lane: the fidelity server (timeout 10 s), the same with timeout 1 s, the echo."""

    fid: Downstream
    short: Downstream
    echo: Downstream


def _notes(path: Path) -> Callable[[], str]:
    return lambda: path.read_text() if path.exists() else ""


def _stdio(argv: list[str], notes: Path, **keys: Any) -> str:
    """A stdio server's entry in federation.yaml (its notes in ``notes``)."""
    env = {"FIXTURE_NOTES": str(notes), "ECHO_LOG_IDS": "1"}
    lines = ["transport: stdio", f"command: {json.dumps(argv[0])}", f"args: {json.dumps(argv[1:])}"]
    lines += [f"env: {json.dumps(env)}", *(f"{key}: {json.dumps(value)}" for key, value in keys.items())]
    return "".join(f"    {line}\n" for line in lines)


@pytest.fixture(scope="module")
def fid_http(downstream: Downstreams) -> Served:
    return downstream("fidelity", "streamable_http", "--name", "h", own=True)  # the tests read what it notes


@pytest.fixture(scope="module")
def echo_http(downstream: Downstreams) -> Served:
    return downstream("echo", "streamable_http", env={"ECHO_LOG_IDS": "1"}, own=True)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("fastpath")


@pytest.fixture(scope="module")
def ledger(folder: Path) -> Path:
    return folder / "audit.db"


@pytest.fixture(scope="module")
def gateway(
    fid_http: Served, echo_http: Served, folder: Path, ledger: Path, gateway_process: GatewayProcesses
) -> RunningServer:
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
  s:
{_stdio([PYTHON, FIDELITY, "--stdio", "--name", "s"], folder / "fidelity-notes.txt", timeout_s=10)}
  u:
{_stdio([PYTHON, FIDELITY, "--stdio", "--name", "u"], folder / "fidelity-notes.txt", timeout_s=1)}
  f:
{_stdio(echo_argv("--stdio"), folder / "echo-notes.txt", max_answer_bytes=LIMIT, min_uptime_s=0)}
"""
    return gateway_process(config, folder=folder)


@pytest.fixture(params=["http", "stdio"])
def lane(request: pytest.FixtureRequest, fid_http: Served, echo_http: Served, folder: Path) -> Lane:
    if request.param == "http":
        return Lane(
            Downstream("h", fid_http.output), Downstream("t", fid_http.output), Downstream("e", echo_http.output)
        )
    fid_notes = _notes(folder / "fidelity-notes.txt")
    return Lane(
        Downstream("s", fid_notes), Downstream("u", fid_notes), Downstream("f", _notes(folder / "echo-notes.txt"))
    )


async def test_the_ledger_row_is_committed_before_the_answer_and_the_answer_carries_the_meta_entry(
    gateway: RunningServer, lane: Lane, ledger: Path
) -> None:
    echo = lane.echo
    before = echo.direct("echo")
    async with mcp_session(gateway.url()) as session:
        for n in range(5):
            with anyio.fail_after(WAIT):
                result = await session.call_tool(f"{echo.name}__echo", {"text": f"row {n}"})
            assert first_text(result) == f"row {n}" and result.structured_content == {
                "text": f"row {n}",
                "server": "echo",
            }
            assert result.meta is not None
            entry = result.meta[META_KEY]
            rows = {
                r.correlation_id: r for r in open_reader(ledger).query(limit=None)
            }  # read at once: no wait, no retry
            assert entry["id"] in rows
            row = rows[entry["id"]]
            assert (row.tool, row.status) == (f"{echo.name}__echo", "ok")
            assert [(step.provider, step.outcome) for step in row.chain] == [(f"{echo.name}/echo", "ok")]
    assert echo.direct("echo") == before + 5  # every one of them went the direct path


async def test_answers_of_calls_in_flight_together_reach_their_own_callers(gateway: RunningServer, lane: Lane) -> None:
    echo = lane.echo
    before = echo.direct("echo")
    answers: dict[int, str] = {}

    async def call(session: Any, n: int) -> None:
        answers[n] = first_text(await session.call_tool(f"{echo.name}__echo", {"text": f"call {n}"}))

    async with mcp_session(gateway.url()) as one, mcp_session(gateway.url()) as two:
        with anyio.fail_after(WAIT):
            async with anyio.create_task_group() as tg:
                for n in range(24):
                    tg.start_soon(call, one if n % 2 else two, n)
    assert answers == {n: f"call {n}" for n in range(24)}
    assert echo.direct("echo") == before + 24


async def test_progress_reaches_the_client_under_its_own_token(gateway: RunningServer, lane: Lane) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    before = lane.fid.direct("progress")
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(WAIT):
            result = await session.call_tool(f"{lane.fid.name}__progress", {"steps": 3}, progress_callback=on_progress)
    assert first_text(result) == "done"
    assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]
    assert lane.fid.direct("progress") == before + 1


async def test_a_client_cancelling_its_call_cancels_it_downstream_and_the_row_says_cancelled(
    gateway: RunningServer, lane: Lane, ledger: Path
) -> None:
    fid = lane.fid
    cancelled = fid.count("cancelled sleep")
    before = fid.direct("sleep")
    async with mcp_session(gateway.url()) as session:
        with pytest.raises(MCPError):
            await session.call_tool(f"{fid.name}__sleep", {"seconds": 60}, read_timeout_seconds=0.5)
        await eventually(lambda: fid.count("cancelled sleep") == cancelled + 1, within=WAIT)
        # The session goes on: the next call on it is answered.
        with anyio.fail_after(WAIT):
            assert first_text(await session.call_tool(f"{fid.name}__progress", {"steps": 1})) == "done"
    assert fid.direct("sleep") == before + 1
    tool = f"{fid.name}__sleep"
    await eventually(
        lambda: any(r.status == "cancelled" and r.tool == tool for r in open_reader(ledger).query()), within=WAIT
    )


async def test_a_call_past_its_timeout_is_cancelled_downstream_and_answered_as_timed_out(
    gateway: RunningServer, lane: Lane, ledger: Path
) -> None:
    short = lane.short
    cancelled = short.count("cancelled sleep")
    before = short.direct("sleep")
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(WAIT):
            result = await session.call_tool(f"{short.name}__sleep", {"seconds": 30})
    assert short.direct("sleep") == before + 1
    assert result.is_error
    assert "timed out after 1 s (cancellation sent downstream)" in first_text(result)
    await eventually(lambda: short.count("cancelled sleep") == cancelled + 1, within=WAIT)
    correlation = result.meta[META_KEY]["id"] if result.meta else None
    assert {r.correlation_id: r.status for r in open_reader(ledger).query(limit=None)}[correlation] == "timeout"


async def test_a_downstreams_elicitation_and_sampling_during_a_call_reach_the_client(
    gateway: RunningServer, lane: Lane
) -> None:
    fid = lane.fid
    before = fid.direct("elicit_twice") + fid.direct("sample")
    sampling = answer_sampling("hi", "m1")
    async with mcp_session(
        gateway.url(), elicitation_callback=answer_elicitation, sampling_callback=sampling
    ) as session:
        with anyio.fail_after(WAIT):
            twice = await session.call_tool(f"{fid.name}__elicit_twice", {"message": "go"})
            sampled = await session.call_tool(f"{fid.name}__sample", {"prompt": "say hi"})
    assert first_text(twice) == 'twice: {"answer": "yes to go 1"} {"answer": "yes to go 2"}'
    assert first_text(sampled) == "sampled: hi (m1)"
    assert fid.direct("elicit_twice") + fid.direct("sample") == before + 2


async def test_a_downstream_giving_up_on_its_request_cancels_it_at_the_client(
    gateway: RunningServer, lane: Lane
) -> None:
    before = lane.fid.direct("sample_abandon")
    result = await call_abandoning_sampling(gateway.url(), f"{lane.fid.name}__sample_abandon", within=WAIT)
    assert first_text(result) == "gave up"
    assert lane.fid.direct("sample_abandon") == before + 1


async def test_an_oversized_answer_fails_that_call_alone_naming_size_and_limit(
    gateway: RunningServer, lane: Lane
) -> None:
    echo = lane.echo
    before = echo.direct("echo")
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(WAIT):
            big = await session.call_tool(f"{echo.name}__echo", {"text": "x" * (4 * LIMIT)})
            small = await session.call_tool(f"{echo.name}__echo", {"text": "still here"})
    assert big.is_error
    assert f"over this server's max_answer_bytes of {LIMIT:,}" in first_text(big)
    assert first_text(small) == "still here"
    assert echo.direct("echo") == before + 2


async def test_a_log_message_sent_during_a_call_reaches_its_client(gateway: RunningServer, lane: Lane) -> None:
    arrived: list[Any] = []
    got = anyio.Event()

    async def inbox(message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification):
            arrived.append(message.params.data)
            got.set()

    before = lane.fid.direct("log")
    async with mcp_session(gateway.url(), message_handler=inbox) as session:
        with anyio.fail_after(WAIT):
            await session.call_tool(f"{lane.fid.name}__log", {"level": "error", "message": "in the call"})
            await got.wait()
    assert arrived == ["in the call"]
    assert lane.fid.direct("log") == before + 1


async def test_a_stdio_server_crashing_mid_call_fails_that_call_and_comes_back(
    gateway: RunningServer, folder: Path
) -> None:
    echo = Downstream("f", _notes(folder / "echo-notes.txt"))
    before = echo.direct("crash")
    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(WAIT):
            crashed = await session.call_tool("f__crash", {})
        assert crashed.is_error
        assert "the connection closed during the call" in first_text(crashed), first_text(crashed)
        assert echo.direct("crash") == before + 1

        async def answered() -> bool:
            again = await session.call_tool("f__echo", {"text": "back"})
            return not again.is_error and first_text(again) == "back"

        await eventually(answered, within=WAIT)


@pytest.mark.parametrize("transport", ["http", "stdio"])
async def test_the_direct_path_makes_the_sdks_client_span_under_the_step_in_the_calls_trace(
    transport: str, echo_http: RunningServer, tmp_path: Path
) -> None:
    from tests.observe.test_observability import _spans_in, _stop

    if transport == "http":
        echo = Downstream("e", echo_http.output)
        entry = f"    transport: streamable_http\n    url: {echo_http.url()}\n"
    else:
        echo = Downstream("e", _notes(tmp_path / "notes.txt"))
        entry = _stdio(echo_argv("--stdio"), tmp_path / "notes.txt")
    config = f"""
gateway:
  audit: {{enabled: false}}
  tracing: {{exporter: console, service_name: traced-gateway}}
servers:
  e:
{entry}"""
    before = echo.direct("echo")
    with run_gateway(config, tmp_path) as traced:
        async with mcp_session(traced.url()) as session:
            with anyio.fail_after(WAIT):
                result = await session.call_tool("echo", {"text": "traced"})
        output = _stop(traced)
    assert first_text(result) == "traced" and echo.direct("echo") == before + 1
    by_name = {span["name"]: span for span in _spans_in(output)}
    call, step, send = by_name["tools/call echo"], by_name["step e/echo"], by_name["MCP send tools/call echo"]
    assert step["parent_id"] == call["context"]["span_id"]
    assert send["parent_id"] == step["context"]["span_id"]
    assert send["kind"] == "SpanKind.CLIENT" and send["attributes"]["mcp.method.name"] == "tools/call"
    assert send["context"]["trace_id"] == call["context"]["trace_id"]


async def opened_lane(client: Any, url: str) -> Any:
    """An ``HttpLane`` on a handshake-era session of its own with the server at ``url`` (initialized)."""
    from gateway.backends.mcp.fastpath import HttpLane

    headers = {"accept": "application/json, text/event-stream", "content-type": "application/json"}
    hello = {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
    init = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": hello}
    answered = await client.post(url, json=init, headers=headers)
    lane = HttpLane(client, url, max_event_size=1 << 20)
    lane.session_id, lane.version = answered.headers["mcp-session-id"], "2025-06-18"
    await client.post(url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=lane._headers())
    return lane


async def test_an_answered_stream_is_read_to_its_end_so_no_async_generator_is_left_to_the_garbage_collector(
    echo_http: RunningServer,
) -> None:
    # An event iterator abandoned after the answer leaves its chain of async generators (httpx2's SSE, text and
    # byte iterators, the transport's streams) suspended; the garbage collector then finalizes each through
    # asyncio's hook, which wakes the loop through its self-pipe and spawns a task to close it: seven per call.
    import gc
    import sys

    import httpx2

    first_iter, finalizer = sys.get_asyncgen_hooks()
    assert finalizer is not None
    finalized: list[str] = []

    def counting(agen: Any) -> None:
        finalized.append(agen.__qualname__)
        finalizer(agen)

    async def ignore(_: Any) -> None:
        return None

    async with httpx2.AsyncClient(trust_env=False) as client:
        with anyio.fail_after(WAIT):
            lane = await opened_lane(client, echo_http.url())
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


async def test_over_http_a_flood_is_handed_on_a_few_messages_per_turn(downstream: Downstreams) -> None:
    # As over stdio (test_stdio_lane.py): the events of one read of the call's stream are not handed on in one piece.
    import httpx2

    from gateway.backends.mcp.fastpath import MESSAGES_PER_TURN

    server = downstream("fidelity", "streamable_http")
    handed = Handed()
    async with httpx2.AsyncClient(trust_env=False) as client:
        with anyio.fail_after(60):
            lane = await opened_lane(client, server.url())
            async with anyio.create_task_group() as closer:  # its end waits for the answered stream's close
                lane.closer = closer
                await handed.flood(lane, 20_000)
    assert handed.count == 20_000
    assert max(handed.gaps) <= 2 * MESSAGES_PER_TURN, f"{max(handed.gaps)} handed on in one turn"


async def test_a_downstreams_sticky_cookie_goes_with_every_call(
    downstream: Downstreams, gateway_process: GatewayProcesses, tmp_path: Path
) -> None:
    # A balancer in front of a server's replicas pins a client with a cookie, here set on the answer to its first
    # call: the direct path builds its requests from a template per session, and must still send what the backend's
    # client holds now.
    server = downstream("faults", "streamable_http", "--sticky")
    config = f"gateway: {{naming: {{mode: always}}}}\nservers:\n  k: {json.dumps(server.settings())}\n"
    gateway = gateway_process(config, folder=tmp_path)

    async def counted(session: Any) -> tuple[int, int]:
        with_cookie, without = first_text(await session.call_tool("k__cookies", {})).split()
        return int(with_cookie), int(without)

    async with mcp_session(gateway.url()) as session:
        with anyio.fail_after(WAIT):
            before = await counted(session)
            for n in range(5):
                assert first_text(await session.call_tool("k__echo", {"text": f"pinned {n}"})) == f"pinned {n}"
            after = await counted(session)
    assert after[1] == before[1], "a call went without the cookie"
    assert after[0] >= 6  # the five calls and the second count
