"""``auth: {oauth: ...}`` on a streamable HTTP server: what it accepts, and each mistake named at its key path."""

from __future__ import annotations

import pytest

from gateway.config import HttpServer, parse_config
from tests.config.test_config import FILE, config_error, yaml_text

BASE = """
servers:
  remote:
    transport: streamable_http
    url: https://mcp.example.com/mcp
"""


def test_per_caller_is_the_default_and_the_secret_comes_from_the_environment() -> None:
    text = yaml_text(BASE) + "    auth: {oauth: {client_id: gw, client_secret: '${GW_SECRET}'}}\n"
    fed = parse_config(text, file=FILE, env={"GW_SECRET": "s3cr3t-client"})
    server = fed.servers["remote"]
    assert isinstance(server, HttpServer) and server.auth is not None
    assert (server.auth.oauth.per, server.auth.oauth.client_secret) == ("caller", "s3cr3t-client")


@pytest.mark.parametrize(
    ("extra", "key_path", "words"),
    [
        ("    auth: {oauth: {per: gateway}}\n", "servers.remote.auth.oauth", "client_credentials"),
        ("    auth: {oauth: {per: everyone}}\n", "servers.remote.auth.oauth.per", "must be one of caller, gateway"),
        ("    auth: {oauth: {client_secret: x}}\n", "servers.remote.auth.oauth", "client_secret needs client_id"),
        (
            "    auth: {oauth: {client_metadata_url: 'http://a.example/c'}}\n",
            "servers.remote.auth.oauth.client_metadata_url",
            "https URL",
        ),
        ("    auth: {oauth: {}, token: x}\n", "servers.remote.auth.token", "unknown key"),
        ("    auth: {}\n", "servers.remote.auth.oauth", "required"),
        ("    headers: {Authorization: Bearer x}\n    auth: {oauth: {}}\n", "servers.remote", "Authorization"),
        ("    session: per_client\n    auth: {oauth: {}}\n", "servers.remote", "per_client"),
    ],
    ids=[
        "gateway-without-client",
        "bad-per",
        "secret-without-id",
        "cimd-http",
        "unknown-key",
        "no-oauth",
        "header",
        "per-client",
    ],
)
def test_a_mistake_is_named_at_its_key_path(extra: str, key_path: str, words: str) -> None:
    err = config_error(yaml_text(BASE) + extra)
    assert err.key_path == key_path, str(err)
    assert words in str(err), str(err)


def test_the_client_secret_is_never_echoed() -> None:
    text = yaml_text(BASE) + "    auth: {oauth: {per: gateway, client_secret: '${GW_SECRET}'}}\n"
    err = config_error(text, env={"GW_SECRET": "s3cr3t-client-value"})
    assert "s3cr3t-client-value" not in str(err)


def test_connect_url_is_an_absolute_url() -> None:
    err = config_error("gateway:\n  auth: {connect_url: 'ftp://gw'}\n")
    assert err.key_path == "gateway.auth.connect_url"
    fed = parse_config("gateway:\n  auth: {connect_url: 'https://gw.example.com/'}\n", file=FILE, env={})
    assert fed.gateway.auth.connect_url == "https://gw.example.com"
