"""Workload identity federation (SEP-1933) against a real authorization server on loopback
(tests/fixtures/cross_app_server.py): the gateway presents the JWT its platform issued it with the ``jwt-bearer``
grant as a public client, serves every caller with the token it gets, reads a token file afresh at each grant (the
platform rotates it), never sends the JWT to an authorization server its audience does not name, and never writes
it in its log. (The conformance suite's ``auth/wif-jwt-bearer`` runs in tests/system/test_conformance_gateway.py.)"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import jwt
import pytest
from structlog.testing import capture_logs

from gateway.auth.connections import Connections
from gateway.auth.credentials import NoCredential
from gateway.backends.mcp.signin import GATEWAY_ROW, SignIn
from gateway.config import HttpServer
from tests.backends.mcp.test_signin import STATE_KEY, TOKENS, config, ready, whoami
from tests.fixtures.cross_app_server import WORKLOAD_KEY
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, run_gateway
from tests.fixtures.identity import holds_jwt
from tests.fixtures.procs import RunningServer, free_port, start_http_server

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]


def workload_jwt(subject: str, audience: str) -> str:
    now = int(time.time())
    claims = {"iss": "https://k8s.test", "sub": subject, "aud": audience, "iat": now, "exp": now + 600}
    return jwt.encode(claims, WORKLOAD_KEY, algorithm="HS256")


def grants(world: RunningServer) -> list[dict[str, str]]:
    lines = [json.loads(line) for line in world.output().splitlines() if line.startswith('{"event"')]
    return [line for line in lines if line["event"] == "workload"]


async def test_every_caller_is_served_with_the_token_the_workload_jwt_was_granted(tmp_path: Path) -> None:
    mcp_port, port = free_port(), free_port()
    argv = [PYTHON, str(FIXTURES / "cross_app_server.py"), str(mcp_port), "3600"]
    token = workload_jwt("system:serviceaccount:tools:gateway", f"http://127.0.0.1:{mcp_port}")
    oauth = "per: gateway, client_id: gw-workload, workload_token: '${WL_TOKEN}', allow_http: true"
    with start_http_server(argv, mcp_port) as world:
        env = {"GATEWAY_STATE_KEY": STATE_KEY, "WL_TOKEN": token}
        with run_gateway(config(world, port, oauth), tmp_path, tokens=TOKENS, env=env, port=port) as gw:
            await ready(gw)
            for caller in ("tok-alice-0123456789", "tok-bob-0123456789"):
                assert (await whoami(gw, caller)) == (False, "account: system:serviceaccount:tools:gateway")
            log = gw.output()
        seen = grants(world)
    assert seen == [{"event": "workload", "sub": "system:serviceaccount:tools:gateway", "client_id": "gw-workload"}]
    assert token not in log and not holds_jwt(log)
    assert not re.search(r"at-[0-9a-f]{24}", log), "an access token reached the gateway's log"


def signin_with(folder: Path, mcp_port: int) -> SignIn:
    oauth = {"per": "gateway", "workload_token_file": str(folder / "token"), "allow_http": True}
    server = HttpServer.model_validate(
        {"transport": "streamable_http", "url": f"http://127.0.0.1:{mcp_port}/mcp", "auth": {"oauth": oauth}}
    )
    return SignIn("remote", server, Connections(None, [b"k" * 32]), "http://127.0.0.1:1")


async def test_a_rotated_token_file_is_read_at_the_next_grant(tmp_path: Path) -> None:
    mcp_port = free_port()
    issuer = f"http://127.0.0.1:{mcp_port}"
    (tmp_path / "token").write_text(workload_jwt("first", issuer) + "\n")
    argv = [PYTHON, str(FIXTURES / "cross_app_server.py"), str(mcp_port), "3600"]
    with start_http_server(argv, mcp_port) as world:
        signin = signin_with(tmp_path, mcp_port)
        first, _ = await signin.token("")
        (tmp_path / "token").write_text(workload_jwt("second", issuer))  # the platform rotated it
        assert (await signin.token(""))[0] == first  # a held token is used while it lasts
        await signin.refused(GATEWAY_ROW)  # the server refused it: the next session takes a new grant
        second, _ = await signin.token("")
        seen = [grant["sub"] for grant in grants(world)]
    assert second != first and seen == ["first", "second"]


async def test_a_workload_token_for_another_audience_is_never_sent(tmp_path: Path) -> None:
    mcp_port = free_port()
    (tmp_path / "token").write_text(workload_jwt("first", "https://other-as.example.com"))
    argv = [PYTHON, str(FIXTURES / "cross_app_server.py"), str(mcp_port), "3600"]
    with start_http_server(argv, mcp_port) as world, capture_logs() as logs:
        with pytest.raises(NoCredential):
            await signin_with(tmp_path, mcp_port).token("")
        assert grants(world) == []
    failed = [entry["reason"] for entry in logs if entry["event"] == "signin.failed"]
    assert len(failed) == 1 and "audience does not name the authorization server" in failed[0], logs
