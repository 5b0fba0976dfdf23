"""Protocol fidelity: everything besides tools passes through the gateway as if it were not there.

Real processes throughout: the gateway (`python -m gateway serve`) in front of tests/fixtures/fidelity_server.py three
times — over streamable HTTP (`h`), over stdio on one shared session (`s`) and over stdio with a session per client
(`p`, `session: per_client`) — and of tests/fixtures/conformance_server.py over streamable HTTP (`conf`). The three
fidelity servers offer the same prompts, resources and templates, so under conditional naming theirs are published
as `h__greet`, `s__fid://r/1`, ...; the conformance server's names collide with nothing and stay untouched. Each
result is compared with the same request sent to the downstream directly.
"""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client.client import Client
from mcp.client.session import ClientRequestContext, ClientSession
from mcp.client.stdio import StdioServerParameters, stdio_client
from mcp.shared.exceptions import MCPError

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import (
    FIDELITY,
    PYTHON,
    GatewayProcesses,
    answer_elicitation,
    answer_sampling,
    call_abandoning_sampling,
    echo_argv,
    first_text,
    mcp_session,
    run_gateway,
)
from tests.fixtures.procs import RunningServer, free_port, start_http_server
from tests.fixtures.raw_http import sse_events
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

WAIT = 10  # seconds: the bound on every wait for something another process sends


def _fidelity_argv(*extra: str) -> list[str]:
    return [PYTHON, FIDELITY, *extra]


@pytest.fixture(scope="module")
def fid_http(downstream: Downstreams) -> Downstream:
    return downstream("fidelity", "streamable_http", "--name", "h", own=True)  # the tests read what it writes


@pytest.fixture(scope="module")
def conf_http(downstream: Downstreams) -> Downstream:
    return downstream("conformance", "streamable_http")


@pytest.fixture(scope="module")
def gateway(
    fid_http: Downstream, conf_http: Downstream, downstream: Downstreams, gateway_process: GatewayProcesses
) -> RunningServer:
    over_stdio = {name: downstream("fidelity", "stdio", "--name", name) for name in ("s", "p")}
    # The SDK serves `h` in both eras over HTTP, but its tools ask mid-call, which only the handshake era can: declared
    # so, a stateless client's call of one is bridged (unlike a direct call in that era, which fails).
    config = f"""
gateway:
  audit: {{enabled: false}}
servers:
  h: {json.dumps(fid_http.settings(timeout_s=10, protocol="handshake"))}
  s: {json.dumps(over_stdio["s"].settings(timeout_s=10))}
  p: {json.dumps(over_stdio["p"].settings(session="per_client", timeout_s=10))}
  conf: {json.dumps(conf_http.settings())}
"""
    return gateway_process(config)


class Inbox:
    """What a client was sent besides answers: notifications by type, and an event per arrival."""

    def __init__(self) -> None:
        self.messages: list[Any] = []
        self._arrived = anyio.Event()

    async def __call__(self, message: Any) -> None:
        if isinstance(message, types.ServerNotification | types.ToolListChangedNotification):
            self.messages.append(message)
            self._arrived.set()
            self._arrived = anyio.Event()

    def of(self, kind: type[Any]) -> list[Any]:
        return [m for m in self.messages if isinstance(m, kind)]

    async def wait_for(self, predicate: Callable[[Any], bool]) -> Any:
        with anyio.fail_after(WAIT):
            while True:
                found = [m for m in self.messages if predicate(m)]
                if found:
                    return found[0]
                await self._arrived.wait()


@asynccontextmanager
async def direct_stdio(name: str, **kwargs: Any) -> AsyncIterator[ClientSession]:
    params = StdioServerParameters(command=PYTHON, args=[FIDELITY, "--stdio", "--name", name])
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, **kwargs) as session:
            await session.initialize()
            yield session


@asynccontextmanager
async def direct(backend: str, fid_http: Downstream, **kwargs: Any) -> AsyncIterator[ClientSession]:
    """A client straight to the downstream that the gateway publishes as ``backend``."""
    if backend == "h":
        async with mcp_session(fid_http.url(), **kwargs) as session:
            yield session
    else:
        async with direct_stdio(backend, **kwargs) as session:
            yield session


async def _all_pages(session: ClientSession, request: Callable[[str | None], Any], result: type[Any]) -> list[Any]:
    items: list[Any] = []
    cursor = None
    while True:
        page = await session.send_request(request(cursor), result)
        items.extend(
            getattr(page, "prompts", None) or getattr(page, "resources", None) or page.resource_templates or []
        )
        cursor = page.next_cursor
        if not cursor:
            return items


def _paged(kind: type[Any]) -> Callable[[str | None], Any]:
    return lambda cursor: kind(params=types.PaginatedRequestParams(cursor=cursor) if cursor else None)


# ------------------------------------------------------------------------------------------------ capabilities


async def test_capabilities_are_what_the_ready_backends_offer(gateway: RunningServer, tmp_path: Path) -> None:
    async with mcp_session(gateway.url()) as session:
        caps = session.server_capabilities
    assert caps is not None
    assert caps.tools is not None and caps.tools.list_changed
    assert caps.resources is not None and caps.resources.subscribe and caps.resources.list_changed
    assert caps.prompts is not None and caps.prompts.list_changed
    assert caps.completions is not None and caps.logging is not None

    tools_only = f"""
gateway: {{audit: {{enabled: false}}}}
servers:
  echo:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
"""
    with run_gateway(tools_only, tmp_path) as plain:
        async with mcp_session(plain.url()) as session:
            caps = session.server_capabilities
            with pytest.raises(MCPError):
                await session.send_request(
                    types.CompleteRequest(
                        params=types.CompleteRequestParams(
                            ref=types.PromptReference(name="greet"),
                            argument=types.CompletionArgument(name="name", value="a"),
                        )
                    ),
                    types.CompleteResult,
                )
    assert caps is not None and caps.tools is not None
    assert (caps.resources, caps.prompts, caps.completions, caps.logging) == (None, None, None, None)


async def test_the_gateway_served_over_stdio_offers_and_relays_the_same(tmp_path: Path) -> None:
    config = tmp_path / "federation.yaml"
    config.write_text(
        f"""
gateway: {{audit: {{enabled: false}}}}
servers:
  s:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps([FIDELITY, "--stdio", "--name", "s"])}
"""
    )
    params = StdioServerParameters(
        command=PYTHON, args=["-m", "gateway", "serve", "--stdio", "-c", str(config)], cwd=str(tmp_path)
    )
    async with stdio_client(params) as (read, write):
        async with ClientSession(read, write, sampling_callback=answer_sampling("over stdio")) as session:
            with anyio.fail_after(WAIT * 2):
                caps = (await session.initialize()).capabilities
                sampled = first_text(await session.call_tool("sample", {"prompt": "hi"}))
    assert caps.prompts is not None and caps.resources is not None and caps.logging is not None
    assert sampled == "sampled: over stdio (test-model)"


# ------------------------------------------------------------------------------------------------ lists and naming


@pytest.mark.parametrize("backend", ["h", "s"])
async def test_lists_are_merged_from_every_page_and_colliding_names_get_a_reversible_prefix(
    backend: str, gateway: RunningServer, fid_http: Downstream
) -> None:
    async with direct(backend, fid_http) as downstream:
        prompts = await _all_pages(downstream, _paged(types.ListPromptsRequest), types.ListPromptsResult)
        resources = await _all_pages(downstream, _paged(types.ListResourcesRequest), types.ListResourcesResult)
        templates = await _all_pages(
            downstream, _paged(types.ListResourceTemplatesRequest), types.ListResourceTemplatesResult
        )
    async with mcp_session(gateway.url()) as session:
        via_prompts = (await session.send_request(types.ListPromptsRequest(), types.ListPromptsResult)).prompts
        via_resources = (await session.send_request(types.ListResourcesRequest(), types.ListResourcesResult)).resources
        via_templates = (
            await session.send_request(types.ListResourceTemplatesRequest(), types.ListResourceTemplatesResult)
        ).resource_templates
    assert len(prompts) >= 5 and len(resources) >= 5  # more than one page downstream
    prefix = f"{backend}__"
    assert [p.model_copy(update={"name": prefix + p.name}) for p in prompts] == [
        p for p in via_prompts if p.name.startswith(prefix)
    ]
    assert [r.model_copy(update={"uri": prefix + r.uri}) for r in resources] == [
        r for r in via_resources if r.uri.startswith(prefix)
    ]
    assert [t.model_copy(update={"uri_template": prefix + t.uri_template}) for t in templates] == [
        t for t in via_templates if t.uri_template.startswith(prefix)
    ]
    # The conformance server's names collide with nothing: untouched.
    assert "test_simple_prompt" in {p.name for p in via_prompts}
    assert "test://static-text" in {r.uri for r in via_resources}
    assert "test://template/{id}/data" in {t.uri_template for t in via_templates}


@pytest.mark.parametrize("backend", ["h", "s", "p"])
async def test_resource_reads_prompts_and_completions_match_the_downstream(
    backend: str, gateway: RunningServer, fid_http: Downstream
) -> None:
    prefix = f"{backend}__"
    greet = types.GetPromptRequestParams(name="greet", arguments={"name": "Ada"})
    completion = types.CompleteRequestParams(
        ref=types.ResourceTemplateReference(uri="fid://item/{id}"),
        argument=types.CompletionArgument(name="id", value="1"),
    )
    async with direct("h" if backend == "h" else backend, fid_http) as downstream:
        expected = [await downstream.read_resource(uri) for uri in ("fid://r/3", "fid://item/42")]
        expected_prompt = await downstream.send_request(types.GetPromptRequest(params=greet), types.GetPromptResult)
        expected_completion = await downstream.send_request(
            types.CompleteRequest(params=completion), types.CompleteResult
        )
        with pytest.raises(MCPError) as direct_error:
            await downstream.read_resource("fid://nothing-here")
    async with mcp_session(gateway.url()) as session:
        got = [await session.read_resource(prefix + uri) for uri in ("fid://r/3", "fid://item/42")]
        got_prompt = await session.send_request(
            types.GetPromptRequest(params=greet.model_copy(update={"name": prefix + "greet"})), types.GetPromptResult
        )
        published_ref = types.ResourceTemplateReference(uri=prefix + "fid://item/{id}")
        got_completion = await session.send_request(
            types.CompleteRequest(params=completion.model_copy(update={"ref": published_ref})), types.CompleteResult
        )
        with pytest.raises(MCPError) as via_error:
            await session.read_resource(prefix + "fid://nothing-here")
        with pytest.raises(MCPError) as unknown_prompt:
            await session.send_request(
                types.GetPromptRequest(params=types.GetPromptRequestParams(name="greet")), types.GetPromptResult
            )
    for want, have, uri in zip(expected, got, ("fid://r/3", "fid://item/42"), strict=True):
        # The contents name the URI the client asked for; everything else is the downstream's.
        assert [c.model_copy(update={"uri": prefix + uri}) for c in want.contents] == have.contents
    assert got_prompt == expected_prompt
    assert got_completion.completion == expected_completion.completion
    assert via_error.value.error.code == direct_error.value.error.code == types.INVALID_PARAMS
    assert unknown_prompt.value.error.code == types.INVALID_PARAMS  # "greet" alone is ambiguous: not published


async def test_untouched_names_read_and_complete_like_the_conformance_server(
    gateway: RunningServer, conf_http: Downstream
) -> None:
    ref = types.PromptReference(name="test_prompt_with_arguments")
    request = types.CompleteRequest(
        params=types.CompleteRequestParams(ref=ref, argument=types.CompletionArgument(name="arg1", value="pa"))
    )
    results = []
    for url in (conf_http.url(), gateway.url()):
        async with mcp_session(url) as session:
            results.append(
                (
                    await session.read_resource("test://static-binary"),
                    await session.read_resource("test://template/7/data"),
                    await session.send_request(request, types.CompleteResult),
                )
            )
    assert results[0] == results[1]


# ------------------------------------------------------------------------------------------------ subscriptions


async def test_subscribers_hear_updates_under_the_uri_they_subscribed_and_the_downstream_is_subscribed_once(
    gateway: RunningServer,
) -> None:
    uri, published = "fid://r/1", "h__fid://r/1"
    alice_inbox, bob_inbox = Inbox(), Inbox()
    async with mcp_session(gateway.url(), message_handler=alice_inbox) as alice:
        async with mcp_session(gateway.url(), message_handler=bob_inbox) as bob:
            for session in (alice, bob):
                await session.send_request(
                    types.SubscribeRequest(params=types.SubscribeRequestParams(uri=published)), types.EmptyResult
                )
            assert (
                first_text(await alice.call_tool("h__touch", {"uri": uri})) == "touched 1"
            )  # one downstream subscriber
            for inbox in (alice_inbox, bob_inbox):
                update = await inbox.wait_for(lambda m: isinstance(m, types.ResourceUpdatedNotification))
                assert update.params.uri == published
            await alice.send_request(
                types.UnsubscribeRequest(params=types.UnsubscribeRequestParams(uri=published)), types.EmptyResult
            )
            assert first_text(await alice.call_tool("h__touch", {"uri": uri})) == "touched 1"  # bob still holds it
            await bob_inbox.wait_for(lambda m: len(bob_inbox.of(types.ResourceUpdatedNotification)) == 2)
        # Bob left without unsubscribing: his subscription ends with his session, and with it the downstream's.

        async def released() -> bool:
            return first_text(await alice.call_tool("h__touch", {"uri": uri})) == "touched 0"

        await eventually(released, within=WAIT)
    assert len(alice_inbox.of(types.ResourceUpdatedNotification)) == 1


# ------------------------------------------------------------------------------------------------ list changes


async def test_a_downstream_list_change_is_announced_and_the_new_items_listed(gateway: RunningServer) -> None:
    inbox = Inbox()
    async with mcp_session(gateway.url(), message_handler=inbox) as session:
        await session.list_prompts()  # a client is told a list changed once it holds one (front/clients.py)
        await session.list_resources()
        await session.call_tool("h__add_prompt", {"name": "fresh_prompt"})
        await inbox.wait_for(lambda m: isinstance(m, types.PromptListChangedNotification))
        prompts = (await session.send_request(types.ListPromptsRequest(), types.ListPromptsResult)).prompts
        assert "fresh_prompt" in {p.name for p in prompts}  # only h has it: published untouched
        await session.call_tool("s__add_resource", {"uri": "fid://fresh"})
        await inbox.wait_for(lambda m: isinstance(m, types.ResourceListChangedNotification))
        resources = (await session.send_request(types.ListResourcesRequest(), types.ListResourcesResult)).resources
        assert "fid://fresh" in {r.uri for r in resources}
        read = await session.read_resource("fid://fresh")
        assert read.contents[0].uri == "fid://fresh"


async def test_a_backend_leaving_and_returning_is_announced_for_every_list(tmp_path: Path) -> None:
    port = free_port()
    config = f"""
gateway: {{audit: {{enabled: false}}}}
servers:
  h:
    transport: streamable_http
    url: http://127.0.0.1:{port}/mcp
    connect_timeout_s: 2
    ping_interval_s: 0.5
"""
    argv = _fidelity_argv("--http", str(port), "--name", "h")
    inbox = Inbox()

    async def prompt_names(session: ClientSession) -> set[str]:
        return {
            p.name for p in (await session.send_request(types.ListPromptsRequest(), types.ListPromptsResult)).prompts
        }

    with start_http_server(argv, port) as backend, run_gateway(config, tmp_path) as gateway:
        async with mcp_session(gateway.url(), message_handler=inbox) as session:
            assert "greet" in await prompt_names(session)
            await session.list_resources()  # told of a list's change once it holds the list
            os.killpg(backend.process.pid, signal.SIGKILL)
            for kind in (types.PromptListChangedNotification, types.ResourceListChangedNotification):
                await inbox.wait_for(lambda m, kind=kind: isinstance(m, kind))
            assert await prompt_names(session) == set()
            inbox.messages.clear()
            with start_http_server(argv, port):  # back on its own address: it rejoins and is announced
                with anyio.fail_after(WAIT * 3):
                    await inbox.wait_for(lambda m: isinstance(m, types.PromptListChangedNotification))
                assert "greet" in await prompt_names(session)


# ------------------------------------------------------------------------------------------------ logging


async def test_each_client_is_sent_the_log_messages_its_own_level_admits(
    gateway: RunningServer, fid_http: Downstream
) -> None:
    quiet_inbox, chatty_inbox, silent_inbox = Inbox(), Inbox(), Inbox()
    async with (
        mcp_session(gateway.url(), message_handler=quiet_inbox) as quiet,
        mcp_session(gateway.url(), message_handler=chatty_inbox) as chatty,
        mcp_session(gateway.url(), message_handler=silent_inbox) as silent,
    ):
        level = types.SetLevelRequest
        await quiet.send_request(level(params=types.SetLevelRequestParams(level="warning")), types.EmptyResult)
        await chatty.send_request(level(params=types.SetLevelRequestParams(level="debug")), types.EmptyResult)
        # The downstreams are asked for the most verbose level any client chose.
        await eventually(lambda: "log level set to debug" in fid_http.output(), within=WAIT)

        def logs(inbox: Inbox) -> list[Any]:
            return [m.params.data for m in inbox.of(types.LoggingMessageNotification)]

        for backend in ("h", "s"):
            for session, inbox in ((quiet, quiet_inbox), (chatty, chatty_inbox)):
                await session.call_tool(f"{backend}__log", {"level": "info", "message": f"{backend} info"})
                await session.call_tool(f"{backend}__log", {"level": "error", "message": f"{backend} error"})
                await inbox.wait_for(lambda m, b=backend: getattr(m.params, "data", None) == f"{b} error")
        assert logs(quiet_inbox) == ["h error", "s error"]
        assert logs(chatty_inbox) == ["h info", "h error", "s info", "s error"]

        # A message that belongs to no call goes to the clients that asked for log messages, at their level.
        await silent.call_tool("h__log_after", {"seconds": 0.05, "level": "warning", "message": "later"})
        for inbox in (quiet_inbox, chatty_inbox):
            await inbox.wait_for(lambda m: getattr(m.params, "data", None) == "later")
        await silent.call_tool("h__log", {"level": "info", "message": "own call"})  # no level set: the default
        await silent_inbox.wait_for(lambda m: getattr(m.params, "data", None) == "own call")
        assert logs(silent_inbox) == ["own call"]


# ------------------------------------------------------------------------------------------------ progress, cancel


@pytest.mark.parametrize("backend", ["h", "s"])
async def test_progress_reaches_the_client_under_its_own_token(
    backend: str, gateway: RunningServer, fid_http: Downstream
) -> None:
    runs: list[list[tuple[float, float | None, str | None]]] = []
    for target in ("direct", "gateway"):
        seen: list[tuple[float, float | None, str | None]] = []

        async def on_progress(
            progress: float, total: float | None, message: str | None, seen: list[Any] = seen
        ) -> None:
            seen.append((progress, total, message))

        context = direct(backend, fid_http) if target == "direct" else mcp_session(gateway.url())
        async with context as session:
            name = "progress" if target == "direct" else f"{backend}__progress"
            result = await session.call_tool(name, {"steps": 3}, progress_callback=on_progress)
        assert first_text(result) == "done"
        runs.append(seen)
    assert runs[0] == runs[1] == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_a_client_cancelling_its_call_cancels_it_downstream(gateway: RunningServer, fid_http: Downstream) -> None:
    async with mcp_session(gateway.url()) as session:
        with pytest.raises(MCPError):
            await session.call_tool("h__sleep", {"seconds": 60}, read_timeout_seconds=0.5)
    await eventually(lambda: "cancelled sleep" in fid_http.output(), within=WAIT)


@pytest.mark.parametrize("backend", ["h", "s", "p"])
async def test_a_downstream_giving_up_on_its_request_cancels_it_at_the_client(
    backend: str, gateway: RunningServer
) -> None:
    result = await call_abandoning_sampling(gateway.url(), f"{backend}__sample_abandon", within=WAIT)
    assert first_text(result) == "gave up"


async def test_a_stream_the_downstream_closes_mid_call_is_closed_and_resumed_through_the_gateway(
    gateway: RunningServer,
) -> None:
    """SEP-1699 polling: the conformance server closes `test_reconnection`'s stream mid-call; the gateway closes the
    client's stream too, and the client resumes from the gateway's event store with `Last-Event-ID`."""
    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(WAIT)) as http:
        opened = await http.post(
            gateway.url(), headers=headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
        )
        session = {**headers, "mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": "2025-11-25"}
        await http.post(gateway.url(), headers=session, json={"jsonrpc": "2.0", "method": "notifications/initialized"})
        call = {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": {"name": "test_reconnection"}}
        with anyio.fail_after(WAIT):
            first = await http.post(gateway.url(), headers=session, json=call)
            events = sse_events(first.text)
            assert events[0]["data"] == "" and "retry" in events[0]  # the priming event: an id, a retry interval
            assert not any('"id":2' in event["data"] for event in events)  # closed before the result
            resume = {**session, "last-event-id": events[-1]["id"]}
            async with http.stream("GET", gateway.url(), headers=resume) as resumed:  # stays open: read to the result
                async for line in resumed.aiter_lines():
                    if line.startswith("data:") and '"id":2' in line:
                        result = json.loads(line.removeprefix("data:"))
                        break
    assert result["result"]["content"][0]["text"].startswith("Reconnection test completed successfully")


# ------------------------------------------------------------------------------------------------ back-channel


@pytest.mark.parametrize("backend", ["h", "s", "p"])
async def test_sampling_elicitation_and_roots_round_trips_match_the_downstream(
    backend: str, gateway: RunningServer, fid_http: Downstream
) -> None:
    async def roots(context: ClientRequestContext) -> Any:
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/a"), types.Root(uri="file:///work/b")])

    callbacks = {
        "sampling_callback": answer_sampling("a fine answer", "model-x"),
        "elicitation_callback": answer_elicitation,
        "list_roots_callback": roots,
    }
    texts = []
    for target in ("direct", "gateway"):
        context = (
            direct(backend, fid_http, **callbacks) if target == "direct" else mcp_session(gateway.url(), **callbacks)
        )
        async with context as session:
            prefix = "" if target == "direct" else f"{backend}__"
            texts.append(
                [
                    first_text(await session.call_tool(prefix + "sample", {"prompt": "hello"})),
                    first_text(await session.call_tool(prefix + "elicit", {"message": "proceed?"})),
                    first_text(await session.call_tool(prefix + "roots", {})),
                ]
            )
    assert (
        texts[0]
        == texts[1]
        == [
            "sampled: a fine answer (model-x)",
            'elicited: accept {"answer": "yes to proceed?"}',
            "file:///work/a file:///work/b",
        ]
    )


@pytest.mark.parametrize("backend", ["h", "p"])
async def test_concurrent_callers_each_answer_their_own_sampling_request(backend: str, gateway: RunningServer) -> None:
    """Two clients call the same backend's sampling tool at once: each is asked for its own call, and both calls
    are in flight together (neither answers before both were asked)."""
    arrived = {"alice": anyio.Event(), "bob": anyio.Event()}

    def answer_as(name: str) -> Any:
        async def sampling(context: ClientRequestContext, params: types.CreateMessageRequestParams) -> Any:
            arrived[name].set()
            for event in arrived.values():
                await event.wait()
            text = params.messages[0].content.text  # type: ignore[union-attr]
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(text=f"{name} answers {text}"), model=name
            )

        return sampling

    results: dict[str, str] = {}

    async def call(name: str) -> None:
        async with mcp_session(gateway.url(), sampling_callback=answer_as(name)) as session:
            results[name] = first_text(await session.call_tool(f"{backend}__sample", {"prompt": f"{name}'s question"}))

    with anyio.fail_after(WAIT * 2):
        async with anyio.create_task_group() as tg:
            tg.start_soon(call, "alice")
            tg.start_soon(call, "bob")
    assert results == {
        "alice": "sampled: alice answers alice's question (alice)",
        "bob": "sampled: bob answers bob's question (bob)",
    }


async def test_a_client_that_can_be_asked_gets_its_own_process_which_ends_with_its_session(
    gateway: RunningServer,
) -> None:
    async with mcp_session(gateway.url()) as plain:
        shared = first_text(await plain.call_tool("p__pid", {}))
        async with mcp_session(gateway.url(), sampling_callback=answer_sampling("x")) as capable:
            own = first_text(await capable.call_tool("p__pid", {}))
            assert first_text(await capable.call_tool("p__pid", {})) == own  # the same session for the client's calls
        assert own != shared and _alive(int(own))
        await eventually(lambda: not _alive(int(own)), within=WAIT)
        assert first_text(await plain.call_tool("p__pid", {})) == shared


async def test_a_clients_roots_change_reaches_its_own_session(gateway: RunningServer) -> None:
    async def roots(context: ClientRequestContext) -> Any:
        return types.ListRootsResult(roots=[types.Root(uri="file:///work/c")])

    async with mcp_session(gateway.url(), list_roots_callback=roots) as session:
        assert first_text(await session.call_tool("p__roots", {})) == "file:///work/c"  # opens the client's own session
        assert first_text(await session.call_tool("p__roots_changes", {})) == "0"
        await session.send_notification(types.RootsListChangedNotification())

        async def heard() -> bool:
            return first_text(await session.call_tool("p__roots_changes", {})) == "1"

        await eventually(heard, within=WAIT)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.parametrize("backend", ["h", "s"])
async def test_a_client_without_the_capability_is_not_asked_and_the_downstream_hears_why(
    backend: str, gateway: RunningServer
) -> None:
    async with mcp_session(gateway.url()) as session:  # declares no sampling capability
        with anyio.fail_after(WAIT):
            result = await session.call_tool(f"{backend}__sample", {"prompt": "anyone?"})
    assert result.is_error and "does not support sampling/createMessage" in first_text(result)


@pytest.mark.parametrize("backend", ["h", "s"])
async def test_a_stateless_2026_client_is_asked_through_an_input_required_result(
    backend: str, gateway: RunningServer
) -> None:
    # No back-channel: the downstream's request waits in the gateway while the client answers an input-required
    # result and retries (tests/test_era_bridge.py has the rounds, the refusals and the ledger rows).
    async with Client(gateway.url(), mode="2026-07-28", sampling_callback=answer_sampling("bridged")) as client:
        with anyio.fail_after(WAIT):
            result = await client.call_tool(f"{backend}__sample", {"prompt": "anyone?"})
    assert not result.is_error and first_text(result) == "sampled: bridged (test-model)"
