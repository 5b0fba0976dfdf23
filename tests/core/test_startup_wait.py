"""A request the gateway accepted while its backends are still starting leaves its ledger row, whatever ends it.

Until every backend has had its first outcome (bounded), a ``tools/call`` naming a tool not known yet, a
``resources/read``, a ``prompts/get`` and a ``completion/complete`` wait for startup before they are routed
(gateway/runtime.py ``wait_started``). A request cancelled during that wait never reaches a backend; it still leaves
exactly one row of its kind: ``cancelled``, with one ``gateway`` step that says it was waiting for startup.

Real parts: an in-process gateway (gateway/testing.py ``in_process_gateway``, reached by the SDK's client in memory
in the stateless 2026-07-28 era, which has no handshake that would wait first) in front of
tests/fixtures/fidelity_server.py over a real stdio pipe, started by a shell that first sleeps for a minute, and a
real SQLite ledger. The request is known to be waiting once every task of the test's loop is blocked. The last test
does the same over real HTTP against the gateway process (``python -m gateway serve``), whose client goes away; the
request is known to be waiting once the gateway logged ``request.waiting_for_startup``.
"""

from __future__ import annotations

import json
import shlex
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client.client import Client
from mcp.shared.exceptions import MCPError

from gateway.core import runtime
from gateway.core.runtime import Gateway
from gateway.ledger.engines import open_reader
from gateway.testing import InProcess, in_process_gateway
from tests.fixtures.gateway_proc import FIDELITY, PYTHON, echo_argv, run_gateway
from tests.fixtures.waiting import eventually
from tests.front.http.test_body import ACCEPT, MODERN_META

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

MODERN = "2026-07-28"
STARTS_IN_S = 60  # the backend's shell sleeps this long before the fixture runs: it is still starting in every test


def slow_start_config(folder: Path, backend: str, argv: list[str]) -> str:
    """A gateway with its ledger in ``folder`` and one stdio backend, ``argv``, that starts ``STARTS_IN_S`` late."""
    return f"""
gateway:
  audit: {{path: {json.dumps(str(folder / "audit.db"))}}}
servers:
  {backend}:
    transport: stdio
    command: sh
    args: {json.dumps(["-c", f"sleep {STARTS_IN_S} && exec {shlex.join(argv)}"])}
    timeout_s: {STARTS_IN_S * 2}
"""


@pytest.fixture
async def connected(tmp_path: Path) -> AsyncIterator[InProcess]:
    text = slow_start_config(tmp_path, "s", [PYTHON, FIDELITY, "--stdio", "--name", "s"])
    async with in_process_gateway(text, mode=MODERN, settle_s=None) as connected:
        yield connected


def _rows(gateway: Gateway) -> list[tuple[str, str, str, list[tuple[str, str, str | None]]]]:
    assert gateway.ledger is not None and gateway.ledger.target is not None
    return [
        (r.kind, r.tool, r.status, [(s.provider, s.outcome, s.reason) for s in r.chain])
        for r in open_reader(gateway.ledger.target).query()
    ]


Ask = Callable[[Client], Awaitable[Any]]
REQUESTS: dict[str, tuple[str, Ask]] = {
    "tools/call": ("later_tool", lambda c: c.call_tool("later_tool", {"q": "x"})),
    "resources/read": ("fid://r/1", lambda c: c.read_resource("fid://r/1")),
    "prompts/get": ("greet", lambda c: c.get_prompt("greet", {"name": "ada"})),
    "completion/complete": (
        "greet",
        lambda c: c.complete(types.PromptReference(name="greet"), {"name": "name", "value": "al"}),
    ),
}


@pytest.mark.parametrize("kind", list(REQUESTS))
async def test_a_request_cancelled_while_backends_are_still_starting_leaves_one_cancelled_row_of_its_kind(
    connected: InProcess, kind: str
) -> None:
    client, gateway = connected
    name, ask = REQUESTS[kind]
    outcome: list[str] = []

    async def caller() -> None:
        try:
            await ask(client)
        except anyio.get_cancelled_exc_class():
            outcome.append("cancelled")
            raise
        outcome.append("answered")  # pragma: no cover - the backend cannot answer for a minute

    with anyio.fail_after(10):
        async with anyio.create_task_group() as tg:
            tg.start_soon(caller)
            await anyio.wait_all_tasks_blocked()  # the request waits for the backend's first outcome
            assert not gateway.started
            tg.cancel_scope.cancel()

    await eventually(lambda: bool(_rows(gateway)), within=10)
    assert outcome == ["cancelled"]
    assert _rows(gateway) == [
        (kind, name, "cancelled", [("gateway", "cancelled", "cancelled while waiting for backends still starting")])
    ]


async def test_a_stateless_call_whose_client_goes_away_during_the_startup_wait_leaves_its_row(tmp_path: Path) -> None:
    """The same over real HTTP, against the gateway process: the client closes its connection instead."""
    config = slow_start_config(tmp_path, "e", echo_argv("--stdio"))
    body = {
        "jsonrpc": "2.0",
        "id": 5,
        "method": "tools/call",
        "params": {"name": "later_tool", "arguments": {}, "_meta": MODERN_META},
    }
    headers = {**ACCEPT, "mcp-protocol-version": MODERN, "mcp-method": "tools/call", "mcp-name": "later_tool"}
    with run_gateway(config, tmp_path, started=False) as server:
        async with httpx2.AsyncClient(timeout=30) as http:
            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:

                    async def post() -> None:
                        await http.post(server.url(), json=body, headers=headers)

                    tg.start_soon(post)
                    await eventually(lambda: "request.waiting_for_startup" in server.output(), within=10)
                    tg.cancel_scope.cancel()  # the client goes away: its connection is closed

                def rows() -> list[tuple[str, str, str, str]]:
                    with sqlite3.connect(tmp_path / "audit.db") as db:
                        return db.execute("SELECT kind, tool, status, chain FROM calls").fetchall()

                await eventually(lambda: bool(rows()), within=10)
    [(kind, tool, status, chain)] = rows()
    assert (kind, tool, status) == ("tools/call", "later_tool", "cancelled")
    assert [(s["provider"], s["outcome"], s["reason"]) for s in json.loads(chain)] == [
        ("gateway", "cancelled", "cancelled while waiting for backends still starting")
    ]


async def test_a_call_still_waiting_when_the_waits_bound_passes_is_routed_and_leaves_exactly_one_row(
    connected: InProcess, monkeypatch: pytest.MonkeyPatch
) -> None:
    client, gateway = connected
    monkeypatch.setattr(runtime, "STARTUP_WAIT_S", 0.5)  # the bound, not the backend, ends the wait here
    with anyio.fail_after(10), pytest.raises(MCPError) as refused:
        await client.call_tool("later_tool", {"q": "x"})
    assert gateway.started
    assert "later_tool" in refused.value.error.message  # an unknown tool, once startup stopped waiting
    assert _rows(gateway) == [("tools/call", "later_tool", "unknown_tool", [])]
