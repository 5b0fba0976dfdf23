"""One inbound request makes exactly one downstream request per round (issue 25 item 5).

The Rust SDK's client retries input-required results and caches responses by itself, outside any gateway quota; the
Python SDK's ``Client`` does both too (``input_required_max_rounds``, ``cache``), but the gateway sends on a bare
``ClientSession`` (``send_request``), which does neither. These tests pin that: a real downstream that counts every
request it answers (tests/fixtures/mrtr_server.py, ``/rounds``, a server of this test's own), behind a real
``gateway serve`` with the default configuration, and clients of both eras.
"""

from __future__ import annotations

from pathlib import Path

import anyio
import httpx2
import mcp_types as types
import pytest

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import mcp_session, run_gateway
from tests.fixtures.waiting import eventually
from tests.front.test_input_required import KEY, TOKENS, Answers, _text, client

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


def _config(url: str, protocol: str | None = None) -> str:
    declared = f'\n    protocol: "{protocol}"' if protocol else ""
    return f"""
gateway:
  audit: {{enabled: false}}
servers:
  asker:
    transport: streamable_http
    url: {url}{declared}
    timeout_s: 10
"""


def _counted(server: Downstream) -> dict[str, int]:
    return dict(httpx2.get(server.url("/rounds")).json())


async def _ready(url: str) -> bool:
    async with httpx2.AsyncClient() as http:
        return (await http.get(url)).json()["backends"] == {"asker": "ready"}


async def test_a_stateless_client_s_rounds_each_make_one_downstream_request(
    downstream: Downstreams, tmp_path: Path
) -> None:
    server = downstream("mrtr", "streamable_http", own=True)
    with run_gateway(_config(server.url()), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        await eventually(lambda: _ready(gateway.url("/healthz")), within=20)
        with anyio.fail_after(30):
            async with client(gateway.url()) as c:
                first = await c.session.call_tool("interview", {"rounds": 3}, allow_input_required=True)
                assert isinstance(first, types.InputRequiredResult)  # handed back, never retried by the gateway
                assert _counted(server) == {"tools/call": 1}
                await c.call_tool("plain", {})
                await c.call_tool("plain", {})  # the same call again: asked again, nothing answered from a cache
                assert _counted(server) == {"tools/call": 3}
                read = await c.session.read_resource("test://mrtr/secret", allow_input_required=True)
                assert isinstance(read, types.InputRequiredResult)
                answers = Answers()
            async with client(gateway.url(), answers=answers) as c:
                done = await c.call_tool("interview", {"rounds": 3})  # three rounds, the client retrying
    assert _text(done) == "interview: name=Ada motto=onward confirmed=True rounds=3"
    assert _counted(server) == {"tools/call": 6, "resources/read": 1}


async def test_a_handshake_client_s_rounds_driven_by_the_gateway_each_make_one_downstream_request(
    downstream: Downstreams, tmp_path: Path
) -> None:
    server = downstream("mrtr", "streamable_http", own=True)
    answers = Answers()
    config = _config(server.url(), protocol="2026-07-28")  # a handshake client is then asked on its call's stream
    with run_gateway(config, tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        await eventually(lambda: _ready(gateway.url("/healthz")), within=20)
        with anyio.fail_after(30):
            async with mcp_session(
                gateway.url(), elicitation_callback=answers.elicit, sampling_callback=answers.sample
            ) as session:
                result = await session.call_tool("interview", {"rounds": 3})
                again = await session.call_tool("plain", {})
    assert (_text(result), _text(again)) == ("interview: name=Ada motto=onward confirmed=True rounds=3", "plain: ok")
    assert _counted(server) == {"tools/call": 4}
