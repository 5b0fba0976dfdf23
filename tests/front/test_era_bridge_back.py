"""A handshake-era (2025-11-25) client served by a downstream that speaks the stateless 2026-07-28 era alone.

Real processes: tests/fixtures/conformance_server.py over streamable HTTP with `--era 2026-07-28` (it refuses
`initialize`, so the gateway learns at connect that it speaks that era only; no `protocol:` is declared) behind a
real `gateway serve`; the client is the SDK's `Client` in the handshake era. What that era does on the session and
the 2026-07-28 era per request is carried across: the client's log level goes in each request's `_meta`, an
input-required result becomes requests on the call's own stream, and `resources/subscribe` is served by the
downstream's `subscriptions/listen` stream.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import ExitStack, asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from gateway.front.eras import MAX_ROUNDS
from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import one_backend_config, run_gateway
from tests.fixtures.procs import conformance_server_argv, free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

WATCHED = "test://watched-resource"


@pytest.fixture
def modern(downstream: Downstreams) -> Downstream:
    return downstream("conformance", "streamable_http", "--era", "2026-07-28", own=True)


class Heard:
    """What a handshake-era client hears besides its answers: log messages and resource updates."""

    def __init__(self) -> None:
        self.logs: list[str] = []
        self.updated: list[str] = []
        self.update_seen = anyio.Event()
        self.tools_changed = anyio.Event()

    async def log(self, params: types.LoggingMessageNotificationParams) -> None:
        self.logs.append(str(params.data))

    async def message(self, message: Any) -> None:
        if isinstance(message, types.ResourceUpdatedNotification):
            self.updated.append(str(message.params.uri))
            self.update_seen.set()
        if isinstance(message, types.ToolListChangedNotification):
            self.tools_changed.set()

    async def elicit(self, context: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        return types.ElicitResult(action="accept", content={"response": f"yes to {params.message}"})


@asynccontextmanager
async def handshake_client(url: str, heard: Heard) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(20)) as http:
        async with Client(
            streamable_http_client(url, http_client=http),
            mode="legacy",
            logging_callback=heard.log,
            message_handler=heard.message,
            elicitation_callback=heard.elicit,
            cache=None,
        ) as c:
            yield c


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def _config(modern: Downstream) -> str:
    return one_backend_config("bridge-back", "modern", transport="streamable_http", url=modern.url())


async def test_a_handshake_clients_log_level_reaches_a_stateless_downstream(modern: Downstream, tmp_path: Path) -> None:
    # A 2026-07-28 server sends log messages only at the level a request's _meta asks for (none when absent); a
    # handshake-era client gets every level until it sets one, as it would from a server of its own era.
    with run_gateway(_config(modern), tmp_path) as gateway:
        heard = Heard()
        with anyio.fail_after(40):
            async with handshake_client(gateway.url(), heard) as c:
                assert _text(await c.call_tool("test_tool_with_logging", {})) == (
                    "Tool with logging executed successfully"
                )
                assert heard.logs == ["Tool execution started", "Tool processing data", "Tool execution completed"]
                level = types.SetLevelRequest(params=types.SetLevelRequestParams(level="warning"))
                await c.session.send_request(level, types.EmptyResult)  # the Client's own method warns (2026)
                heard.logs.clear()
                await c.call_tool("test_tool_with_logging", {})
                assert heard.logs == []


async def test_an_input_required_result_is_asked_on_the_handshake_clients_call_stream(
    modern: Downstream, tmp_path: Path
) -> None:
    with run_gateway(_config(modern), tmp_path) as gateway:
        heard = Heard()
        with anyio.fail_after(40):
            async with handshake_client(gateway.url(), heard) as c:
                answered = _text(await c.call_tool("test_elicitation", {"message": "Proceed?"}))
    assert answered == 'User response: action=accept, content={"response": "yes to Proceed?"}'


async def _subscription(c: Client, uri: str, *, on: bool = True) -> None:
    """resources/subscribe (or unsubscribe) as a handshake-era client sends it (the Client's own methods warn)."""
    if on:
        await c.session.send_request(
            types.SubscribeRequest(params=types.SubscribeRequestParams(uri=uri)), types.EmptyResult
        )
    else:
        request = types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=uri))
        await c.session.send_request(request, types.EmptyResult)


def _listens(output: str) -> list[int]:
    """The resources each listen stream the gateway opened to the downstream carried, in order."""
    return [
        int(line["resources"])
        for line in (json.loads(raw) for raw in output.splitlines() if raw.startswith("{"))
        if line.get("event") == "backend.listen_open"
    ]


async def test_resources_subscribe_is_served_by_the_downstreams_listen_stream(
    modern: Downstream, tmp_path: Path
) -> None:
    # That era has no resources/subscribe: the subscribed URIs are the resourceSubscriptions of the gateway's listen
    # stream to the downstream, re-opened as they change; the updates reach exactly the clients that subscribed.
    with run_gateway(_config(modern), tmp_path) as gateway:
        watcher, bystander = Heard(), Heard()
        with anyio.fail_after(40):
            async with handshake_client(gateway.url(), watcher) as w, handshake_client(gateway.url(), bystander) as b:
                await _subscription(w, WATCHED)
                assert _listens(gateway.output())[-1] == 1
                await b.call_tool("test_update_watched_resource", {})
                await watcher.update_seen.wait()
                await b.call_tool("test_simple_text", {})  # a round trip on the bystander's own stream
                await _subscription(w, WATCHED, on=False)
                await eventually(lambda: _listens(gateway.output())[-1] == 0, within=10)
                await _subscription(w, WATCHED)  # and again: a stream with it is acknowledged before the answer
                assert _listens(gateway.output())[-1] == 1
    assert watcher.updated == [WATCHED]
    assert bystander.updated == []


class Answering(Heard):
    """A client that declares and answers all three kinds of input request."""

    async def sample(self, context: object, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        return types.CreateMessageResult(role="assistant", content=types.TextContent(text="Paris"), model="m")

    async def roots(self, context: object) -> types.ListRootsResult:
        return types.ListRootsResult(roots=[types.Root(uri="file:///work")])  # type: ignore[arg-type]


async def test_every_kind_of_input_request_and_several_rounds_reach_a_handshake_client(
    modern: Downstream, tmp_path: Path
) -> None:
    # The suite's input-required tools and prompt of the 2026-only target, called by a handshake-era client: each
    # request is asked on the call's own stream, the answers go back as the retry's input responses with the
    # downstream's (sealed) requestState, over as many rounds as the server takes.
    heard = Answering()
    with run_gateway(_config(modern), tmp_path) as gateway:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(20)) as http:
            async with Client(
                streamable_http_client(gateway.url(), http_client=http),
                mode="legacy",
                elicitation_callback=heard.elicit,
                sampling_callback=heard.sample,
                list_roots_callback=heard.roots,
                cache=None,
            ) as c:
                with anyio.fail_after(40):
                    sampled = await c.call_tool("test_input_required_result_sampling", {})
                    rooted = await c.call_tool("test_input_required_result_list_roots", {})
                    several = await c.call_tool("test_input_required_result_multiple_inputs", {})
                    rounds = await c.call_tool("test_input_required_result_multi_round", {})
                    prompt = await c.get_prompt("test_input_required_result_prompt")
    assert _text(sampled) == "Sampling said: Paris"
    assert _text(rooted) == "Client roots: file:///work"
    assert _text(several) == (
        "All inputs received: user_name=yes to What is your name?; greeting=Paris; client_roots=file:///work"
    )
    assert _text(rounds) == (
        "Hello yes to Step 1: What is your name?, your favorite color is yes to Step 2: What is your favorite color?."
    )
    (message,) = prompt.messages
    assert isinstance(message.content, types.TextContent)
    assert message.content.text == "Answer with this context in mind: yes to What context should the prompt use?"


async def test_the_rounds_asked_for_a_handshake_client_are_bounded(downstream: Downstreams, tmp_path: Path) -> None:
    # tests/fixtures/mrtr_server.py's `interview` with no rounds asks again every time it is retried: the gateway
    # answers at most MAX_ROUNDS rounds for the client within its one call, then says so; one downstream request per
    # round.
    mrtr = downstream("mrtr", "streamable_http", "--era", "2026-07-28", own=True)
    asked: list[str] = []

    async def elicit(context: object, params: types.ElicitRequestParams) -> types.ElicitResult:
        asked.append(params.message)
        return types.ElicitResult(action="accept", content={"name": "Ada"})

    config = one_backend_config("bounded", "asker", transport="streamable_http", url=mrtr.url())
    with run_gateway(config, tmp_path) as gateway:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(20)) as http:
            async with Client(
                streamable_http_client(gateway.url(), http_client=http),
                mode="legacy",
                elicitation_callback=elicit,
                cache=None,
            ) as c:
                with anyio.fail_after(40), pytest.raises(MCPError) as endless:
                    await c.call_tool("interview", {"rounds": 0})
        counted = httpx2.get(mrtr.url("/rounds")).json()
    assert (
        endless.value.error.message
        == f"The server behind this request still asked for input after {MAX_ROUNDS} rounds."
    )
    assert asked == ["Your name?"] * MAX_ROUNDS
    assert counted["tools/call"] == MAX_ROUNDS + 1  # the first request, and one retry per round answered


async def test_a_list_change_heard_on_the_listen_stream_reaches_a_handshake_client(
    modern: Downstream, tmp_path: Path
) -> None:
    # That era announces a change only on a listen stream: the gateway's own stream to the downstream hears it, and
    # the handshake-era client that holds the list is told on its session.
    with run_gateway(_config(modern), tmp_path) as gateway:
        heard = Heard()
        with anyio.fail_after(40):
            async with handshake_client(gateway.url(), heard) as c:
                before = {tool.name: tool.description for tool in (await c.list_tools()).tools}
                await c.call_tool("test_trigger_tool_change", {})
                await heard.tools_changed.wait()
                after = {tool.name: tool.description for tool in (await c.list_tools()).tools}
    assert before["test_dynamic_tool"] != after["test_dynamic_tool"]


async def _state(http: httpx2.AsyncClient, url: str) -> str:
    return str((await http.get(url)).json()["backends"]["modern"])


async def test_a_subscription_outlives_the_downstreams_restart(tmp_path: Path) -> None:
    # The listen stream ends with the downstream; the session that comes back opens a new one with the URIs the
    # gateway's clients still hold, so an update after the restart reaches the subscriber, who did nothing meanwhile.
    port = free_port()
    argv = conformance_server_argv(port, "--era", "2026-07-28")
    config = one_backend_config(
        "restart", "modern", transport="streamable_http", url=f"http://127.0.0.1:{port}/mcp", ping_interval_s=0.3
    )
    heard = Heard()
    with ExitStack() as first:
        first.enter_context(start_http_server(argv, port))
        with run_gateway(config, tmp_path) as gateway:
            async with httpx2.AsyncClient() as http, handshake_client(gateway.url(), heard) as c:
                with anyio.fail_after(90):
                    await _subscription(c, WATCHED)
                    first.close()  # the downstream stops, and its listen stream with it
                    await eventually(lambda: _is(http, gateway.url("/healthz"), "failed"), within=30)
                    with start_http_server(argv, port):
                        await eventually(lambda: _listens(gateway.output()).count(1) >= 2, within=60)
                        await c.call_tool("test_update_watched_resource", {})
                        await heard.update_seen.wait()
    assert heard.updated == [WATCHED]


async def _is(http: httpx2.AsyncClient, url: str, state: str) -> bool:
    return await _state(http, url) == state


async def test_a_handshake_client_that_lost_its_stream_resumes_it_from_the_gateway(
    modern: Downstream, tmp_path: Path
) -> None:
    # SEP-1699 at the gateway's edge, whatever era the downstream speaks: the call's stream starts with a priming
    # event; a client whose connection drops after it resumes with Last-Event-ID and gets the answer the gateway
    # kept for it, though the 2026-07-28 downstream knows nothing of streams to resume.
    accept = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    initialize = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}},
    }
    params = {"name": "test_tool_with_progress", "_meta": {"progressToken": "p"}}  # progress first: a stream
    call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": params}
    with run_gateway(_config(modern), tmp_path) as gateway:
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(20)) as http:
            with anyio.fail_after(40):
                opened = await http.post(gateway.url(), json=initialize, headers=accept)
                session = {
                    **accept,
                    "Mcp-Session-Id": opened.headers["mcp-session-id"],
                    "Mcp-Protocol-Version": "2025-11-25",
                }
                note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
                assert (await http.post(gateway.url(), json=note, headers=session)).status_code == 202
                primed = None
                async with http.stream("POST", gateway.url(), json=call, headers=session) as stream:
                    async for line in stream.aiter_lines():  # the priming event, then the client walks away
                        if line.startswith("id:"):
                            primed = line[3:].strip()
                            break
                assert primed is not None
                result = None
                resuming = {**session, "Last-Event-ID": primed}
                async with http.stream("GET", gateway.url(), headers=resuming) as resumed:
                    async for line in resumed.aiter_lines():
                        message = json.loads(line[5:]) if line.startswith("data:") and line[5:].strip() else {}
                        if message.get("id") == 2:
                            result = message["result"]
                            break
    assert result is not None and not result["isError"]  # (its text: the token the gateway gave the downstream)
