"""A handshake-era downstream's request for input, during a stateless (2026-07-28) client's call, bridged.

Real processes: tests/fixtures/fidelity_server.py over stdio (a handshake-era server whose `elicit` and `sample`
tools send `elicitation/create` / `sampling/createMessage` mid-call) behind a real `gateway serve`; the client is the
SDK's `Client` in the 2026-07-28 era, which answers an input-required result and retries by itself, or its session
with `allow_input_required=True` where a test needs the raw rounds. The downstream's request waits in the gateway
process (gateway/server.py `bridged`) until the client's retry brings the answer.
"""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from tests.fixtures.gateway_proc import FIDELITY, PYTHON, run_gateway
from tests.fixtures.waiting import eventually
from tests.front.test_input_required import KEY, TOKENS, Answers, _assert_refused, _rows, _text, client

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


async def _backend_ready(http: httpx2.AsyncClient, url: str) -> bool:
    return (await http.get(url)).json()["backends"] == {"fid": "ready"}


def _config(*, bridge_ttl_s: float = 30.0, bridge_max_pending: int = 256) -> str:
    return f"""
gateway:
  audit: {{enabled: true, path: audit.db}}
  continuation: {{bridge_ttl_s: {bridge_ttl_s}, bridge_max_pending: {bridge_max_pending}}}
servers:
  fid:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps([FIDELITY, "--stdio", "--name", "s"])}
    timeout_s: 20
"""


class Said(Answers):
    async def elicit(self, context: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        self.asked.append(f"elicit:{params.message}")
        return types.ElicitResult(action="accept", content={"answer": f"forty-two to {params.message}"})


async def test_elicitation_and_sampling_of_a_handshake_era_downstream_reach_a_stateless_client(
    tmp_path: Path,
) -> None:
    with run_gateway(_config(), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        answers = Said()
        with anyio.fail_after(40):
            async with client(gateway.url(), answers=answers) as c:
                elicited = await c.call_tool("elicit", {"message": "The answer?"})
                sampled = await c.call_tool("sample", {"prompt": "hello"})
    assert _text(elicited) == 'elicited: accept {"answer": "forty-two to The answer?"}'
    assert _text(sampled) == "sampled: onward (m)"
    assert answers.asked == ["elicit:The answer?", "sample"]
    assert [row[:3] for row in _rows(tmp_path)] == [  # a row per round: the one that asked, then the call's own
        ("elicit", "input_required", "alice"),
        ("elicit", "ok", "alice"),
        ("sample", "input_required", "alice"),
        ("sample", "ok", "alice"),
    ]
    assert [row[3] for row in _rows(tmp_path)][::2] == [["fid:input_required"], ["fid:input_required"]]


async def test_a_prompt_and_a_resource_that_ask_mid_request_are_bridged_too(tmp_path: Path) -> None:
    # The downstream elicits while serving prompts/get (`greet` for the name `?`) and resources/read
    # (`fid://item/ask`): the stateless client gets an input-required result for each and its retry is answered.
    with run_gateway(_config(), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        answers = Said()
        with anyio.fail_after(40):
            async with client(gateway.url(), answers=answers) as c:
                prompt = await c.get_prompt("greet", {"name": "?"})
                read = await c.read_resource("fid://item/ask")
                first = await c.session.get_prompt("greet", {"name": "?"}, allow_input_required=True)
    (message,) = prompt.messages
    assert isinstance(message.content, types.TextContent)
    assert message.content.text == "Hello forty-two to Whom to greet?, from s."
    (contents,) = read.contents
    assert isinstance(contents, types.TextResourceContents)
    assert contents.text == "item forty-two to Which item? of s"
    assert isinstance(first, types.InputRequiredResult) and list(first.input_requests or {}) == ["input"]
    assert answers.asked == ["elicit:Whom to greet?", "elicit:Which item?"]


async def test_another_caller_cannot_answer_and_an_expired_wait_is_refused(tmp_path: Path) -> None:
    answer = {"input": types.ElicitResult(action="accept", content={"answer": "mine"})}
    with run_gateway(_config(bridge_ttl_s=1.0), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        with anyio.fail_after(40):
            async with client(gateway.url(), token="tok-alice") as alice:
                first = await alice.session.call_tool("elicit", {"message": "Q?"}, allow_input_required=True)
                assert isinstance(first, types.InputRequiredResult)
                assert first.input_requests is not None and list(first.input_requests) == ["input"]
                assert first.input_requests["input"].method == "elicitation/create"
                async with client(gateway.url(), token="tok-bob") as bob:
                    with pytest.raises(MCPError) as refused:
                        await bob.session.call_tool(
                            "elicit", {"message": "Q?"}, input_responses=answer, request_state=first.request_state
                        )
                _assert_refused(refused)
                await anyio.sleep(1.5)  # past bridge_ttl_s: the downstream stopped waiting
                with pytest.raises(MCPError) as expired:
                    await alice.session.call_tool(
                        "elicit", {"message": "Q?"}, input_responses=answer, request_state=first.request_state
                    )
                _assert_refused(expired)
                second = await alice.session.call_tool("elicit", {"message": "Q?"}, allow_input_required=True)
                assert isinstance(second, types.InputRequiredResult)
                done = await alice.session.call_tool(
                    "elicit", {"message": "Q?"}, input_responses=answer, request_state=second.request_state
                )
    assert _text(done) == 'elicited: accept {"answer": "mine"}'
    statuses = sorted(status for _, status, _, _ in _rows(tmp_path))
    # two rounds that asked; the expired call's downstream heard the timeout and answered isError; then the second
    assert statuses == ["error", "input_required", "input_required", "ok"]


async def test_a_downstream_that_asks_twice_in_one_call_takes_two_rounds(tmp_path: Path) -> None:
    with run_gateway(_config(), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        answers = Said()
        with anyio.fail_after(40):
            async with client(gateway.url(), answers=answers) as c:
                result = await c.call_tool("elicit_twice", {"message": "Q"})
    assert _text(result) == 'twice: {"answer": "forty-two to Q 1"} {"answer": "forty-two to Q 2"}'
    assert answers.asked == ["elicit:Q 1", "elicit:Q 2"]
    assert [row[1] for row in _rows(tmp_path)] == ["input_required", "input_required", "ok"]


async def test_the_table_is_bounded_and_a_restart_forgets_the_waiting_call(tmp_path: Path) -> None:
    answer = {"input": types.ElicitResult(action="accept", content={"answer": "late"})}
    env = {"GATEWAY_STATE_KEY": KEY}
    # A second downstream, so that the second waiting call is not a second call in flight on the first's shared
    # stdio session (which nothing could attribute).
    two = (
        _config(bridge_max_pending=1)
        + f"""  other:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps([FIDELITY, "--stdio", "--name", "o"])}
    timeout_s: 20
"""
    )
    with run_gateway(two, tmp_path, tokens=TOKENS, env=env) as gateway:
        with anyio.fail_after(40):
            async with client(gateway.url()) as c:
                first = await c.session.call_tool("fid__elicit", {"message": "A"}, allow_input_required=True)
                assert isinstance(first, types.InputRequiredResult)
                with pytest.raises(MCPError) as full:
                    await c.session.call_tool("other__elicit", {"message": "B"}, allow_input_required=True)
    assert full.value.error.message == (
        "The server behind 'other__elicit' needs input (elicitation/create) and this gateway already holds 1 "
        "waiting requests (gateway.continuation.bridge_max_pending)."
    )
    with run_gateway(two, tmp_path, tokens=TOKENS, env=env) as gateway:  # same key, same ledger: a restart
        with anyio.fail_after(40):
            async with client(gateway.url()) as c:
                with pytest.raises(MCPError) as forgotten:
                    await c.session.call_tool(
                        "fid__elicit", {"message": "A"}, input_responses=answer, request_state=first.request_state
                    )
        said = gateway.output()
    _assert_refused(forgotten)
    assert "the waiting downstream call is not held by this process" in said


async def test_a_stateless_client_cancelling_its_call_cancels_it_downstream(tmp_path: Path) -> None:
    # The call runs in a task of the gateway's own (so that a downstream could wait in it): the client's
    # cancellation must still reach that task and the downstream's work.
    with run_gateway(_config(), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        with anyio.fail_after(40):
            # The call must reach the downstream before the client gives up: on a busy machine the backend's start
            # can outlast the client's half second, and a call abandoned while it waits for its backend never runs.
            async with httpx2.AsyncClient() as http:
                await eventually(lambda: _backend_ready(http, gateway.url("/healthz")), within=20)
            async with client(gateway.url()) as c:
                with pytest.raises(MCPError):
                    await c.session.call_tool("sleep", {"seconds": 60}, read_timeout_seconds=0.5)
            await eventually(lambda: [row[1] for row in _rows(tmp_path)] == ["cancelled"], within=10)
    assert _rows(tmp_path) == [("sleep", "cancelled", "alice", ["fid/sleep:cancelled"])]
