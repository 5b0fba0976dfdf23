"""Browser-based MCP clients on another origin (CORS, ``gateway/http.py``), over a real ``gateway serve`` and raw
HTTP: the Protected Resource Metadata is readable from any origin the Origin check admits; ``/mcp`` answers a
preflight, without a token and without work, only for an origin listed in ``gateway.allowed_origins``, echoes only
the MCP request headers, and lets the page read the session id and the 401 challenge; a foreign Origin is refused
403 exactly as before."""

from __future__ import annotations

import json

import anyio
import httpx2
import pytest

from tests.fixtures.gateway_proc import PYTHON, GatewayProcesses, echo_argv
from tests.fixtures.procs import RunningServer, free_port

pytestmark = pytest.mark.anyio

ALLOWED = "https://inspector.example"
LOCAL = "http://localhost:6274"  # admitted by the Origin check on a loopback bind, but not listed
FOREIGN = "https://evil.example"
PRM = "/.well-known/oauth-protected-resource/mcp"
INITIALIZE = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {"protocolVersion": "2025-06-18", "capabilities": {}, "clientInfo": {"name": "web", "version": "1"}},
}
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


@pytest.fixture(scope="module")
def gateway(gateway_process: GatewayProcesses) -> RunningServer:
    port = free_port()
    # The issuer is never contacted: no test here offers a JWT.
    config = f"""
gateway:
  allowed_origins: ["{ALLOWED}"]
  auth:
    oauth:
      resource: http://127.0.0.1:{port}/mcp
      issuers:
        idp: {{issuer: "http://127.0.0.1:{free_port()}/idp"}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
"""
    return gateway_process(config, tokens="ops=tok-ops", port=port)


async def send(method: str, url: str, headers: dict[str, str], body: object = None) -> httpx2.Response:
    with anyio.fail_after(15):
        async with httpx2.AsyncClient(timeout=10) as http:
            content = json.dumps(body).encode() if body is not None else None
            return await http.request(method, url, headers=headers, content=content)


def preflight(origin: str, method: str = "POST", headers: str | None = None) -> dict[str, str]:
    out = {"Origin": origin, "Access-Control-Request-Method": method}
    if headers is not None:
        out["Access-Control-Request-Headers"] = headers
    return out


async def test_the_resource_metadata_is_readable_from_any_admitted_origin(gateway: RunningServer) -> None:
    for origin in (ALLOWED, LOCAL):
        response = await send("GET", gateway.url(PRM), {"Origin": origin, "MCP-Protocol-Version": "2025-06-18"})
        assert response.status_code == 200, response.text
        assert response.headers["access-control-allow-origin"] == "*"
        assert response.json()["resource"] == gateway.url()
        answer = await send("OPTIONS", gateway.url(PRM), preflight(origin, "GET", "mcp-protocol-version"))
        assert answer.status_code == 200, answer.text
        assert answer.headers["access-control-allow-origin"] == "*"
        assert answer.headers["access-control-allow-headers"] == "mcp-protocol-version"
    refused = await send("GET", gateway.url(PRM), {"Origin": FOREIGN})
    assert refused.status_code == 403  # the Origin check comes first, for every path
    assert "access-control-allow-origin" not in refused.headers


async def test_a_preflight_from_a_listed_origin_is_answered_without_a_token_and_echoes_the_mcp_headers(
    gateway: RunningServer,
) -> None:
    asked = "authorization, content-type, mcp-session-id, mcp-protocol-version, mcp-method, mcp-name, mcp-param-region"
    response = await send("OPTIONS", gateway.url(), preflight(ALLOWED, "POST", asked))
    assert response.status_code == 200, response.text
    assert response.headers["access-control-allow-origin"] == ALLOWED
    assert response.headers["access-control-allow-methods"] == "GET, POST, DELETE"
    assert response.headers["access-control-allow-headers"] == asked
    assert "Origin" in response.headers["vary"]
    assert response.headers["connection"] == "close"  # no token: it holds no connection
    for method in ("GET", "DELETE"):
        assert (await send("OPTIONS", gateway.url(), preflight(ALLOWED, method))).status_code == 200


async def test_a_preflight_does_no_work(gateway: RunningServer) -> None:
    status = {"Authorization": "Bearer tok-ops"}
    before = (await send("GET", gateway.url("/status"), status)).json()["sessions"]
    headers = preflight(ALLOWED, "POST", "content-type, mcp-session-id") | ACCEPT
    response = await send("OPTIONS", gateway.url(), headers, INITIALIZE)
    assert response.status_code == 200
    assert response.text == "OK"  # not the SDK's answer to an initialize
    assert (await send("GET", gateway.url("/status"), status)).json()["sessions"] == before


async def test_a_preflight_is_refused_for_an_unlisted_origin_another_method_or_another_header(
    gateway: RunningServer,
) -> None:
    foreign = await send("OPTIONS", gateway.url(), preflight(FOREIGN, "POST", "content-type"))
    assert foreign.status_code == 403, foreign.text  # the DNS-rebinding protection, unchanged
    assert "access-control-allow-origin" not in foreign.headers
    local = await send("OPTIONS", gateway.url(), preflight(LOCAL, "POST", "content-type"))
    assert local.status_code == 400, local.text  # admitted by the Origin check, but not listed: no CORS
    assert "access-control-allow-origin" not in local.headers
    method = await send("OPTIONS", gateway.url(), preflight(ALLOWED, "PUT"))
    assert method.status_code == 400, method.text
    header = await send("OPTIONS", gateway.url(), preflight(ALLOWED, "POST", "content-type, x-forwarded-user"))
    assert header.status_code == 400
    assert header.text == "Disallowed CORS headers: x-forwarded-user"
    assert "access-control-allow-headers" not in header.headers


async def test_the_401_challenge_and_the_session_id_are_exposed_to_a_listed_origin(gateway: RunningServer) -> None:
    refused = await send("POST", gateway.url(), {"Origin": ALLOWED} | ACCEPT, INITIALIZE)
    assert refused.status_code == 401
    assert refused.headers["www-authenticate"].startswith("Bearer ")
    assert refused.headers["access-control-allow-origin"] == ALLOWED
    assert refused.headers["vary"] == "Origin"
    assert refused.headers["access-control-expose-headers"] == "Mcp-Session-Id, WWW-Authenticate, Retry-After"

    token = {"Origin": ALLOWED, "Authorization": "Bearer tok-ops"} | ACCEPT
    opened = await send("POST", gateway.url(), token, INITIALIZE)
    assert opened.status_code == 200, opened.text
    assert opened.headers["access-control-allow-origin"] == ALLOWED
    assert "Mcp-Session-Id" in opened.headers["access-control-expose-headers"]
    session = opened.headers["mcp-session-id"]
    closed = await send("DELETE", gateway.url(), token | {"Mcp-Session-Id": session})
    assert closed.status_code == 200
    assert closed.headers["access-control-allow-origin"] == ALLOWED


async def test_a_foreign_origin_is_refused_even_with_a_token(gateway: RunningServer) -> None:
    headers = {"Origin": FOREIGN, "Authorization": "Bearer tok-ops"} | ACCEPT
    refused = await send("POST", gateway.url(), headers, INITIALIZE)
    assert refused.status_code == 403
    assert "access-control-allow-origin" not in refused.headers
    unlisted = await send("POST", gateway.url(), headers | {"Origin": LOCAL}, INITIALIZE)
    assert unlisted.status_code == 200  # the Origin check admits a loopback page as before...
    assert "access-control-allow-origin" not in unlisted.headers  # ...but a browser does not let it read the answer
    assert unlisted.headers["vary"] == "Origin"
