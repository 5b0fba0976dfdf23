"""Request ids at the edge of ``/mcp`` (gateway/edge.py): an id a caller reuses, or an id of an odd type, gets a
clear answer and harms no other request.

Real processes: the gateway (``python -m gateway serve``) in front of tests/fixtures/echo_server.py over stdio; raw
HTTP posts in the session era (2025-11-25, ``Mcp-Session-Id``) and the stateless era (2026-07-28). A request is
known to be in flight once its SSE stream has sent the priming event (the gateway keeps resumable streams), which
is written after the edge passed the request on and the SDK registered its stream; no test sleeps.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.fixtures.procs import RunningServer
from tests.test_edge import MODERN, WAIT, Raw, echo_gateway

pytestmark = pytest.mark.anyio

SESSION = "2025-11-25"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningServer]:
    folder: Path = tmp_path_factory.mktemp("ids")
    with echo_gateway(folder, {"audit": {"path": str(folder / "audit.db")}}) as server:
        yield server


@pytest.fixture
async def http() -> AsyncIterator[httpx2.AsyncClient]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(WAIT)) as client:
        yield client


async def opened(http: httpx2.AsyncClient, gateway: RunningServer, era: str = SESSION) -> Raw:
    raw = Raw(http, gateway.url(), era)
    with anyio.fail_after(WAIT):
        await raw.open()
    return raw


class Stream:
    """One POST whose SSE answer is read as it comes: ``wait_primed`` returns once the request is in flight,
    ``answer`` reads on to its JSON-RPC answer."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self.lines = lines

    async def _event(self) -> dict[str, str]:
        fields: dict[str, str] = {}
        async for line in self.lines:
            if not line:
                if fields:
                    return fields
                continue
            name, _, value = line.partition(":")
            fields[name] = value.removeprefix(" ")
        raise AssertionError(f"the stream ended without a complete event (read {fields})")

    async def wait_primed(self) -> None:
        with anyio.fail_after(WAIT):
            event = await self._event()
        assert event.get("data", "") == "" and "id" in event, event  # the priming event

    async def answer(self) -> dict[str, Any]:
        with anyio.fail_after(WAIT):
            while True:
                data = (await self._event()).get("data", "")
                message = json.loads(data) if data else {}
                if "result" in message or "error" in message:
                    return message


@asynccontextmanager
async def streaming(raw: Raw, body: dict[str, Any]) -> AsyncIterator[Stream]:
    headers = dict(raw.headers)
    if raw.era == MODERN:
        headers.update({"mcp-method": body["method"], "mcp-name": body["params"]["name"]})
    async with raw.http.stream("POST", raw.url, headers=headers, content=json.dumps(body)) as response:
        assert response.status_code == 200 and response.headers["content-type"].startswith("text/event-stream")
        yield Stream(response.aiter_lines())


def text(answer: dict[str, Any] | None) -> str:
    assert answer is not None and "result" in answer, answer
    return str(answer["result"]["content"][0]["text"])


async def echo(raw: Raw, word: str, request_id: Any = ...) -> dict[str, Any] | None:
    return (await raw.post(json.dumps(raw.call("echo", {"text": word}, request_id))))[1]


async def test_a_duplicate_id_in_flight_is_refused_and_the_first_request_and_the_session_go_on(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    raw = await opened(http, gateway)
    async with streaming(raw, raw.call("sleep", {"seconds": 1.0}, 7)) as first:
        await first.wait_primed()

        status, answer = await raw.post(json.dumps(raw.call("echo", {"text": "second"}, 7)))
        assert status == 400
        assert answer == {
            "jsonrpc": "2.0",
            "id": 7,
            "error": {"code": -32600, "message": "Invalid Request: request id 7 is already in flight on this session."},
        }
        # The SDK correlates "7" with 7 (mcp.shared.dispatcher.coerce_request_id): the same id to it, so refused too.
        status, answer = await raw.post(json.dumps(raw.call("echo", {"text": "third"}, "7")))
        assert status == 400 and answer is not None and answer["id"] == "7"
        assert answer["error"]["message"] == "Invalid Request: request id '7' is already in flight on this session."
        assert text(await echo(raw, "bystander", 8)) == "bystander"  # the session serves other ids meanwhile

        answered = await first.answer()
        assert answered["id"] == 7 and text(answered) == "slept"
    assert text(await echo(raw, "again", 7)) == "again"  # released once its answer left


async def test_whatever_a_duplicate_id_is_answered_the_first_request_is_answered_and_no_request_hangs(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    """The reported hang: on the SDK alone the duplicate takes over the first request's stream (both are keyed by
    ``str(id)`` in the transport and by id in the dispatcher), so the first is never answered."""
    raw = await opened(http, gateway)
    async with streaming(raw, raw.call("sleep", {"seconds": 0.5}, 9)) as first:
        await first.wait_primed()
        await raw.post(json.dumps(raw.call("echo", {"text": "duplicate"}, 9)))  # bounded by WAIT in Raw.post
        answered = await first.answer()  # bounded by WAIT
    assert answered["id"] == 9 and text(answered) == "slept"
    assert text(await echo(raw, "after", 10)) == "after"
