"""The gateway's own Client ID Metadata Document (``/ui/connect/client.json``): published by a gateway that signs in
to OAuth-protected servers, and offered as its client id when browsers reach it over https (an authorization server
that supports CIMD fetches it; one over plain http could not be a client id). The conformance suite's
``auth/basic-cimd`` (tests/system/test_conformance_gateway.py) checks the id reaches the authorization server."""

from __future__ import annotations

from pathlib import Path

import httpx2
import pytest

from gateway.auth.connections import Connections
from gateway.backends.mcp.signin import SignIn
from gateway.config import HttpServer
from tests.fixtures.gateway_proc import run_gateway
from tests.fixtures.procs import free_port


def server(**oauth: str) -> HttpServer:
    return HttpServer.model_validate(
        {"transport": "streamable_http", "url": "https://mcp.example.com/mcp", "auth": {"oauth": oauth}}
    )


@pytest.mark.parametrize(
    ("connect_url", "oauth", "client_id"),
    [
        ("https://gw.example.com", {}, "https://gw.example.com/ui/connect/client.json"),
        ("http://127.0.0.1:8080", {}, None),
        (
            "http://127.0.0.1:8080",
            {"client_metadata_url": "https://cdn.example.com/c.json"},
            "https://cdn.example.com/c.json",
        ),
        (
            "https://gw.example.com",
            {"client_metadata_url": "https://cdn.example.com/c.json"},
            "https://cdn.example.com/c.json",
        ),
    ],
    ids=["own-over-https", "none-over-http", "configured", "configured-wins"],
)
def test_the_client_id_offered_is_the_configured_document_else_the_gateways_own_over_https(
    connect_url: str, oauth: dict[str, str], client_id: str | None
) -> None:
    signin = SignIn("remote", server(**oauth), Connections(None, [b"k" * 32]), connect_url)
    assert signin.client_metadata_url == client_id


@pytest.mark.spawns
def test_the_gateway_publishes_its_client_metadata_document(tmp_path: Path) -> None:
    config = """
gateway:
  name: team-gateway
  audit: {enabled: false}
  auth: {connect_url: "https://gw.example.com"}
servers:
  remote:
    transport: streamable_http
    url: https://mcp.example.com/mcp
    auth: {oauth: {}}
"""
    with run_gateway(config, tmp_path, port=free_port(), started=False) as gateway:
        answer = httpx2.get(gateway.url("/ui/connect/client.json"), timeout=10)
    assert answer.status_code == 200, answer.text
    assert answer.headers["content-type"].startswith("application/json")
    assert answer.json() == {
        "client_id": "https://gw.example.com/ui/connect/client.json",
        "client_name": "team-gateway",
        "client_uri": "https://gw.example.com",
        "redirect_uris": ["https://gw.example.com/ui/connect/callback"],
        "grant_types": ["authorization_code", "refresh_token"],
        "response_types": ["code"],
        "token_endpoint_auth_method": "none",
    }
