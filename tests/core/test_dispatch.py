"""One dispatcher: every request that reaches a backend (tools, resources, prompts, completion, subscriptions) goes
through the router, with one error policy, circuit breaker, audit row of its own kind, and metrics.

Real parts: an in-process gateway (gateway/testing.py ``in_process_gateway``, reached by the SDK's client in memory)
in front of tests/fixtures/fidelity_server.py over a real stdio pipe, writing a real ledger.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from gateway.core.runtime import Gateway
from gateway.ledger.engines import open_reader
from gateway.observe.tracing import CallTracer
from gateway.testing import InProcess, in_process_gateway
from tests.fixtures.gateway_proc import FIDELITY, PYTHON

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


@pytest.fixture
async def connected(tmp_path: Path) -> AsyncIterator[InProcess]:
    text = f"""
gateway:
  audit: {{path: {json.dumps(str(tmp_path / "audit.db"))}}}
  circuit_breaker: {{failure_threshold: 1, cooldown_s: 60}}
servers:
  s:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps([FIDELITY, "--stdio", "--name", "s"])}
    timeout_s: 1
"""
    async with in_process_gateway(text, settle_s=15) as connected:
        yield connected


def _rows(gateway: Gateway) -> list[tuple[str, str, str, list[str]]]:
    assert gateway.ledger is not None and gateway.ledger.target is not None
    return [
        (r.kind, r.tool, r.status, [f"{s.provider}:{s.outcome}" for s in r.chain])
        for r in open_reader(gateway.ledger.target).query()
    ]


def _sample(gateway: Gateway, name: str, **labels: str) -> float:
    text = gateway.metrics.exposition().decode()
    wanted = ",".join(f'{k}="{v}"' for k, v in labels.items())
    for line in text.splitlines():
        if line.startswith(f"mcp_gateway_{name}{{") and all(f'{k}="{v}"' in line for k, v in labels.items()):
            return float(line.rsplit(" ", 1)[1])
    raise AssertionError(f"no sample mcp_gateway_{name}{{{wanted}}} in the exposition")


async def test_resources_prompts_and_completions_leave_a_ledger_row_of_their_kind_and_are_counted(
    connected: InProcess,
) -> None:
    client, gateway = connected
    with anyio.fail_after(10):
        read = await client.read_resource("fid://r/1")
        prompt = await client.get_prompt("greet", {"name": "ada"})
        done = await client.complete(types.PromptReference(name="greet"), {"name": "name", "value": "al"})
        with pytest.raises(MCPError) as refused:
            await client.get_prompt("no_such_prompt")
    assert [c.text for c in read.contents if isinstance(c, types.TextResourceContents)] == ["resource 1 of s"]
    assert [m.content.text for m in prompt.messages if isinstance(m.content, types.TextContent)] == [
        "Hello ada, from s."
    ]
    assert done.completion.values == ["alice", "albert"]
    assert refused.value.error.message == "Unknown prompt: 'no_such_prompt'"  # the gateway's: no such name listed
    assert _rows(gateway) == [
        ("resources/read", "fid://r/1", "ok", ["s:ok"]),
        ("prompts/get", "greet", "ok", ["s:ok"]),
        ("completion/complete", "greet", "ok", ["s:ok"]),
    ]
    assert _sample(gateway, "requests_total", method="prompts/get", backend="s", status="ok") == 1.0
    assert _sample(gateway, "requests_total", method="resources/read", backend="s", status="ok") == 1.0


async def test_a_prompt_that_times_out_trips_the_breaker_and_the_next_request_is_not_sent(connected: InProcess) -> None:
    client, gateway = connected
    with anyio.fail_after(10):
        with pytest.raises(MCPError) as first:
            await client.get_prompt("greet", {"name": "ada", "delay": "5"})
        with pytest.raises(MCPError) as second:
            await client.get_prompt("greet", {"name": "bob"})
    assert "timed out after 1 s" in first.value.error.message
    assert "circuit open" in second.value.error.message
    breaker = gateway.router.breakers.get("s")
    assert breaker is not None and breaker.failures >= 1
    rows = _rows(gateway)
    assert [(kind, tool, status) for kind, tool, status, _ in rows] == [
        ("prompts/get", "greet", "timeout"),
        ("prompts/get", "greet", "error"),
    ]
    assert rows[1][3] == ["s:circuit_open"]
    assert _sample(gateway, "requests_total", method="prompts/get", backend="s", status="timeout") == 1.0


async def test_a_subscription_and_its_end_leave_rows_of_their_kind(connected: InProcess) -> None:
    client, gateway = connected
    with anyio.fail_after(10):
        for request in (
            types.SubscribeRequest(params=types.SubscribeRequestParams(uri="fid://r/2")),
            types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri="fid://r/2")),
        ):
            await client.session.send_request(request, types.EmptyResult)
    assert _rows(gateway) == [
        ("resources/subscribe", "fid://r/2", "ok", ["s:ok"]),
        ("resources/unsubscribe", "fid://r/2", "ok", ["s:ok"]),
    ]


async def test_a_traced_resource_read_continues_the_clients_trace_with_a_span_and_a_step(connected: InProcess) -> None:
    client, gateway = connected
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gateway.router.use_instruments(gateway.ledger, CallTracer(provider.get_tracer("test")))
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    try:
        with anyio.fail_after(10):
            await client.read_resource("fid://r/3", meta={"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"})
    finally:
        provider.shutdown()
    finished: list[ReadableSpan] = list(exporter.get_finished_spans())
    assert [s.name for s in finished] == ["step s", "resources/read fid://r/3"]
    step, read = finished
    assert read.attributes is not None and read.attributes["mcp.method.name"] == "resources/read"
    assert read.attributes["mcp.resource.uri"] == "fid://r/3" and read.attributes["mcp_gateway.status"] == "ok"
    assert format(read.context.trace_id, "032x") == trace_id  # the client's request's _meta is the parent
    assert read.parent is not None and format(read.parent.span_id, "016x") == "00f067aa0ba902b7"
    assert step.parent is not None and step.parent.span_id == read.context.span_id
