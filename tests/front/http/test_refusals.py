"""What a refused client reads, and what the operator sees, over a real ``gateway serve`` process with static tokens
and no OAuth: every refusal is a JSON-RPC error (which MCP clients show word for word), a path the gateway does not
serve is 404 before auth (so OAuth discovery and client registration at the gateway end at once), a wrong token is
told ``invalid_token`` (RFC 6750 3.1), and each refusal of a static token is logged once a minute per client,
never with the token."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.conftest import ROOT
from tests.fixtures.gateway_proc import mcp_session, run_gateway
from tests.fixtures.procs import RunningServer

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

TOKEN = "refusals-test-token-7f3a9c"
WRONG = "wrong-token-5d2e81b4"
CONFIG = f"""
gateway:
  name: refusals
  audit: {{enabled: false}}
wiki:
  root: {json.dumps(str(ROOT / "docs"))}
  tools: [wiki_index]
"""
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}},
}
ACCEPT = {"Accept": "application/json, text/event-stream"}


@pytest.fixture
def gateway(gateway_process: Any) -> RunningServer:
    served: RunningServer = gateway_process(CONFIG, tokens=f"alice={TOKEN}")
    return served


async def _post(url: str, headers: dict[str, str]) -> httpx2.Response:
    with anyio.fail_after(10):
        async with httpx2.AsyncClient() as http:
            return await http.post(url, json=INITIALIZE, headers={**ACCEPT, **headers})


@pytest.mark.parametrize(
    ("headers", "status", "message"),
    [
        ({}, 401, "Unauthorized: a valid bearer token is required."),
        ({"Authorization": f"Bearer {WRONG}"}, 401, "Unauthorized: the bearer token is not valid for this gateway."),
        ({"Authorization": f"Bearer {TOKEN}", "Origin": "https://evil.example"}, 403, "Forbidden: Origin not allowed."),
    ],
)
async def test_a_refusal_is_a_json_rpc_error_without_an_id(
    gateway: RunningServer, headers: dict[str, str], status: int, message: str
) -> None:
    refused = await _post(gateway.url(), headers)
    assert refused.status_code == status
    assert refused.json() == {"jsonrpc": "2.0", "id": None, "error": {"code": -32000, "message": message}}


async def test_an_sdk_client_with_a_wrong_token_shows_the_reason_word_for_word(gateway: RunningServer) -> None:
    with pytest.raises(BaseExceptionGroup) as caught, anyio.fail_after(15):  # the SDK's task groups wrap its error
        async with mcp_session(gateway.url(), token=WRONG):
            pass
    errors = _leaves(caught.value)
    assert [(type(e), getattr(e, "message", None)) for e in errors] == [
        (MCPError, "Unauthorized: the bearer token is not valid for this gateway.")
    ]


def _leaves(error: BaseException) -> list[BaseException]:
    if isinstance(error, BaseExceptionGroup):
        return [leaf for inner in error.exceptions for leaf in _leaves(inner)]
    return [error]


async def test_a_wrong_token_is_told_invalid_token_and_no_token_gets_no_error_code(gateway: RunningServer) -> None:
    wrong = await _post(gateway.url(), {"Authorization": f"Bearer {WRONG}"})
    missing = await _post(gateway.url(), {})
    basic = await _post(gateway.url(), {"Authorization": "Basic YWxpY2U6cHc="})
    assert wrong.headers["www-authenticate"] == (
        'Bearer realm="mcp-gateway", error="invalid_token", error_description="the token is not valid"'
    )
    assert missing.headers["www-authenticate"] == basic.headers["www-authenticate"] == 'Bearer realm="mcp-gateway"'


@pytest.mark.parametrize(
    ("method", "path"),
    [
        ("GET", "/.well-known/oauth-protected-resource"),
        ("GET", "/.well-known/oauth-protected-resource/mcp"),
        ("GET", "/.well-known/oauth-authorization-server"),
        ("GET", "/.well-known/openid-configuration"),
        ("POST", "/register"),
        ("GET", "/authorize"),
        ("POST", "/token"),
    ],
)
async def test_without_oauth_discovery_and_registration_are_not_found_to_anyone(
    gateway: RunningServer, method: str, path: str
) -> None:
    with anyio.fail_after(10):
        async with httpx2.AsyncClient() as http:
            anonymous = await http.request(method, gateway.url(path))
            holder = await http.request(method, gateway.url(path), headers={"Authorization": f"Bearer {TOKEN}"})
    for answer in (anonymous, holder):
        assert answer.status_code == 404, (path, answer.text)
        assert "www-authenticate" not in answer.headers
        assert answer.json()["error"]["message"] == (  # what Claude Code and mcp-remote show their user
            "Not found: this gateway does no OAuth sign-in; it takes a bearer token from its operator."
        )


async def test_a_path_it_does_not_serve_is_not_found_before_auth(gateway: RunningServer) -> None:
    with anyio.fail_after(10):
        async with httpx2.AsyncClient() as http:
            answer = await http.get(gateway.url("/nothing/here"))
    assert answer.status_code == 404
    assert answer.json()["error"]["message"] == "Not found: this gateway serves nothing at '/nothing/here'."


async def test_the_paths_it_serves_still_need_the_token(gateway: RunningServer) -> None:
    with anyio.fail_after(10):
        async with httpx2.AsyncClient() as http:
            assert (await http.get(gateway.url("/status"))).status_code == 401
            assert (await http.get(gateway.url("/healthz"))).status_code == 200
            assert (await http.get(gateway.url("/status"), headers={"Authorization": f"Bearer {TOKEN}"})).is_success


async def test_static_token_refusals_are_logged_once_a_minute_per_client_and_kind_never_with_the_token(
    tmp_path: Path,
) -> None:
    with run_gateway(CONFIG, tmp_path, tokens=f"alice={TOKEN}") as gateway:
        for _ in range(12):
            assert (await _post(gateway.url(), {"Authorization": f"Bearer {WRONG}"})).status_code == 401
        for _ in range(3):
            assert (await _post(gateway.url(), {})).status_code == 401
        async with mcp_session(gateway.url(), token=TOKEN) as session:  # the log has caught up with the refusals
            await session.list_tools()
        output = gateway.output()
    lines = [json.loads(line) for line in output.splitlines() if '"auth.refused"' in line]
    assert [(line["error"], line["client"], line["path"], line["suppressed"]) for line in lines] == [
        ("invalid_token", "127.0.0.1", "/mcp", 0),
        ("missing_token", "127.0.0.1", "/mcp", 0),
    ]
    assert lines[0]["level"] == "warning" and lines[1]["level"] == "info"
    assert WRONG not in output and TOKEN not in output
