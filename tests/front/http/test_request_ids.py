"""Request ids at the edge of ``/mcp`` (gateway/edge.py): an id a caller reuses, or an id of an odd type, gets a
clear answer and harms no other request.

Real processes: the gateway (``python -m gateway serve``) in front of tests/fixtures/echo_server.py over stdio; raw
HTTP posts in the session era (2025-11-25, ``Mcp-Session-Id``) and the stateless era (2026-07-28). A request is
known to be in flight once its stream carried a progress notification from the downstream (tool ``slow``); no test
sleeps.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from gateway.front.http.request_ids import RELEASE_GRACE_S, InFlight
from tests.fixtures.gateway_proc import GatewayProcesses
from tests.fixtures.procs import RunningServer
from tests.fixtures.waiting import eventually
from tests.front.http.test_body import MODERN, WAIT, Raw, echo_config

pytestmark = pytest.mark.anyio

SESSION = "2025-11-25"


@pytest.fixture(scope="module")
def gateway(tmp_path_factory: pytest.TempPathFactory, gateway_process: GatewayProcesses) -> RunningServer:
    folder: Path = tmp_path_factory.mktemp("ids")
    return gateway_process(echo_config({"audit": {"path": str(folder / "audit.db")}}), folder=folder)


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
    """One POST whose SSE answer is read as it comes: ``wait_running`` returns once the downstream reported
    progress (the request is in flight end to end), ``answer`` reads on to its JSON-RPC answer."""

    def __init__(self, lines: AsyncIterator[str]) -> None:
        self.lines = lines

    async def _message(self) -> dict[str, Any]:
        fields: dict[str, str] = {}
        async for line in self.lines:
            if line:
                name, _, value = line.partition(":")
                fields[name] = value.removeprefix(" ")
            elif fields.get("data"):
                return dict(json.loads(fields["data"]))
            else:
                fields = {}  # the priming event (no data), or a blank line
        raise AssertionError("the stream ended without a complete message")

    async def wait_running(self) -> None:
        with anyio.fail_after(WAIT):
            message = await self._message()
        assert message.get("method") == "notifications/progress", message

    async def answer(self) -> dict[str, Any]:
        with anyio.fail_after(WAIT):
            while True:
                message = await self._message()
                if "result" in message or "error" in message:
                    return message


def slow(raw: Raw, request_id: Any, seconds: float = 4.0, steps: int = 2) -> dict[str, Any]:
    """A ``slow`` call reporting progress at once and then every ``seconds / steps``."""
    body = raw.call("slow", {"seconds": seconds, "steps": steps}, request_id)
    body["params"].setdefault("_meta", {})["progressToken"] = f"p{request_id}"
    return body


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


async def send(raw: Raw, message: dict[str, Any]) -> int:
    """Post a notification or a response; its HTTP status."""
    with anyio.fail_after(WAIT):
        return (await raw.http.post(raw.url, headers=raw.headers, json=message)).status_code


async def test_a_duplicate_id_in_flight_is_refused_and_the_first_request_and_the_session_go_on(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    raw = await opened(http, gateway)
    async with streaming(raw, slow(raw, 7, seconds=6.0)) as first:  # 3 s to the next progress, 6 s to the answer
        await first.wait_running()

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
        assert answered["id"] == 7 and text(answered) == "done 2"
    assert text(await echo(raw, "again", 7)) == "again"  # released once its answer left


async def test_whatever_a_duplicate_id_is_answered_the_first_request_is_answered_and_no_request_hangs(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    """The reported hang: on the SDK alone the duplicate takes over the first request's stream (both are keyed by
    ``str(id)`` in the transport and by id in the dispatcher), so the first is never answered."""
    raw = await opened(http, gateway)
    async with streaming(raw, slow(raw, 9, seconds=1.0)) as first:
        await first.wait_running()
        await raw.post(json.dumps(raw.call("echo", {"text": "duplicate"}, 9)))  # bounded by WAIT in Raw.post
        answered = await first.answer()  # bounded by WAIT
    assert answered["id"] == 9 and text(answered) == "done 2"
    assert text(await echo(raw, "after", 10)) == "after"


@pytest.mark.parametrize("era", [SESSION, MODERN])
async def test_the_same_id_on_another_session_or_another_stateless_post_is_an_independent_request(
    http: httpx2.AsyncClient, gateway: RunningServer, era: str
) -> None:
    mine, other = await opened(http, gateway, era), await opened(http, gateway, era)
    if era == MODERN:  # a stray session header changes nothing: the SDK routes by the protocol version header
        mine.headers["mcp-session-id"] = other.headers["mcp-session-id"] = "0" * 32
    async with streaming(mine, slow(mine, 7)) as first:
        await first.wait_running()
        assert text(await echo(other, "other", 7)) == "other"
        assert text(await echo(mine if era == MODERN else other, "again", 7)) == "again"
        answered = await first.answer()
    assert answered["id"] == 7 and text(answered) == "done 2"


async def test_a_cancelled_request_frees_its_id_and_a_cancel_from_another_session_cancels_nothing(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    raw, other = await opened(http, gateway), await opened(http, gateway)
    async with streaming(raw, slow(raw, 11, seconds=3600, steps=1)) as first:
        await first.wait_running()
        cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 11}}
        assert await send(other, cancel) == 202  # another session's id 11 is another request
        assert (await raw.post(json.dumps(raw.call("echo", {"text": "x"}, 11))))[0] == 400  # still in flight
        assert await send(raw, cancel) == 202
        answered = await first.answer()
    assert answered == {"jsonrpc": "2.0", "id": 11, "error": {"code": -32800, "message": "Request cancelled"}}
    assert text(await echo(raw, "reused", 11)) == "reused"


async def reuse_until_served(raw: Raw, body: dict[str, Any]) -> list[dict[str, Any] | None]:
    """Post ``body`` again and again (bounded) until it is served; every answer, in order."""
    answers: list[dict[str, Any] | None] = []

    async def served() -> bool:
        answers.append((await raw.post(json.dumps(body)))[1])
        return "result" in (answers[-1] or {})

    await eventually(served, within=WAIT)
    refused = [a for a in answers[:-1] if a is not None]
    assert all(a["error"]["code"] == -32600 for a in refused), refused  # refused until then, never hung
    return answers


async def test_an_abandoned_request_holds_its_id_until_answered_so_a_reuse_gets_its_own_answer_never_the_old_one(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    """The reported misdelivery: the client drops a POST while the downstream works on it; the SDK goes on with the
    request, and a new request reusing the id on the session was handed the abandoned one's answer ("done 1")."""
    raw = await opened(http, gateway)
    async with streaming(raw, slow(raw, 21, seconds=2.0, steps=1)) as first:  # progress at once, "done 1" at 2 s
        await first.wait_running()
    # The connection is closed while the call runs on. A reuse outlasting it must be answered its own "slept".
    answers = await reuse_until_served(raw, raw.call("sleep", {"seconds": 3.0}, 21))
    assert answers[-1] is not None and answers[-1]["id"] == 21 and text(answers[-1]) == "slept", answers
    assert len(answers) > 1  # refused while the abandoned call ran: it was not over when the client left
    assert text(await echo(raw, "after", 22)) == "after"


async def test_an_abandoned_request_that_is_cancelled_frees_its_id(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    raw = await opened(http, gateway)
    async with streaming(raw, slow(raw, 12, seconds=3600, steps=1)) as first:
        await first.wait_running()
    # Gone, but the call runs on (for an hour, or the backend's timeout): the id stays held, refused at once...
    status, answer = await raw.post(json.dumps(raw.call("echo", {"text": "too soon"}, 12)))
    assert status == 400 and answer is not None and answer["error"]["code"] == -32600, answer
    # ...until the call is answered, here by its cancellation (the SDK answers it -32800, to no one).
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 12}}
    assert await send(raw, cancel) == 202
    answers = await reuse_until_served(raw, raw.call("echo", {"text": "reused"}, 12))
    assert text(answers[-1]) == "reused"


async def held(http: httpx2.AsyncClient, gateway: RunningServer) -> int:
    with anyio.fail_after(WAIT):
        return int((await http.get(gateway.url("/status"))).json()["sessions"]["ids_held"])


async def test_an_abandoned_requests_id_is_held_no_longer_than_its_session(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    raw = await opened(http, gateway)
    assert await held(http, gateway) == 0  # the earlier tests' abandoned calls were answered: nothing kept
    async with streaming(raw, slow(raw, 31, seconds=3600, steps=1)) as first:
        await first.wait_running()

    async def holding() -> bool:
        return await held(http, gateway) == 1

    await eventually(holding, within=WAIT)  # the gateway noticed the client left; the call runs on
    with anyio.fail_after(WAIT):
        assert (await http.delete(raw.url, headers=raw.headers)).status_code == 200

    async def free() -> bool:
        return await held(http, gateway) == 0

    await eventually(free, within=WAIT)  # nothing will answer it now: the hold ended with its session
    assert (await raw.post(json.dumps(raw.call("echo", {"text": "x"}, 31))))[0] == 404


async def test_responses_and_notifications_with_bogus_ids_are_accepted_and_harm_no_request(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    raw = await opened(http, gateway)
    async with streaming(raw, slow(raw, 13)) as first:
        await first.wait_running()
        bogus = [
            {"jsonrpc": "2.0", "id": 13, "result": {}},  # a "response" bearing the in-flight request's id
            {"jsonrpc": "2.0", "id": 999999, "error": {"code": -1, "message": "answer to nothing"}},
            {"jsonrpc": "2.0", "id": "nobody", "result": {"x": 1}},
            {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": 999999}},
            {"jsonrpc": "2.0", "method": "notifications/progress", "params": {"progressToken": "p13", "progress": 9}},
        ]
        for message in bogus:
            assert await send(raw, message) == 202, message
        assert text(await echo(raw, "bystander", 14)) == "bystander"
        answered = await first.answer()
    assert answered["id"] == 13 and text(answered) == "done 2"


@pytest.mark.parametrize("era", [SESSION, MODERN])
@pytest.mark.parametrize(
    "request_id",
    [2**70, -int("9" * 4299), 0, "", "ü" * 300, "0x7"],
    ids=["2**70", "4299-digits", "zero", "empty", "long", "hex"],
)
async def test_an_id_of_an_unusual_but_valid_value_is_answered_with_exactly_that_id(
    http: httpx2.AsyncClient, gateway: RunningServer, era: str, request_id: Any
) -> None:
    raw = await opened(http, gateway, era)
    answer = await echo(raw, "odd", request_id)
    assert answer is not None and answer["id"] == request_id and type(answer["id"]) is type(request_id)
    assert text(answer) == "odd"


@pytest.mark.parametrize("era", [SESSION, MODERN])
@pytest.mark.parametrize(
    ("request_id", "code", "message"),
    [
        ("1" * 5000, -32700, "Parse error"),  # beyond Python's int limit: the SDK's parse error stands
        ("7.0", -32600, "Invalid Request: a request's id must be a string or an integer, not float."),
        ("1e400", -32600, "Invalid Request: a request's id must be a string or an integer, not float."),
    ],
    ids=["5000-digits", "integral-float", "overflowing-float"],
)
async def test_an_id_no_integer_or_string_can_hold_is_refused_and_the_session_goes_on(
    http: httpx2.AsyncClient, gateway: RunningServer, era: str, request_id: str, code: int, message: str
) -> None:
    raw = await opened(http, gateway, era)
    body = json.dumps(raw.call("echo", {"text": "x"}, 1)).replace('"id": 1', f'"id": {request_id}')
    headers = {**raw.headers, **({"mcp-method": "tools/call", "mcp-name": "echo"} if era == MODERN else {})}
    with anyio.fail_after(WAIT):
        response = await http.post(raw.url, headers=headers, content=body)
    assert response.status_code == 400
    answer = response.json()
    assert answer["id"] is None and answer["error"]["code"] == code
    assert answer["error"]["message"].startswith(message)
    assert text(await echo(raw, "after", 1)) == "after"


async def test_the_in_flight_table_frees_every_claim_and_hands_a_waiting_reuse_the_id_when_its_holder_ends() -> None:
    table = InFlight()
    key = ("caller", "session", 7)
    assert await table.claim(key) and len(table) == 1
    with anyio.fail_after(RELEASE_GRACE_S + WAIT):
        assert not await table.claim(key)  # still held after the grace: refused, and the holder keeps it
    assert len(table) == 1
    claimed: list[bool] = []
    async with anyio.create_task_group() as tasks:

        async def reuse() -> None:
            claimed.append(await table.claim(key))

        tasks.start_soon(reuse)
        await anyio.wait_all_tasks_blocked()  # the reuse is waiting on the holder
        table.release(key)
    assert claimed == [True] and len(table) == 1
    table.release(key)
    assert len(table) == 0


async def test_resuming_a_stream_replays_only_this_sessions_request_of_that_id_never_another_sessions(
    http: httpx2.AsyncClient, gateway: RunningServer
) -> None:
    """The SDK names a request's resumable stream by its id and shares one event store between sessions: without a
    view per session (events.py), a resume of stream 5 replayed another session's answer to its own request 5."""
    mine, other = await opened(http, gateway), await opened(http, gateway)
    body = json.dumps(mine.call("sleep", {"seconds": 2.0}, 5))
    with anyio.fail_after(WAIT):
        async with http.stream("POST", mine.url, headers=mine.headers, content=body) as response:
            async for line in response.aiter_lines():  # the priming event's id, then the connection drops
                if line.startswith("id:"):
                    last = line.removeprefix("id:").strip()
                    break
    assert text(await echo(other, "the other session's answer", 5)) == "the other session's answer"

    resume = {**mine.headers, "last-event-id": last}
    with anyio.fail_after(WAIT):
        async with http.stream("GET", mine.url, headers=resume) as resumed:
            assert resumed.status_code == 200
            replayed = await Stream(resumed.aiter_lines()).answer()
    assert replayed["id"] == 5 and text(replayed) == "slept"  # its own answer, not the other session's


async def test_an_id_whose_post_ended_unanswered_is_held_until_its_answer_or_its_sessions_end_and_never_kept() -> None:
    table = InFlight()
    table.answers_known = True  # as CallerSessions sets it when it feeds ``answered``
    first, second, third = ("c", "s", 7), ("c", "s", 8), ("c", "other", 7)
    for key in (first, second, third):
        assert await table.claim(key)
    table.release(first, pending=True)  # its POST ended unanswered: held
    assert len(table) == 3 and table.held == 1
    with anyio.fail_after(RELEASE_GRACE_S + WAIT):
        assert not await table.claim(first)  # a reuse is refused while the SDK still works on it
    table.answered("other", 7)  # another session's 7 is not this one
    assert table.held == 1
    table.answered("s", 7)  # the SDK produced its answer (to no one): free
    assert table.held == 0 and len(table) == 2
    assert await table.claim(first)

    table.answered("s", 8)  # answered while its POST is still sending it: freed when the POST ends, not held
    table.release(second, pending=True)
    assert len(table) == 2 and table.held == 0

    table.release(first, pending=True)
    table.release(third, pending=True)  # "other" answered its 7 above, before this POST ended: not held
    assert table.held == 1
    table.session_ended("s")  # its session ended: nothing will answer it any more
    assert table.held == 0 and await table.claim(first)
    table.session_ended("s")  # a POST still ending on an ended session is not held
    table.release(first, pending=True)
    assert await table.claim(second)
    table.release(second, pending=False)  # refused before the SDK (a 404, 429, ...): never held
    assert len(table) == 0 and table.held == 0

    unfed = InFlight()  # nothing tells it of answers: it never holds what it could not free
    assert await unfed.claim(first)
    unfed.release(first, pending=True)
    assert len(unfed) == 0
