"""A stateless (2026-07-28) client that abandons a bridged call (it never retries the input-required result) pays
for it alone: the abandonment is never read as the backend's failure, a caller holds a bounded number of waiting
calls, other callers' elicitations on the same shared session still reach them, and with ``session: per_client``
a correct immediate retry is served.

Real processes: tests/fixtures/fidelity_server.py (a handshake-era server that elicits mid-call) over stdio, or over
loopback HTTP, behind a real ``gateway serve``; the clients are the SDK's ``Client`` in the 2026-07-28 era.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.shared.exceptions import MCPError

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import FIDELITY, PYTHON, run_gateway
from tests.fixtures.waiting import eventually
from tests.front.test_era_bridge import Said
from tests.front.test_input_required import KEY, TOKENS, _rows, _text, client

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

ENV = {"GATEWAY_STATE_KEY": KEY}


def _config(
    *,
    ttl_s: float = 30.0,
    per_caller: int | None = None,
    session: str = "shared",
    over: Downstream | None = None,
    timeout_s: float = 20,
) -> str:
    """One fidelity server ``fid``: over stdio, or ``over`` a served transport."""
    cap = f", bridge_max_per_caller: {per_caller}" if per_caller is not None else ""
    if over is None:
        server = {"transport": "stdio", "command": PYTHON, "args": [FIDELITY, "--stdio", "--name", "s"]}
    else:
        server = over.settings()
    # Its tools ask mid-call, which only the handshake era can (the SDK serves it in both eras over HTTP): declared
    # so, a stateless client's call is bridged.
    server |= {"timeout_s": timeout_s, "session": session, "protocol": "handshake"}
    return f"""
gateway:
  audit: {{enabled: true, path: audit.db}}
  continuation: {{bridge_ttl_s: {ttl_s}{cap}}}
  circuit_breaker: {{failure_threshold: 2}}
servers:
  fid: {json.dumps(server)}
"""


@pytest.fixture(params=["stdio", "streamable_http"])
def over(request: pytest.FixtureRequest, downstream: Downstreams) -> Downstream | None:
    """Where the fidelity server runs: None for a stdio child of the gateway, else a served one."""
    if request.param == "stdio":
        return None
    return downstream("fidelity", "streamable_http", "--name", "s", own=True)


async def _abandoned(c: Client, tool: str, message: str) -> types.InputRequiredResult:
    """The call's first round: the downstream's request for input, which the client never answers."""
    first = await c.session.call_tool(tool, {"message": message}, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult), first
    return first


def _ended(folder: Path) -> int:
    """How many calls have their final row in the ledger."""
    return sum(status != "input_required" for _, status, _, _ in _rows(folder))


async def test_abandoned_bridged_calls_never_open_the_backends_circuit(tmp_path: Path, over: Downstream | None) -> None:
    # The downstream's elicitation is answered -32001 when the wait expires, and this server lets that error escape
    # as its call's answer: an echo of the caller's abandonment, not the gateway's timeout of the backend.
    with run_gateway(_config(ttl_s=0.5, over=over), tmp_path, tokens=TOKENS, env=ENV) as gateway:
        with anyio.fail_after(60):
            async with client(gateway.url(), token="tok-alice") as alice:
                for index in range(3):  # past the threshold of 2
                    await _abandoned(alice, "elicit_or_raise", f"Q{index}")
                    await eventually(lambda n=index + 1: _ended(tmp_path) == n, within=20)
            async with client(gateway.url(), token="tok-bob", answers=Said()) as bob:
                answered = await bob.call_tool("elicit_or_raise", {"message": "Bob?"})
        said = gateway.output()
    assert _text(answered) == "answered: forty-two to Bob?"
    abandoned = [(status, chain) for _, status, caller, chain in _rows(tmp_path) if caller == "alice"]
    assert [status for status, _ in abandoned] == ["input_required", "error"] * 3
    assert all(chain == ["fid/elicit_or_raise:rpc_error"] for status, chain in abandoned if status == "error")
    assert "circuit open" not in said and "timed out after" not in said


async def test_abandoned_bridged_calls_cut_by_their_own_time_limit_never_open_the_backends_circuit(
    tmp_path: Path, over: Downstream | None
) -> None:
    # The call's time limit (1 s) runs out while its downstream waits for the client's input (the bridge would wait
    # 30 s): the call ends as timed out, and that is the caller's abandonment, not the backend's failure.
    with run_gateway(_config(ttl_s=30, over=over, timeout_s=1), tmp_path, tokens=TOKENS, env=ENV) as gateway:
        with anyio.fail_after(60):
            async with client(gateway.url(), token="tok-alice") as alice:
                for index in range(3):  # past the threshold of 2
                    await _abandoned(alice, "elicit", f"Q{index}")
                    await eventually(lambda n=index + 1: _ended(tmp_path) == n, within=20)
            async with client(gateway.url(), token="tok-bob", answers=Said()) as bob:
                answered = await bob.call_tool("elicit", {"message": "Bob?"})
        said = gateway.output()
    assert _text(answered) == 'elicited: accept {"answer": "forty-two to Bob?"}'
    ended = [status for _, status, caller, _ in _rows(tmp_path) if caller == "alice" and status != "input_required"]
    assert ended == ["timeout"] * 3, ended
    assert "circuit open" not in said


async def test_with_per_client_sessions_an_immediate_retry_is_served(tmp_path: Path) -> None:
    answer = {"input": types.ElicitResult(action="accept", content={"answer": "now"})}
    with run_gateway(_config(session="per_client"), tmp_path, tokens=TOKENS, env=ENV) as gateway:
        with anyio.fail_after(40):
            async with client(gateway.url(), token="tok-alice") as alice:
                first = await _abandoned(alice, "elicit", "Q?")
                done = await alice.session.call_tool(
                    "elicit", {"message": "Q?"}, input_responses=answer, request_state=first.request_state
                )
            # the call's own downstream session (a process over stdio) lasted as long as the call, and no longer
            await eventually(lambda: _client_sessions(gateway.output()) == ["open", "closed"], within=20)
    assert _text(done) == 'elicited: accept {"answer": "now"}'


def _client_sessions(log: str) -> list[str]:
    """The states the gateway logged for per-client downstream sessions, in order."""
    lines = (json.loads(line) for line in log.splitlines() if '"backend.client_session"' in line)
    return [line["state"] for line in lines]


async def test_one_callers_waiting_call_does_not_fail_another_callers_elicitation(tmp_path: Path) -> None:
    # Both calls are in flight on the one shared stdio session, where nothing ties a downstream's request to a call:
    # the call already waiting for its client's input is not the one asking again.
    with run_gateway(_config(), tmp_path, tokens=TOKENS, env=ENV) as gateway:
        with anyio.fail_after(40):
            async with client(gateway.url(), token="tok-alice") as alice:
                await _abandoned(alice, "elicit", "Alice?")
                async with client(gateway.url(), token="tok-bob", answers=Said()) as bob:
                    answered = await bob.call_tool("elicit", {"message": "Bob?"})
    assert _text(answered) == 'elicited: accept {"answer": "forty-two to Bob?"}'


async def test_a_caller_holds_at_most_its_share_of_waiting_calls(tmp_path: Path, over: Downstream | None) -> None:
    with run_gateway(_config(per_caller=2, over=over), tmp_path, tokens=TOKENS, env=ENV) as gateway:
        with anyio.fail_after(40):
            async with client(gateway.url(), token="tok-alice") as alice:
                await _abandoned(alice, "elicit", "A1")
                await _abandoned(alice, "elicit", "A2")
                with pytest.raises(MCPError) as refused:
                    await _abandoned(alice, "elicit", "A3")
                async with client(gateway.url(), token="tok-bob", answers=Said()) as bob:
                    answered = await bob.call_tool("elicit", {"message": "Bob?"})
    assert refused.value.error.message == (
        "The server behind 'elicit' needs input (elicitation/create) and this caller already has 2 waiting "
        "requests (gateway.continuation.bridge_max_per_caller)."
    )
    assert _text(answered) == 'elicited: accept {"answer": "forty-two to Bob?"}'
