"""Downstream faults stay with the call or the server that caused them: big answers, crashes, blocked servers, flapping.

Real processes throughout: tests/fixtures/faults_server.py over real stdio pipes and real loopback HTTP and SSE,
driven through a real ``McpBackend`` (and, for the circuit breaker, a real in-process ``Gateway`` and its router).
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import mcp_types as types
import pytest

from gateway.backends.base import BackendState
from gateway.backends.mcp.pool import HttpPool
from gateway.backends.mcp.session import McpBackend
from gateway.backends.mcp.transports import SSE_EVENT_CAP
from gateway.config import HttpServer, ServerConfig, SseServer, StdioServer, parse_config
from gateway.core.breakers import BreakerState
from gateway.core.runtime import Gateway
from gateway.errors import BackendAnswerTooLarge, BackendError, BackendUnavailable
from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, first_text
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

FAULTS = str(FIXTURES / "faults_server.py")
MiB = 1024 * 1024


def stdio(*extra: str, **keys: Any) -> StdioServer:
    return StdioServer(transport="stdio", command=PYTHON, args=(FAULTS, "--stdio", *extra), **keys)


@asynccontextmanager
async def serving(config: ServerConfig) -> AsyncIterator[McpBackend]:
    """A real backend, supervised in a task group of the test, ready before the block starts."""
    http = HttpPool()
    backend = McpBackend("f", config, http=http)
    try:
        async with anyio.create_task_group() as tg:
            with anyio.fail_after(20):
                await tg.start(backend.run)
            assert backend.status.state is BackendState.READY, backend.status.reason
            try:
                yield backend
            finally:
                tg.cancel_scope.cancel()
    finally:
        await http.aclose()


@pytest.fixture(scope="module")
def faults_http(downstream: Downstreams) -> Downstream:
    return downstream("faults", "streamable_http")


@pytest.fixture(scope="module")
def faults_json(downstream: Downstreams) -> Downstream:
    return downstream("faults", "streamable_http", "--json-response")


@pytest.fixture(scope="module")
def faults_sse(downstream: Downstreams) -> Downstream:
    return downstream("faults", "sse")


# ------------------------------------------------------------------------------------------------ A: big answers


async def _big_answer_with_a_bystander(backend: McpBackend, size: int) -> tuple[BaseException | int, str]:
    """Call ``big(size)`` while a bystander's ``sleep`` is in flight on the same session; both outcomes."""
    outcome: dict[str, Any] = {}
    in_flight = anyio.Event()

    async def bystander() -> None:
        call = backend.call_tool("sleep", {"seconds": 1.0})
        in_flight.set()
        outcome["bystander"] = first_text(await call)

    async def big() -> None:
        await in_flight.wait()
        try:
            outcome["big"] = len(first_text(await backend.call_tool("big", {"bytes": size})))
        except BackendError as exc:
            outcome["big"] = exc

    with anyio.fail_after(30):
        async with anyio.create_task_group() as tg:
            tg.start_soon(bystander)
            tg.start_soon(big)
    return outcome["big"], outcome["bystander"]


@pytest.fixture
def transports(faults_http: Downstream, faults_json: Downstream, faults_sse: Downstream) -> dict[str, Downstream]:
    return {"streamable_http": faults_http, "streamable_http-json": faults_json, "sse": faults_sse}


def _config(transport: str, servers: dict[str, Downstream], **keys: Any) -> ServerConfig:
    if transport.startswith("stdio"):
        return stdio("--id-last", **keys) if transport == "stdio-id-last" else stdio(**keys)
    if transport == "sse":
        return SseServer(transport="sse", url=servers["sse"].url("/sse"), **keys)
    return HttpServer(transport="streamable_http", url=servers[transport].url(), **keys)


TRANSPORTS = ["stdio", "stdio-id-last", "streamable_http", "streamable_http-json", "sse"]


@pytest.mark.parametrize("transport", TRANSPORTS[:-1])  # SSE: see the next-but-one test
async def test_an_answer_of_3_5_mb_passes_under_the_default_limit(
    transport: str, transports: dict[str, Downstream]
) -> None:
    config = _config(transport, transports)
    async with serving(config) as backend:
        big, bystander = await _big_answer_with_a_bystander(backend, 3_500_000)
        assert big == 3_500_000
        assert bystander == "slept"
        assert backend.connects == 1


async def _fails_alone(backend: McpBackend, size: int, limit: int) -> None:
    big, bystander = await _big_answer_with_a_bystander(backend, size)
    assert isinstance(big, BackendAnswerTooLarge), big
    assert big.limit == limit
    assert size < big.size < size + 200  # the text and the JSON-RPC frame around it
    assert f"the answer is {big.size:,} bytes, over this server's max_answer_bytes of {limit:,}" in big.reason
    assert bystander == "slept"  # the same session kept serving the bystander
    assert first_text(await backend.call_tool("echo", {"text": "after"})) == "after"
    assert backend.connects == 1 and backend.status.state is BackendState.READY


@pytest.mark.parametrize("transport", TRANSPORTS)
async def test_an_answer_over_max_answer_bytes_fails_that_call_alone_naming_size_and_limit(
    transport: str, transports: dict[str, Downstream]
) -> None:
    config = _config(transport, transports, max_answer_bytes=MiB // 2)
    async with serving(config) as backend:
        await _fails_alone(backend, 2 * MiB, MiB // 2)


async def test_over_sse_an_answer_over_the_sdks_1_mib_event_cap_fails_alone(faults_sse: Downstream) -> None:
    async with serving(SseServer(transport="sse", url=faults_sse.url("/sse"))) as backend:
        await _fails_alone(backend, 3_500_000, SSE_EVENT_CAP)


# ------------------------------------------------------------------------------------------------ C: blocked stdin


async def test_a_server_that_stops_reading_is_declared_failed_within_the_timeout_and_restarted() -> None:
    async with serving(stdio(timeout_s=2)) as backend:
        assert first_text(await backend.call_tool("stop_reading", {})) == "stopped"
        outcome: dict[str, Any] = {}

        async def call(name: str, text: str) -> None:
            t0 = time.monotonic()
            try:
                await backend.call_tool("echo", {"text": text})
                outcome[name] = "answered"
            except BackendError as exc:
                outcome[name] = exc
            outcome[f"{name}_s"] = time.monotonic() - t0

        with anyio.fail_after(30):
            async with anyio.create_task_group() as tg:
                tg.start_soon(call, "big", "y" * 256 * 1024)  # fills the pipe: the write cannot complete
                tg.start_soon(call, "small", "s")  # queued behind the blocked write (tasks start in order)
        for name in ("big", "small"):
            assert isinstance(outcome[name], BackendError), outcome
            assert "stopped reading its stdin" in outcome[name].reason, outcome[name]
            assert outcome[f"{name}_s"] < 2 + 1.0, outcome  # within the call's timeout (plus scheduling)
        assert backend.status.state is BackendState.FAILED  # declared at once, not after a health ping
        assert "stopped reading its stdin" in (backend.status.reason or ""), backend.status
        await _reconnected(backend, 2)
        assert first_text(await backend.call_tool("echo", {"text": "fresh"})) == "fresh"


# ------------------------------------------------------------------------------------------------ D: flapping


async def _reconnected(backend: McpBackend, connects: int) -> None:
    """Wait until ``backend`` is ready on its ``connects``-th session."""
    await eventually(lambda: backend.status.state is BackendState.READY and backend.connects == connects, within=15)


async def test_a_server_that_dies_right_after_its_handshake_costs_a_bounded_number_of_spawns(tmp_path: Path) -> None:
    spawn_log = tmp_path / "spawns"
    config = stdio("--exit-after-handshake", "--spawn-log", str(spawn_log))
    backend = McpBackend("f", config)
    changes: list[BackendState] = []
    backend.subscribe(lambda: changes.append(backend.status.state))
    window = 6.0
    async with anyio.create_task_group() as tg:
        tg.start_soon(backend.run)
        await anyio.sleep(window)  # the window being measured
        tg.cancel_scope.cancel()
    spawns = len(spawn_log.read_text().split())
    # Backoff 0.5, 1, 2, 4 s (+ up to 0.5 s jitter each) after sessions shorter than min_uptime_s: at most 5 spawns
    # in 6 s (before: one spawn every ~80 ms, 70 in this window), each costing a ready and a failed state change.
    assert 3 <= spawns <= 5, spawns
    assert len(changes) <= 2 * spawns + 1, changes
    assert "up for" in (backend.status.last_error or ""), backend.status.last_error


async def test_after_a_session_that_stayed_up_min_uptime_s_the_backoff_starts_again(tmp_path: Path) -> None:
    spawn_log = tmp_path / "spawns"
    config = stdio("--spawn-log", str(spawn_log), min_uptime_s=0.2)
    async with serving(config) as backend:
        for expected in (2, 3, 4):  # each session outlived min_uptime_s: every reconnect is immediate
            await anyio.sleep(0.3)  # stay up longer than min_uptime_s
            t0 = time.monotonic()
            with pytest.raises(BackendUnavailable):
                await backend.call_tool("crash", {})
            await _reconnected(backend, expected)
            assert time.monotonic() - t0 < 2.0
    assert len(spawn_log.read_text().split()) == 4


# ------------------------------------------------------------------------------------------------ B: the breaker


def _gateway(config_yaml: str) -> Gateway:
    return Gateway(parse_config(config_yaml))


def _server(**keys: Any) -> str:
    lines = [f"    command: {PYTHON}", f"    args: {json.dumps([FAULTS, '--stdio'])}"]
    lines += [f"    {k}: {json.dumps(v)}" for k, v in keys.items()]
    return "servers:\n  f:\n    transport: stdio\n" + "".join(f"{line}\n" for line in lines)


async def _ready(gateway: Gateway, connects: int) -> None:
    backend = gateway.backends["f"]
    assert isinstance(backend, McpBackend)
    await _reconnected(backend, connects)


async def test_eight_calls_lost_to_one_crash_count_as_one_failure_and_calls_flow_after_the_restart() -> None:
    config = "gateway:\n  audit: {enabled: false}\n" + _server()
    async with _gateway(config).running() as gateway:
        await _ready(gateway, 1)
        results: list[types.CallToolResult] = []
        backend = gateway.backends["f"]

        async def call(name: str, arguments: dict[str, Any]) -> None:
            results.append(await gateway.router.call(name, arguments))

        with anyio.fail_after(20):
            async with anyio.create_task_group() as tg:
                for _ in range(7):
                    tg.start_soon(call, "sleep", {"seconds": 30})
                await eventually(lambda: gateway.router.drain.inflight(backend) == 7, within=5)
                tg.start_soon(call, "crash", {})
        assert len(results) == 8 and all(r.is_error for r in results)
        breaker = gateway.router.breakers["f"]
        assert breaker.state is BreakerState.CLOSED and breaker.failures == 1
        await _ready(gateway, 2)
        after = await gateway.router.call("echo", {"text": "back"})
        assert not after.is_error, first_text(after)
        assert first_text(after) == "back"


async def test_a_successful_reconnect_closes_an_open_breaker() -> None:
    config = "gateway:\n  audit: {enabled: false}\n  circuit_breaker: {failure_threshold: 2, cooldown_s: 300}\n"
    async with _gateway(config + _server()).running() as gateway:
        for connects in (1, 2):
            await _ready(gateway, connects)
            crashed = await gateway.router.call("crash", {})
            assert crashed.is_error
        assert gateway.router.breakers["f"].state is BreakerState.OPEN
        await _ready(gateway, 3)
        after = await gateway.router.call("echo", {"text": "back"})
        assert first_text(after) == "back" and not after.is_error
        assert gateway.router.breakers["f"].state is BreakerState.CLOSED


async def test_a_cancelled_trial_call_hands_the_trial_back() -> None:
    config = "gateway:\n  audit: {enabled: false}\n  circuit_breaker: {failure_threshold: 1, cooldown_s: 0.2}\n"
    async with _gateway(config + _server(timeout_s=0.5)).running() as gateway:
        await _ready(gateway, 1)
        backend = gateway.backends["f"]
        timed_out = await gateway.router.call("sleep", {"seconds": 5})
        assert timed_out.is_error and "timed out" in first_text(timed_out)
        breaker = gateway.router.breakers["f"]
        assert breaker.state is BreakerState.OPEN
        await anyio.sleep(0.3)  # the cooldown itself
        with anyio.fail_after(10):
            async with anyio.create_task_group() as tg:
                tg.start_soon(gateway.router.call, "sleep", {"seconds": 0.4})  # the trial
                await eventually(lambda: gateway.router.drain.inflight(backend) == 1, within=5)
                assert breaker.state is BreakerState.HALF_OPEN
                tg.cancel_scope.cancel()  # the trial's caller goes away
        after = await gateway.router.call("echo", {"text": "next"})
        assert not after.is_error, first_text(after)
        assert breaker.state is BreakerState.CLOSED
