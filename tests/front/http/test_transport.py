"""The session transport's own event streams (gateway/front/http/transport.py): framed as sse-starlette framed them,
kept alive while quiet, ended when the client leaves; and a session's answers over a real gateway on loopback."""

from __future__ import annotations

import json
from typing import Any

import anyio
import httpx2
import pytest
from sse_starlette.event import ensure_bytes

from gateway.front.http import transport
from gateway.front.http.transport import Emit, SessionTransport, frame
from tests.fixtures.asgi_wire import Wire
from tests.fixtures.gateway_proc import PYTHON, GatewayProcesses, echo_argv
from tests.fixtures.raw_http import INITIALIZE, headers, messages, sse_events

pytestmark = pytest.mark.anyio

RESUMABLE = "2025-11-25"
"""The first version whose streams open with a priming event (SEP-1699)."""


@pytest.mark.parametrize(
    "event",
    [
        {"id": "7", "data": "", "retry": 1000},  # a priming event
        {"id": "8", "data": ""},
        {"event": "message", "data": '{"jsonrpc":"2.0","id":1,"result":{}}', "id": "9"},
        {"event": "message", "data": '{"jsonrpc":"2.0","method":"notifications/progress"}'},
        {"data": "two\nlines"},
    ],
)
def test_an_event_is_framed_as_sse_starlette_framed_it(event: dict[str, Any]) -> None:
    assert frame(event) == ensure_bytes(event, "\r\n")


def session_transport() -> SessionTransport:
    return SessionTransport(mcp_session_id="s1")


async def test_a_quiet_stream_is_sent_a_comment_then_its_events_then_its_end(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "PING_S", 0.05)
    wire = Wire()

    async def produce(emit: Emit) -> None:
        await wire.pinged.wait()  # quiet until the stream was kept alive
        await emit(b"data: one\r\n\r\n")

    with anyio.fail_after(5):
        await session_transport()._stream(wire.receive, wire.send, produce)
    start = wire.sent[0]
    assert start["type"] == "http.response.start" and start["status"] == 200
    assert dict(start["headers"]) == {
        b"cache-control": b"no-cache, no-transform",
        b"connection": b"keep-alive",
        b"content-type": b"text/event-stream",
        b"mcp-session-id": b"s1",
        b"x-accel-buffering": b"no",
    }
    bodies = wire.bodies()
    assert bodies[0].startswith(b": ping - ") and bodies[0].endswith(b"\r\n\r\n")
    assert bodies[-2:] == [b"data: one\r\n\r\n", b""]
    assert wire.sent[-1]["more_body"] is False


async def test_a_client_that_leaves_ends_its_stream_and_what_fed_it() -> None:
    wire = Wire()
    fed = anyio.Event()
    cancelled = False

    async def produce(emit: Emit) -> None:
        nonlocal cancelled
        await emit(b"data: first\r\n\r\n")
        fed.set()
        try:
            await anyio.sleep_forever()
        except anyio.get_cancelled_exc_class():
            cancelled = True
            raise

    async def leave() -> None:
        await fed.wait()
        wire.leave.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(leave)
            await session_transport()._stream(wire.receive, wire.send, produce)
    assert cancelled
    assert wire.bodies() == [b"data: first\r\n\r\n"]  # no end written to a client that is gone


async def test_the_next_event_waits_while_the_connection_holds_too_much_unsent(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(transport, "UNSENT_POLL_S", 0.001)
    wire = Wire()
    held = transport.UNSENT_BYTES + 1  # what the client's connection holds unsent, as the edge would tell it
    second_emitted = anyio.Event()

    async def produce(emit: Emit) -> None:
        await emit(b"data: one\r\n\r\n")  # returns only once the connection took it
        await emit(b"data: two\r\n\r\n")
        second_emitted.set()

    async def client() -> None:
        nonlocal held
        with anyio.move_on_after(0.2):  # it does not read: the stream waits after its first event
            await second_emitted.wait()
        assert not second_emitted.is_set()
        assert wire.bodies() == [b"data: one\r\n\r\n"]
        held = transport.UNSENT_BYTES  # it read: the stream goes on
        await second_emitted.wait()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(client)
            await session_transport()._stream(wire.receive, wire.send, produce, lambda: held)
    assert wire.bodies() == [b"data: one\r\n\r\n", b"data: two\r\n\r\n", b""]


@pytest.mark.spawns
async def test_an_answer_is_one_json_body_unless_something_else_of_the_call_comes_first_or_it_runs_long(
    gateway_process: GatewayProcesses,
) -> None:
    config = f"servers:\n  e: {{transport: stdio, command: {PYTHON}, args: {json.dumps(echo_argv()[1:])}}}\n"
    gateway = gateway_process(config, tokens="alice=tok-alice")
    url = gateway.url("/mcp")

    def call(rid: int, name: str, arguments: dict[str, Any], progress: bool = False) -> dict[str, Any]:
        params = {"name": name, "arguments": arguments} | ({"_meta": {"progressToken": rid}} if progress else {})
        return {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": params}

    opening = {**INITIALIZE, "params": {**INITIALIZE["params"], "protocolVersion": RESUMABLE}}
    async with httpx2.AsyncClient(timeout=30) as http:
        with anyio.fail_after(60):
            opened = await http.post(url, json=opening, headers=headers("tok-alice"))
            assert opened.headers["content-type"] == "application/json"
            session = opened.headers["mcp-session-id"]
            asked = {**headers("tok-alice", session), "Mcp-Protocol-Version": RESUMABLE}
            quick = await http.post(url, json=call(5, "echo", {"text": "hi"}), headers=asked)
            streamed = await http.post(url, json=call(6, "slow", {"steps": 2}, progress=True), headers=asked)
            # A call still running after the hold: its stream starts (primed, so its client can resume it) before
            # its answer, which never comes.
            async with http.stream("POST", url, json=call(7, "sleep", {"seconds": 3600}), headers=asked) as long:
                assert long.headers["content-type"] == "text/event-stream"
                first = await anext(long.aiter_text())
    # Nothing but its response was sent for the call: one JSON body, nothing stored to resume.
    assert quick.status_code == 200 and quick.headers["content-type"] == "application/json"
    assert quick.headers["mcp-session-id"] == session
    assert quick.json()["id"] == 5 and quick.json()["result"]["content"][0]["text"] == "hi"
    # Progress came first: an event stream, its priming event before anything of it, each event numbered after it.
    assert streamed.status_code == 200 and streamed.headers["content-type"] == "text/event-stream"
    priming, *events = sse_events(streamed.text)
    assert priming["data"] == "" and priming["retry"] == "1000"
    assert [int(e["id"]) > int(priming["id"]) for e in events] == [True, True, True]
    *progress, answer = messages(streamed)
    assert [p["params"]["progress"] for p in progress] == [1, 2]
    assert answer["id"] == 6 and answer["result"]["content"][0]["text"] == "done 2"
    (primed,) = sse_events(first)
    assert primed["data"] == "" and primed["retry"] == "1000"


async def test_a_call_its_client_cancels_is_answered_on_an_event_stream(gateway_process: GatewayProcesses) -> None:
    """Its client no longer reads the answer: the SDK's client forwards a JSON body to its session even after the
    session closed, and fails as it exits (a late event of a stream it drops), so the -32800 goes on a stream."""
    config = f"servers:\n  e: {{transport: stdio, command: {PYTHON}, args: {json.dumps(echo_argv()[1:])}}}\n"
    gateway = gateway_process(config, tokens="alice=tok-alice")
    url = gateway.url("/mcp")
    opening = {**INITIALIZE, "params": {**INITIALIZE["params"], "protocolVersion": RESUMABLE}}
    call = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "tools/call",
        "params": {"name": "sleep", "arguments": {"seconds": 60}},
    }
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 9, "reason": "enough"}}
    answered = anyio.Event()
    answers: list[httpx2.Response] = []
    async with httpx2.AsyncClient(timeout=30) as http:
        with anyio.fail_after(60):
            opened = await http.post(url, json=opening, headers=headers("tok-alice"))
            asked = {**headers("tok-alice", opened.headers["mcp-session-id"]), "Mcp-Protocol-Version": RESUMABLE}

            async def calling() -> None:
                answers.append(await http.post(url, json=call, headers=asked))
                answered.set()

            async with anyio.create_task_group() as tg:
                tg.start_soon(calling)
                while not answered.is_set():  # cancelled as soon as the gateway has the call (well within HOLD_S)
                    assert (await http.post(url, json=cancel, headers=asked)).status_code == 202
                    with anyio.move_on_after(0.02):
                        await answered.wait()
    (answer,) = answers
    assert answer.headers["content-type"] == "text/event-stream"
    (refused,) = messages(answer)
    assert refused["id"] == 9 and refused["error"]["code"] == -32800
