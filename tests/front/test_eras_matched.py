"""Every protocol era by itself (issue 25 item 1): with no ``protocol:`` declared, the gateway learns which eras a
downstream speaks and serves each client in its own era where the downstream speaks it, bridging only where not.

Real processes: tests/fixtures/conformance_server.py over streamable HTTP speaking both eras, the handshake era only
or the 2026-07-28 era only (``--era``, tests/fixtures/one_era.py), behind a real ``gateway serve`` with a default
configuration; the clients are the SDK's ``Client`` in each era (``legacy`` and ``2026-07-28``). Each answer through
the gateway equals the one the client gets directly from the server in its own era, or, where the server does not
speak the client's era, the one a client of the server's era gets directly. A client's log level is heard through
tests/fixtures/fidelity_server.py, a dual-era server whose ``log`` tool honours it.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client

from tests.fixtures.downstreams import Downstreams
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, run_gateway
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

MODERN = "2026-07-28"
HANDSHAKE = "legacy"
TOKENS = "alice=tok-alice"
KEY = "k" * 16 + "0123456789abcdef0123456789abcdef"

CALLS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("test_simple_text", {}),
    ("test_elicitation", {"message": "Your name?"}),  # a request on the call's stream, or an input-required result
    ("test_input_required_result_elicitation", {}),  # an input-required result in its era, refused before it
)


async def _elicit(context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
    return types.ElicitResult(action="accept", content={"response": "Ada", "name": "Ada", "username": "ada"})


async def _answers(url: str, mode: str, token: str | None = None) -> list[tuple[bool, str]]:
    """Each of ``CALLS`` made by a client in ``mode``: (isError, its text)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    seen = []
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(20)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, elicitation_callback=_elicit, cache=None) as c,
    ):
        for name, arguments in CALLS:
            result = await c.call_tool(name, arguments)
            seen.append((bool(result.is_error), "".join(getattr(b, "text", "") for b in result.content)))
    return seen


async def _ready(http: httpx2.AsyncClient, url: str) -> bool:
    return (await http.get(url)).json()["backends"] == {"conf": "ready"}


def _config(url: str) -> str:
    return f"""
gateway:
  audit: {{enabled: false}}
servers:
  conf:
    transport: streamable_http
    url: {url}
    timeout_s: 20
"""


UNTRIED = [MODERN, "handshake: not yet tried"]
REFUSED = [MODERN, "handshake: refused"]


@pytest.mark.parametrize(
    ("era", "speaks", "at_connect", "after"),
    [
        ("both", ["handshake", MODERN], UNTRIED, ["handshake", MODERN]),
        ("handshake", ["handshake"], ["handshake"], ["handshake"]),
        (MODERN, [MODERN], UNTRIED, REFUSED),
        ("2026-answers", [MODERN], UNTRIED, REFUSED),
    ],
)
async def test_each_client_is_served_in_its_own_era_where_the_downstream_speaks_it(
    downstream: Downstreams, tmp_path: Path, era: str, speaks: list[str], at_connect: list[str], after: list[str]
) -> None:
    # A server that answers server/discover is asked no handshake at connect (its discover answer, the SDK's, names
    # no handshake-era version): /status says the handshake is not yet tried until a handshake-era client needs it,
    # and then whether it was answered (that client served over it) or refused (served in the 2026-07-28 era).
    server = downstream("conformance", "streamable_http", "--era", era)
    with anyio.fail_after(60):
        direct = {}
        for mode, name in ((HANDSHAKE, "handshake"), (MODERN, MODERN)):
            if name in speaks:
                direct[mode] = await _answers(server.url(), mode)
        # A client of an era the server does not speak gets what a client of the server's own era gets directly.
        expected = {
            HANDSHAKE: direct.get(HANDSHAKE, direct.get(MODERN)),
            MODERN: direct.get(MODERN, direct.get(HANDSHAKE)),
        }
        with run_gateway(_config(server.url()), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice"}) as http:
                await eventually(lambda: _ready(http, gateway.url("/healthz")), within=20)
                status = (await http.get(gateway.url("/status"))).json()
                through = {mode: await _answers(gateway.url(), mode, "tok-alice") for mode in (HANDSHAKE, MODERN)}
                later = (await http.get(gateway.url("/status"))).json()
    [backend], [now] = status["backends"], later["backends"]
    assert (backend["state"], backend["eras"]) == ("ready", at_connect)
    assert [e.split(" (")[0] for e in now["eras"]] == after, now  # a refusal says why, in brackets
    assert through == expected, json.dumps({"through": through, "expected": expected}, indent=1)


async def test_a_stdio_server_that_refuses_the_handshake_is_reconnected_in_its_era(tmp_path: Path) -> None:
    # One era per stdio connection: the handshake is tried first (a server of both eras keeps it), and a server that
    # refuses it is started again at once and spoken to in the 2026-07-28 era; a 2025 client is then served through
    # it, its input requests asked on its call's stream.
    config = f"""
gateway:
  audit: {{enabled: false}}
servers:
  conf:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps([str(FIXTURES / "conformance_server.py"), "--stdio", "--era", MODERN])}
    timeout_s: 20
"""
    with run_gateway(config, tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice"}) as http:
            await eventually(lambda: _ready(http, gateway.url("/healthz")), within=30)
            status = (await http.get(gateway.url("/status"))).json()
        with anyio.fail_after(60):
            through = {mode: await _answers(gateway.url(), mode, "tok-alice") for mode in (HANDSHAKE, MODERN)}
        output = gateway.output()
    [backend] = status["backends"]
    assert (backend["state"], backend["eras"]) == ("ready", [MODERN])
    assert "it refused the handshake" in output and "connecting in the 2026-07-28 era" in output
    assert through[HANDSHAKE] == through[MODERN]
    assert through[MODERN][2] == (False, "Hello, Ada, Ada, ada!"), through  # its input-required rounds answered


async def test_a_server_that_never_answers_server_discover_still_connects_in_time(
    downstream: Downstreams, tmp_path: Path
) -> None:
    # The discover probe has a third of connect_timeout_s: the handshake keeps the rest (the SDK's own probe waits
    # 10 s, longer than this server's whole connect budget).
    server = downstream("conformance", "streamable_http", "--era", "mute")
    config = _config(server.url()) + "    connect_timeout_s: 4\n"
    with run_gateway(config, tmp_path, tokens=TOKENS) as gateway:
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice"}) as http:
            await eventually(lambda: _ready(http, gateway.url("/healthz")), within=20)
            status = (await http.get(gateway.url("/status"))).json()
    [backend] = status["backends"]
    assert (backend["state"], backend["eras"], backend["last_error"]) == ("ready", ["handshake"], None)


async def test_a_tool_listed_in_the_2026_era_alone_is_served_to_clients_of_both(
    downstream: Downstreams, tmp_path: Path
) -> None:
    # The reference server lists its input-required tools to 2026-07-28 requests only: the gateway lists them too
    # (from its stateless lane) and calls them there, a 2025 client's input requests asked on its call's stream.
    server = downstream("conformance", "streamable_http", "--era-tools")
    with anyio.fail_after(60):
        direct = await _answers(server.url(), MODERN)
        with run_gateway(_config(server.url()), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice"}) as http:
                await eventually(lambda: _ready(http, gateway.url("/healthz")), within=20)
            through = {mode: await _answers(gateway.url(), mode, "tok-alice") for mode in (HANDSHAKE, MODERN)}
    assert through[MODERN] == direct
    assert through[HANDSHAKE][2] == direct[2] == (False, "Hello, Ada, Ada, ada!")


async def _prompt(url: str, mode: str, token: str | None = None) -> tuple[bool, str]:
    """Whether a client in ``mode`` finds the input-required prompt listed, and the text it gets for it."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(20)) as http,
        Client(streamable_http_client(url, http_client=http), mode=mode, elicitation_callback=_elicit, cache=None) as c,
    ):
        listed = PROMPT in [prompt.name for prompt in (await c.list_prompts()).prompts]
        result = await c.get_prompt(PROMPT)
    return listed, "".join(getattr(m.content, "text", "") for m in result.messages)


PROMPT = "test_input_required_result_prompt"


async def test_a_prompt_listed_in_the_2026_era_alone_is_served_to_clients_of_both(
    downstream: Downstreams, tmp_path: Path
) -> None:
    # As its tools, the reference server lists its input-required prompt to 2026-07-28 requests only: the gateway
    # lists it (from the session of that era) and gets it there, a 2025 client's input requests asked on its stream.
    server = downstream("conformance", "streamable_http", "--era-tools")
    with anyio.fail_after(60):
        direct = await _prompt(server.url(), MODERN)
        with run_gateway(_config(server.url()), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice"}) as http:
                await eventually(lambda: _ready(http, gateway.url("/healthz")), within=20)
            through = {mode: await _prompt(gateway.url(), mode, "tok-alice") for mode in (HANDSHAKE, MODERN)}
    assert direct == (True, "Answer with this context in mind: Ada, Ada, ada")
    assert through == {HANDSHAKE: direct, MODERN: direct}


async def _levels_heard(url: str, token: str | None = None) -> list[str]:
    """The log messages a handshake-era client hears from ``log`` at four levels, having set ``warning`` as its first
    request."""
    heard: list[str] = []

    async def hear(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(str(params.data))

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with (
        httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(20)) as http,
        Client(streamable_http_client(url, http_client=http), mode=HANDSHAKE, logging_callback=hear, cache=None) as c,
    ):
        level = types.SetLevelRequest(params=types.SetLevelRequestParams(level="warning"))
        await c.session.send_request(level, types.EmptyResult)  # the Client's own method warns (2026)
        for name in ("debug", "info", "warning", "error"):
            await c.call_tool("log", {"level": name, "message": name})
    return heard


async def test_a_log_level_set_before_the_handshake_session_opens_is_applied_to_it(
    downstream: Downstreams, tmp_path: Path
) -> None:
    # A server that answers server/discover gets its handshake session when a 2025 client first needs it (here its
    # tools/call, after its logging/setLevel): the level goes on that session as it opens. This server sends a
    # session no log message before it sets a level, then only from that level up (as a server may choose).
    server = downstream("fidelity", "streamable_http", "--quiet-logs", own=True)
    with anyio.fail_after(60):
        direct = await _levels_heard(server.url())
        with run_gateway(_config(server.url()), tmp_path, tokens=TOKENS) as gateway:
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice"}) as http:
                await eventually(lambda: _ready(http, gateway.url("/healthz")), within=20)
                status = (await http.get(gateway.url("/status"))).json()
            through = await _levels_heard(gateway.url(), "tok-alice")
            output = gateway.output()
    [backend] = status["backends"]
    assert backend["eras"] == UNTRIED  # the handshake session was deferred
    assert direct == ["warning", "error"]
    assert through == direct
    # The stateless session was not asked: that era has no logging/setLevel (a request says its level in _meta).
    assert "backend.set_log_level_failed" not in output
