"""Cross App Access (SEP-990) through the gateway, against a real world on loopback (tests/fixtures/cross_app_server.py:
an identity provider, an authorization server that takes the ``jwt-bearer`` grant, the MCP server it protects): the
gateway exchanges its ID token for an ID-JAG, presents it, serves every caller with the token, renews it by a new
exchange, and never writes a token or a secret in its log. (The conformance suite's
``auth/cross-app-access-complete-flow`` runs in tests/system/test_conformance_gateway.py.)"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from gateway.auth.connections import Connections
from gateway.auth.credentials import NoCredential
from gateway.backends.mcp.signin import GATEWAY_ROW, SignIn
from gateway.config import HttpServer
from tests.backends.mcp.test_signin import STATE_KEY, TOKENS, WAIT, config, ready, tools_of, whoami
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, run_gateway
from tests.fixtures.identity import holds_jwt
from tests.fixtures.procs import free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

ID_TOKEN = "carol-id-token-0123456789"
OAUTH = (
    'per: gateway, client_id: gw, client_secret: "${GW_SECRET}", allow_http: true, cross_app: {'
    'token_endpoint: "http://127.0.0.1:PORT/idp/token", client_id: idp-gw, client_secret: "${IDP_SECRET}", '
    'id_token: "${ID_TOKEN}"}'
)
ENV = {"GATEWAY_STATE_KEY": STATE_KEY, "GW_SECRET": "gw-secret", "IDP_SECRET": "idp-secret", "ID_TOKEN": ID_TOKEN}


def events(output: str) -> list[dict[str, str]]:
    return [json.loads(line) for line in output.splitlines() if line.startswith('{"event"')]


@pytest.mark.parametrize("ttl_s", [3600, 20], ids=["long-lived", "renewed"])
async def test_every_caller_is_served_with_the_token_the_id_jag_was_exchanged_for(tmp_path: Path, ttl_s: int) -> None:
    mcp_port, port = free_port(), free_port()
    argv = [PYTHON, str(FIXTURES / "cross_app_server.py"), str(mcp_port), str(ttl_s)]
    with start_http_server(argv, mcp_port) as world:
        text = config(world, port, OAUTH.replace("PORT", str(mcp_port)))
        with run_gateway(text, tmp_path, tokens=TOKENS, env=ENV, port=port) as gw:
            await ready(gw)
            for caller in ("tok-alice-0123456789", "tok-bob-0123456789"):
                assert (await whoami(gw, caller)) == (False, "account: carol")
            log = gw.output()
        seen = events(world.output())
    grants = [event["jti"] for event in seen if event["event"] == "grant"]
    assert grants and [event["jti"] for event in seen if event["event"] == "exchange"] == grants
    # a token under the renewal margin (20 s < 30 s) is replaced at once by a new exchange and grant
    assert len(grants) >= 2 if ttl_s == 20 else len(grants) == 1, seen
    for secret in (ID_TOKEN, "gw-secret", "idp-secret"):
        assert secret not in log, secret
    assert not holds_jwt(log), "a JWT (the ID-JAG) reached the gateway's log"
    assert not re.search(r"at-[0-9a-f]{24}", log), "an access token reached the gateway's log"


async def test_an_id_token_the_identity_provider_refuses_is_said_without_it(tmp_path: Path) -> None:
    mcp_port, port = free_port(), free_port()
    argv = [PYTHON, str(FIXTURES / "cross_app_server.py"), str(mcp_port), "3600"]
    with start_http_server(argv, mcp_port) as world:
        text = config(world, port, OAUTH.replace("PORT", str(mcp_port)))
        env = {**ENV, "ID_TOKEN": "mallory-id-token-0123456789"}
        with run_gateway(text, tmp_path, tokens=TOKENS, env=env, port=port) as gw:

            async def refused() -> bool:
                return "signin.failed" in gw.output()

            await eventually(refused, within=WAIT)
            listed = await tools_of(gw, "tok-alice-0123456789")
            log = gw.output()
    assert "whoami" not in listed
    assert "identity provider did not give an ID-JAG" in log and "invalid_grant" in log, log[-3000:]
    assert "mallory-id-token" not in log


async def test_a_fixed_issuer_is_used_whatever_the_server_names(tmp_path: Path) -> None:
    # the server's resource metadata names another authorization server: with `issuer` it is not asked
    mcp_port, port = free_port(), free_port()
    argv = [PYTHON, str(FIXTURES / "cross_app_server.py"), str(mcp_port), "3600", "lying"]
    with start_http_server(argv, mcp_port) as world:
        oauth = OAUTH.replace("PORT", str(mcp_port))[:-1] + f', issuer: "http://127.0.0.1:{mcp_port}"}}'
        with run_gateway(config(world, port, oauth), tmp_path, tokens=TOKENS, env=ENV, port=port) as gw:
            await ready(gw)
            assert (await whoami(gw, "tok-alice-0123456789")) == (False, "account: carol")


async def test_an_id_token_file_is_read_afresh_at_each_exchange(tmp_path: Path) -> None:
    mcp_port = free_port()
    (tmp_path / "id-token").write_text(ID_TOKEN + "\n")
    oauth = {
        "per": "gateway",
        "client_id": "gw",
        "client_secret": "gw-secret",
        "allow_http": True,
        "cross_app": {
            "token_endpoint": f"http://127.0.0.1:{mcp_port}/idp/token",
            "client_id": "idp-gw",
            "client_secret": "idp-secret",
            "id_token_file": str(tmp_path / "id-token"),
        },
    }
    server = HttpServer.model_validate(
        {"transport": "streamable_http", "url": f"http://127.0.0.1:{mcp_port}/mcp", "auth": {"oauth": oauth}}
    )
    signin = SignIn("remote", server, Connections(None, [b"k" * 32]), "http://127.0.0.1:1")
    argv = [PYTHON, str(FIXTURES / "cross_app_server.py"), str(mcp_port), "3600"]
    with start_http_server(argv, mcp_port) as world:
        await signin.token("")
        (tmp_path / "id-token").write_text("mallory-id-token-0123456789")  # replaced: the next exchange sends it
        await signin.refused(GATEWAY_ROW)
        with pytest.raises(NoCredential):
            await signin.token("")
        seen = events(world.output())
    assert [event["event"] for event in seen] == ["exchange", "grant"]
