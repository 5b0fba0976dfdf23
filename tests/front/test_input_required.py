"""Input-required results (MCP 2026-07-28, SEP-2322) through a real ``gateway serve``, over real processes.

The downstream is tests/fixtures/mrtr_server.py (a 2026-era SDK server over streamable HTTP, its own state sealed by
the SDK's ``RequestStateBoundary``); the client is the SDK's ``Client`` in the stateless 2026-07-28 era, which answers
the input requests and retries by itself (or, where a test needs the raw rounds, its session with
``allow_input_required=True``).
"""

from __future__ import annotations

import json
import sqlite3
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import FIXTURES, mcp_session, run_gateway
from tests.fixtures.procs import free_port, start_http_server
from tests.system.test_conformance_direct import INPUT_REQUIRED_SCENARIOS, _conformance_launcher

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

MODERN = "2026-07-28"
KEY = "k" * 16 + "0123456789abcdef0123456789abcdef"
TOKENS = "alice=tok-alice,bob=tok-bob"


@pytest.fixture(scope="module")
def mrtr(downstream: Downstreams) -> Downstream:
    return downstream("mrtr")


def _config(mrtr: Downstream, *, audit: bool = True) -> str:
    return f"""
gateway:
  audit: {{enabled: {"true" if audit else "false"}, path: audit.db}}
servers:
  asker:
    transport: streamable_http
    url: {mrtr.url()}
    protocol: "{MODERN}"
    timeout_s: 10
    ping_interval_s: 0.3
"""


class Answers:
    """The client's side of the input requests: what it was asked, in order, and fixed answers."""

    def __init__(self) -> None:
        self.asked: list[str] = []

    async def elicit(self, context: Any, params: types.ElicitRequestParams) -> types.ElicitResult:
        message = params.message
        self.asked.append(f"elicit:{message}")
        if message == "Your name?" or message == "Whom to greet?":
            return types.ElicitResult(action="accept", content={"name": "Ada"})
        if message == "Access code?":
            return types.ElicitResult(action="accept", content={"code": "42"})
        return types.ElicitResult(action="accept", content={"ok": True})

    async def sample(self, context: Any, params: types.CreateMessageRequestParams) -> types.CreateMessageResult:
        self.asked.append("sample")
        return types.CreateMessageResult(role="assistant", content=types.TextContent(text="onward"), model="m")

    async def roots(self, context: Any) -> types.ListRootsResult:
        self.asked.append("roots")
        return types.ListRootsResult(roots=[types.Root(uri="file:///tmp/r1")])


@asynccontextmanager
async def client(
    url: str, token: str | None = "tok-alice", answers: Answers | None = None, *, sampling: bool = True
) -> AsyncIterator[Client]:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    answers = answers or Answers()
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(20)) as http:
        async with Client(
            streamable_http_client(url, http_client=http),
            mode=MODERN,
            elicitation_callback=answers.elicit,
            sampling_callback=answers.sample if sampling else None,
            cache=None,
        ) as c:
            yield c


def _text(result: Any) -> str:
    return "".join(getattr(block, "text", "") for block in result.content)


def _rows(folder: Path) -> list[tuple[str, str, str, list[str]]]:
    with sqlite3.connect(folder / "audit.db") as conn:
        rows = conn.execute("SELECT tool, status, caller, chain FROM calls ORDER BY id").fetchall()
    return [(t, s, c, [f"{step['provider']}:{step['outcome']}" for step in json.loads(ch)]) for t, s, c, ch in rows]


def _rounds(mrtr: Downstream) -> dict[str, int]:
    return dict(httpx2.get(mrtr.url("/rounds")).json())


async def test_a_tool_asks_over_three_rounds_with_two_requests_in_one(mrtr: Downstream, tmp_path: Path) -> None:
    before = _rounds(mrtr).get("tools/call", 0)
    with run_gateway(_config(mrtr), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        answers = Answers()
        with anyio.fail_after(30):
            async with client(gateway.url(), answers=answers) as c:
                result = await c.call_tool("interview", {"rounds": 3})
        assert "ping failed" not in gateway.output()  # the stateless era's health check is server/discover
    assert _text(result) == "interview: name=Ada motto=onward confirmed=True rounds=3"
    assert sorted(answers.asked[:2]) == ["elicit:Your name?", "sample"]  # round 1 asked both at once
    assert answers.asked[2:] == ["elicit:Confirm Ada?"]
    assert _rounds(mrtr)["tools/call"] - before == 3  # every round reached the backend that asked
    assert _rows(tmp_path) == [
        ("interview", "input_required", "alice", ["asker/interview:input_required"]),
        ("interview", "input_required", "alice", ["asker/interview:input_required"]),
        ("interview", "ok", "alice", ["asker/interview:ok"]),
    ]


async def test_a_prompt_and_a_resource_that_need_input(mrtr: Downstream, tmp_path: Path) -> None:
    with run_gateway(_config(mrtr, audit=False), tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        answers = Answers()
        with anyio.fail_after(30):
            async with client(gateway.url(), token=None, answers=answers) as c:
                prompt = await c.get_prompt("greeting")
                read = await c.read_resource("test://mrtr/secret")
    assert [m.content.text for m in prompt.messages] == ["Hello Ada"]  # type: ignore[union-attr]
    assert [(str(x.uri), x.text) for x in read.contents] == [("test://mrtr/secret", "secret for 42")]  # type: ignore[union-attr]
    assert answers.asked == ["elicit:Whom to greet?", "elicit:Access code?"]


async def _first_round(c: Client) -> types.InputRequiredResult:
    first = await c.session.call_tool("interview", {"rounds": 1}, allow_input_required=True)
    assert isinstance(first, types.InputRequiredResult)
    assert first.input_requests is not None and list(first.input_requests) == ["name"]
    assert first.request_state is not None
    return first


_NAME = {"name": types.ElicitResult(action="accept", content={"name": "Ada"})}


def _assert_refused(exc: pytest.ExceptionInfo[MCPError]) -> None:
    assert exc.value.error.code == -32602
    assert exc.value.error.message == "Invalid or expired requestState"
    assert exc.value.error.data == {"reason": "invalid_request_state"}


async def test_a_tampered_state_is_refused(mrtr: Downstream, tmp_path: Path) -> None:
    with run_gateway(_config(mrtr), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url()) as c:
                first = await _first_round(c)
                state = first.request_state
                assert state is not None
                flipped = state[:-5] + ("A" if state[-5] != "A" else "B") + state[-4:]
                with pytest.raises(MCPError) as refused:
                    await c.session.call_tool("interview", {"rounds": 1}, input_responses=_NAME, request_state=flipped)
                _assert_refused(refused)
                with pytest.raises(MCPError) as other_args:  # the state was minted for other arguments
                    await c.session.call_tool("interview", {"rounds": 2}, input_responses=_NAME, request_state=state)
                _assert_refused(other_args)
                done = await c.session.call_tool("interview", {"rounds": 1}, input_responses=_NAME, request_state=state)
    assert _text(done) == "interview: name=Ada rounds=1"
    assert [row[1] for row in _rows(tmp_path)] == ["input_required", "ok"]  # refusals reach no backend


async def test_another_caller_cannot_replay_the_state(mrtr: Downstream, tmp_path: Path) -> None:
    with run_gateway(_config(mrtr), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url(), token="tok-alice") as alice:
                first = await _first_round(alice)
            async with client(gateway.url(), token="tok-bob") as bob:
                with pytest.raises(MCPError) as refused:
                    await bob.session.call_tool(
                        "interview", {"rounds": 1}, input_responses=_NAME, request_state=first.request_state
                    )
    _assert_refused(refused)


@pytest.mark.parametrize("key", ["env", "file"])
async def test_a_restart_between_rounds_still_completes(mrtr: Downstream, tmp_path: Path, key: str) -> None:
    env = {"GATEWAY_STATE_KEY": KEY} if key == "env" else {"GATEWAY_STATE_KEY": ""}
    with run_gateway(_config(mrtr), tmp_path, tokens=TOKENS, env=env) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url()) as c:
                first = await _first_round(c)
    if key == "file":
        state_key = tmp_path / "audit.db.state-key"
        assert state_key.stat().st_mode & 0o777 == 0o600
    with run_gateway(_config(mrtr), tmp_path, tokens=TOKENS, env=env) as gateway:  # a new process
        with anyio.fail_after(30):
            async with client(gateway.url()) as c:
                done = await c.session.call_tool(
                    "interview", {"rounds": 1}, input_responses=_NAME, request_state=first.request_state
                )
    assert _text(done) == "interview: name=Ada rounds=1"
    assert [row[1] for row in _rows(tmp_path)] == ["input_required", "ok"]


async def test_a_capability_the_client_did_not_declare(mrtr: Downstream, tmp_path: Path) -> None:
    with run_gateway(_config(mrtr, audit=False), tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url(), token=None, sampling=False) as c:
                with pytest.raises(MCPError) as sampling:
                    await c.call_tool("interview", {"rounds": 3})
                with pytest.raises(MCPError) as roots:
                    await c.call_tool("needs_roots", {})
                plain = await c.call_tool("plain", {})
    assert sampling.value.error.code == -32021
    assert sampling.value.error.data == {"requiredCapabilities": {"sampling": {}}}
    assert roots.value.error.code == -32021
    assert roots.value.error.data == {"requiredCapabilities": {"roots": {}}}
    assert _text(plain) == "plain: ok"


async def test_a_handshake_era_client_is_asked_on_its_call_stream(mrtr: Downstream, tmp_path: Path) -> None:
    """A 2025-11-25 session cannot take an input-required result: the gateway asks it over the back-channel and
    retries for it, one ledger row per round all the same."""
    answers = Answers()
    with run_gateway(_config(mrtr), tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        with anyio.fail_after(30):
            async with mcp_session(
                gateway.url(), elicitation_callback=answers.elicit, sampling_callback=answers.sample
            ) as session:
                assert session.protocol_version == "2025-11-25"
                result = await session.call_tool("interview", {"rounds": 3})
                prompt = await session.get_prompt("greeting")
                read = await session.read_resource("test://mrtr/secret")
    assert _text(result) == "interview: name=Ada motto=onward confirmed=True rounds=3"
    assert [m.content.text for m in prompt.messages] == ["Hello Ada"]  # type: ignore[union-attr]
    assert [x.text for x in read.contents] == ["secret for 42"]  # type: ignore[union-attr]
    assert answers.asked == [
        "elicit:Your name?",
        "sample",
        "elicit:Confirm Ada?",
        "elicit:Whom to greet?",
        "elicit:Access code?",
    ]
    with sqlite3.connect(tmp_path / "audit.db") as conn:  # the prompt's and the read's rounds have rows too
        kinds = conn.execute("SELECT kind, tool, status FROM calls ORDER BY id").fetchall()
    assert kinds == [
        ("tools/call", "interview", "input_required"),
        ("tools/call", "interview", "input_required"),
        ("tools/call", "interview", "ok"),
        ("prompts/get", "greeting", "input_required"),
        ("prompts/get", "greeting", "ok"),
        ("resources/read", "test://mrtr/secret", "input_required"),
        ("resources/read", "test://mrtr/secret", "ok"),
    ]


def _renamed(mrtr: Downstream, *, backend: str = "asker", rename: str = "") -> str:
    config = _config(mrtr).replace("  asker:\n", f"  {backend}:\n")
    return config + (f"    tools: {{rename: {{interview: {rename}}}}}\n" if rename else "")


async def test_the_retry_reaches_the_backend_that_asked_after_the_catalog_changed(
    mrtr: Downstream, tmp_path: Path
) -> None:
    env = {"GATEWAY_STATE_KEY": KEY}
    with run_gateway(_config(mrtr), tmp_path, tokens=TOKENS, env=env) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url()) as c:
                first = await _first_round(c)
    # The next process publishes the tool under another name: "interview" is no longer in its catalog.
    with run_gateway(_renamed(mrtr, rename="quiz"), tmp_path, tokens=TOKENS, env=env) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url()) as c:
                assert [t.name for t in (await c.list_tools()).tools] == ["quiz", "needs_roots", "plain", "polite"]
                done = await c.session.call_tool(
                    "interview", {"rounds": 1}, input_responses=_NAME, request_state=first.request_state
                )
    assert _text(done) == "interview: name=Ada rounds=1"
    assert _rows(tmp_path)[-1] == ("interview", "ok", "alice", ["asker/interview:ok"])


async def test_a_state_naming_a_backend_that_is_gone_is_refused(mrtr: Downstream, tmp_path: Path) -> None:
    env = {"GATEWAY_STATE_KEY": KEY}
    with run_gateway(_config(mrtr), tmp_path, tokens=TOKENS, env=env) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url()) as c:
                first = await _first_round(c)
    with run_gateway(_renamed(mrtr, backend="other"), tmp_path, tokens=TOKENS, env=env) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url()) as c:
                with pytest.raises(MCPError) as refused:
                    await c.session.call_tool(
                        "interview", {"rounds": 1}, input_responses=_NAME, request_state=first.request_state
                    )
        assert "the backend that asked is no longer configured" in gateway.output()  # the reason: in the log only
    _assert_refused(refused)
    assert [row[1] for row in _rows(tmp_path)] == ["input_required"]


async def test_a_prompt_state_is_not_a_tool_state(mrtr: Downstream, tmp_path: Path) -> None:
    with run_gateway(_config(mrtr, audit=False), tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url(), token=None) as c:
                first = await c.session.get_prompt("greeting", allow_input_required=True)
                assert isinstance(first, types.InputRequiredResult)
                with pytest.raises(MCPError) as refused:
                    await c.session.read_resource(
                        "test://mrtr/secret", input_responses=_NAME, request_state=first.request_state
                    )
    _assert_refused(refused)


async def test_a_server_with_resources_but_no_templates_handler_connects(tmp_path: Path) -> None:
    """The SDK answers ``resources/templates/list`` "Method not found" (HTTP 404 when stateless) for a server that
    declares resources but has no templates handler; that is no templates, not a failed connection."""
    port = free_port()
    argv = [sys.executable, str(FIXTURES / "mrtr_server.py"), "--port", str(port), "--no-templates"]
    with start_http_server(argv, port) as bare:
        with run_gateway(_config(bare, audit=False), tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
            with anyio.fail_after(30):
                async with client(gateway.url(), token=None) as c:
                    plain = await c.call_tool("plain", {})
                    read = await c.read_resource("test://mrtr/secret")
    assert _text(plain) == "plain: ok"
    assert [x.text for x in read.contents] == ["secret for 42"]  # type: ignore[union-attr]


async def test_the_backend_sees_the_calling_clients_capabilities(mrtr: Downstream, tmp_path: Path) -> None:
    """The downstream decides what to ask from the capabilities of the client behind the gateway, not the gateway's
    own (which relays all three): the conformance suite's input-required-result-capability-check."""
    with run_gateway(_config(mrtr, audit=False), tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        with anyio.fail_after(30):
            async with client(gateway.url(), token=None, sampling=False) as c:
                first = await c.session.call_tool("polite", {}, allow_input_required=True)
                assert isinstance(first, types.InputRequiredResult) and first.input_requests is not None
                assert list(first.input_requests) == ["name"]  # elicitation only: no sampling was declared
                assert first.request_state is not None  # the gateway's, though the server sent none
                done = await c.call_tool("polite", {})
                ahead = await c.session.call_tool("polite", {}, input_responses=_NAME)  # answered ahead, no state
    assert _text(done) == "polite: name"
    assert _text(ahead) == "polite: name"


def _scenario_checks(launcher: str, url: str, folder: Path) -> dict[str, list[tuple[str, str]]]:
    found: dict[str, list[tuple[str, str]]] = {}
    for scenario in INPUT_REQUIRED_SCENARIOS:
        name = f"input-required-result-{scenario}"
        argv = [launcher, "server", "--url", url, "--scenario", name, "--spec-version", MODERN, "-o", str(folder)]
        subprocess.run(argv, capture_output=True, timeout=90, check=False)
        found[scenario] = [
            (check["id"], check["status"])
            for path in sorted(folder.glob(f"server-{name}-*/checks.json"))
            for check in json.loads(path.read_text())
        ]
    return found


@pytest.mark.node
def test_the_conformance_suites_input_required_scenarios_pass_through_the_gateway(tmp_path: Path) -> None:
    """tests/fixtures/mrtr_conformance_server.py implements the suite's input-required-result scenarios; every
    check that passes against it directly passes through the gateway, with nothing else different."""
    launcher = _conformance_launcher("next-2026-07-28")  # the pinned 0.2 pre-release (or GATEWAY_CONFORMANCE_NEXT)
    port = free_port()
    argv = [sys.executable, str(FIXTURES / "mrtr_conformance_server.py"), "--port", str(port)]
    with start_http_server(argv, port) as target:
        direct = _scenario_checks(launcher, target.url(), tmp_path / "direct")
        config = f"""
gateway:
  audit: {{enabled: false}}
servers:
  target:
    transport: streamable_http
    url: {target.url()}
    protocol: "{MODERN}"
"""
        with run_gateway(config, tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
            through = _scenario_checks(launcher, gateway.url(), tmp_path / "gateway")
    assert sum(len(checks) for checks in direct.values()) == 37
    assert {status for checks in direct.values() for _, status in checks} == {"SUCCESS"}
    assert through == direct
