"""Policies and per-caller credentials for OAuth callers: JWT access tokens from a real OpenID provider (npm
``oidc-provider`` on loopback, tests/fixtures/identity.py) pick a policy by their subject and their scopes, in both
protocol eras; a policy's limits hold for its callers; and RFC 8693 token exchange gives each OAuth caller its own
downstream token from a real token endpoint (tests/fixtures/token_exchange_server.py)."""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import anyio
import pytest

from gateway.auth.exchange import GRANT_TYPE
from tests.core.test_policies import HANDSHAKE, MODERN, WAIT, exchange_world, raw
from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session, run_gateway
from tests.fixtures.identity import IdentityProvider, start_identity_provider
from tests.fixtures.procs import RunningServer, free_port

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


def oauth(issuer: str, resource: str) -> str:
    return f"""  auth:
    oauth:
      resource: {resource}
      required_scopes: [mcp:tools]
      issuers:
        test-idp: {{issuer: "{issuer}"}}"""


def config(issuer: str, resource: str) -> str:
    return f"""
gateway:
  audit: {{path: audit.db}}
{oauth(issuer, resource)}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
policies:
  alpha:
    callers: ["test-idp:alpha"]
    tools: {{include: [echo]}}
    limits: {{requests_per_s: 0.001, burst: 3}}
  readers:
    callers: ["test-idp:*"]
    scopes: [mcp:read]
    tools: {{include: [echo, add, pid]}}
  others:
    callers: ["test-idp:*"]
    tools: {{include: [add]}}
"""


@contextmanager
def world(folder: Path) -> Iterator[tuple[IdentityProvider, RunningServer]]:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    with (
        start_identity_provider(resource) as idp,
        run_gateway(config(idp.issuer, resource), folder, tokens="ops=tok-ops-0123", port=port) as gateway,
    ):
        yield idp, gateway


@pytest.mark.parametrize("era", [HANDSHAKE, MODERN])
async def test_a_jwt_callers_subject_and_scopes_pick_its_policy_and_a_hidden_tool_is_unknown(
    tmp_path: Path, era: str
) -> None:
    with world(tmp_path) as (idp, gateway):
        beta_reader = await idp.client_credentials("beta", scope="mcp:tools mcp:read")
        beta = await idp.client_credentials("beta", scope="mcp:tools")
        async with raw(gateway.url(), beta_reader, era) as reader, raw(gateway.url(), beta, era) as plain:
            assert await reader.tools() == {"echo", "add", "pid"}
            assert await plain.tools() == {"add"}  # the same subject without mcp:read: the next policy
            hidden = await plain.send("tools/call", {"name": "pid", "arguments": {}})
            status = plain.status
            unknown = await plain.send("tools/call", {"name": "pi_", "arguments": {}})
            assert hidden.replace(b"pid", b"pi_") == unknown and status == plain.status
            served = json.loads(await reader.send("tools/call", {"name": "pid", "arguments": {}}))
            assert int(served["result"]["content"][0]["text"]) > 0
    with sqlite3.connect(tmp_path / "audit.db") as db:
        found = db.execute("SELECT caller, tool, status FROM calls ORDER BY id").fetchall()
    assert found == [
        ("test-idp:beta", "pid", "refused"),
        ("test-idp:beta", "pi_", "unknown_tool"),
        ("test-idp:beta", "pid", "ok"),
    ]


async def test_a_policys_limits_hold_for_its_caller_and_name_the_policy(tmp_path: Path) -> None:
    with world(tmp_path) as (idp, gateway):
        alpha = await idp.client_credentials("alpha")
        async with raw(gateway.url(), alpha, MODERN) as client:
            assert await client.tools() == {"echo"}
            assert await client.tools() == {"echo"}
            answers = [json.loads(await client.send("tools/list", {})) for _ in range(2)]
            statuses = client.status
        async with raw(gateway.url(), await idp.client_credentials("beta"), MODERN) as bystander:
            assert await bystander.tools() == {"add"}  # another policy, no limit
    assert "result" in answers[0]
    assert statuses == 429
    assert "policies.alpha.limits" in answers[1]["error"]["message"]


async def test_token_exchange_gives_each_oauth_caller_its_own_downstream_token(tmp_path: Path) -> None:
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    with (
        start_identity_provider(resource) as idp,
        exchange_world(tmp_path, oauth(idp.issuer, resource), port) as (
            gateway,
            tx,
            seen,
        ),
    ):
        answers = {}
        for client in ("alpha", "beta", "alpha"):
            token = await idp.client_credentials(client)
            async with mcp_session(gateway.url(), token=token) as session:
                with anyio.fail_after(WAIT):
                    result = await session.call_tool("whoami", {})
            assert not result.is_error, result
            answers[client] = result.content[0].text  # type: ignore[union-attr]
        exchanges = [json.loads(line) for line in tx.output().splitlines() if line.startswith("{")]
        log = gateway.output()
    assert answers == {"alpha": "Bearer exchanged.alpha.svc-api", "beta": "Bearer exchanged.beta.svc-api"}
    assert [e["sub"] for e in exchanges] == ["alpha", "beta"]  # alpha's second session reused its exchanged token
    assert {e["audience"] for e in exchanges} == {"svc-api"}
    sent = set(seen.read_text().split("\n")) - {""}
    assert sent == {"Bearer gateway-own-token-1", "Bearer exchanged.alpha.svc-api", "Bearer exchanged.beta.svc-api"}
    assert "exchanged.alpha" not in log and "gw-secret" not in log and GRANT_TYPE not in log
