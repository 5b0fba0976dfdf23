"""How a 2026-07-28 request's answer is written (gateway/front/http/stateless.py): one JSON body when the response
comes first, an event stream when a notification for it does or it runs silent past ``PING_S``; a client that
leaves a request running past ``HOLD_S`` cancels it; nothing is written after the answer."""

from __future__ import annotations

import json
from typing import Any

import anyio
import pytest
from starlette.requests import Request

from gateway.front.http import stateless, transport
from gateway.front.http.stateless import _answer_held, _Exchange
from tests.fixtures.asgi_wire import Wire

pytestmark = pytest.mark.anyio

ANSWER = {"jsonrpc": "2.0", "id": 7, "result": {"content": []}}


def exchange(wire: Wire, progress_token: Any = None) -> _Exchange:
    scope = {"type": "http", "method": "POST", "headers": [], "path": "/mcp", "query_string": b""}
    made = _Exchange(Request(scope, wire.receive), 7, progress_token, wire.send)
    made.streams = True
    return made


def events(body: bytes) -> list[dict[str, Any]]:
    return [json.loads(line[6:]) for line in body.decode().split("\r\n") if line.startswith("data: ")]


async def test_a_response_that_comes_first_is_one_json_body_and_nothing_watches_the_client() -> None:
    wire = Wire()

    async def serve() -> dict[str, Any]:
        return ANSWER

    with anyio.fail_after(5):
        await _answer_held(exchange(wire), serve(), wire.receive)
    status, headers = wire.head()
    assert status == 200 and headers[b"content-type"] == b"application/json"
    assert [json.loads(body) for body in wire.bodies()] == [ANSWER]
    assert not wire.reading.is_set()  # answered within HOLD_S: no task was started to watch the client


async def test_a_notification_before_the_response_makes_the_answer_an_event_stream() -> None:
    wire = Wire()
    made = exchange(wire, progress_token="p1")

    async def serve() -> dict[str, Any]:
        await made.progress(1, 2, "half")
        return ANSWER

    with anyio.fail_after(5):
        await _answer_held(made, serve(), wire.receive)
    status, headers = wire.head()
    assert status == 200 and headers[b"content-type"] == b"text/event-stream"
    sent = [event for body in wire.bodies() for event in events(body)]
    progress = {"progressToken": "p1", "progress": 1, "total": 2, "message": "half"}
    assert sent == [{"jsonrpc": "2.0", "method": "notifications/progress", "params": progress}, ANSWER]
    assert wire.sent[-1]["more_body"] is False


async def test_nothing_is_written_after_the_answer() -> None:
    wire = Wire()
    made = exchange(wire, progress_token="p1")

    async def serve() -> dict[str, Any]:
        await made.progress(1)
        return ANSWER

    with anyio.fail_after(5):
        await _answer_held(made, serve(), wire.receive)
        await made.progress(2)  # a late notification (a backend's, after the call ended)
        await made.emit(b": ping\r\n\r\n")
    assert [event for body in wire.bodies() for event in events(body)][-1] == ANSWER
    assert wire.sent[-1]["more_body"] is False


async def test_a_client_that_leaves_a_running_request_cancels_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(stateless, "HOLD_S", 0.01)
    wire = Wire()
    cancelled = anyio.Event()

    async def serve() -> dict[str, Any]:
        try:
            await anyio.sleep_forever()
        finally:
            cancelled.set()
        return ANSWER  # never

    async def leave() -> None:
        await wire.reading.wait()  # the watcher started (after HOLD_S)
        wire.leave.set()

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(leave)
            await _answer_held(exchange(wire), serve(), wire.receive)
    assert cancelled.is_set()
    assert wire.sent == []  # the client is gone: nothing is written


async def test_a_request_silent_past_the_ping_interval_is_kept_alive_on_an_event_stream(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(stateless, "HOLD_S", 0.01)
    monkeypatch.setattr(transport, "PING_S", 0.05)  # the shared watcher's (transport.watch_client)
    wire = Wire()

    async def serve() -> dict[str, Any]:
        await wire.pinged.wait()
        return ANSWER

    with anyio.fail_after(5):
        await _answer_held(exchange(wire), serve(), wire.receive)
    status, headers = wire.head()
    assert status == 200 and headers[b"content-type"] == b"text/event-stream"
    bodies = wire.bodies()
    assert bodies[0] == b": ping\r\n\r\n"
    assert events(bodies[-1]) == [ANSWER] and wire.sent[-1]["more_body"] is False
