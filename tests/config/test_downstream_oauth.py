"""``auth: {oauth: ...}`` on a streamable HTTP server: what it accepts, and each mistake named at its key path."""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa

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


def _pem(kind: str) -> str:
    key = ec.generate_private_key(ec.SECP256R1()) if kind == "ec" else rsa.generate_private_key(65537, 2048)
    encoding, private = serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8
    return key.private_bytes(encoding, private, serialization.NoEncryption()).decode()


def test_per_gateway_signs_its_assertion_with_a_key_from_the_environment_or_a_file(tmp_path: Path) -> None:
    pem = _pem("ec")
    text = yaml_text(BASE) + (
        "    auth: {oauth: {per: gateway, client_id: gw, private_key: '${GW_KEY}', signing_algorithm: ES256}}\n"
    )
    server = parse_config(text, file=FILE, env={"GW_KEY": pem}).servers["remote"]
    assert isinstance(server, HttpServer) and server.auth is not None
    assert server.auth.oauth.signing_key() == pem
    (tmp_path / "gw.pem").write_text(pem)
    text = yaml_text(BASE) + (
        "    auth: {oauth: {per: gateway, client_id: gw, private_key_file: gw.pem, signing_algorithm: ES256}}\n"
    )
    server = parse_config(text, file=tmp_path / "federation.yaml", env={}).servers["remote"]
    assert isinstance(server, HttpServer) and server.auth is not None
    assert server.auth.oauth.signing_key() == pem


@pytest.mark.parametrize(
    ("oauth", "words"),
    [
        ("{per: gateway, client_id: gw, private_key: '${GW_KEY}'}", "not a key RS256 signs with"),
        ("{per: gateway, client_id: gw, private_key: 'not a key at all'}", "not a PEM private key"),
        ("{per: gateway, client_id: gw, client_secret: s, private_key: '${GW_KEY}'}", "one of client_secret"),
        ("{per: gateway, client_id: gw, private_key_file: /nonexistent/gw.pem}", "cannot be read"),
        ("{client_id: gw, private_key: '${GW_KEY}'}", "are for per: gateway"),
        ("{per: gateway, client_id: gw, private_key: '${GW_KEY}', signing_algorithm: HS256}", "ES256"),
    ],
    ids=["wrong-kind", "not-pem", "two-credentials", "no-file", "per-caller", "mac-algorithm"],
)
def test_a_bad_assertion_key_is_named_and_never_echoed(oauth: str, words: str) -> None:
    pem = _pem("ec")
    err = config_error(yaml_text(BASE) + f"    auth: {{oauth: {oauth}}}\n", env={"GW_KEY": pem})
    assert err.key_path.startswith("servers.remote.auth.oauth"), str(err)
    assert words in str(err), str(err)
    assert pem.splitlines()[1] not in str(err)


CROSS_APP = "cross_app: {token_endpoint: 'https://idp.example.com/token', client_id: idp-gw, id_token: '${ID_TOKEN}'}"


def test_cross_app_reads_its_id_token_from_the_environment() -> None:
    text = yaml_text(BASE) + f"    auth: {{oauth: {{per: gateway, client_id: gw, client_secret: s, {CROSS_APP}}}}}\n"
    fed = parse_config(text, file=FILE, env={"ID_TOKEN": "eyJ-the-id-token"})
    server = fed.servers["remote"]
    assert isinstance(server, HttpServer) and server.auth is not None and server.auth.oauth.cross_app is not None
    assert (server.auth.oauth.cross_app.id_token, server.auth.oauth.cross_app.client_secret) == (
        "eyJ-the-id-token",
        None,
    )


@pytest.mark.parametrize(
    ("oauth", "key_path", "words"),
    [
        (f"client_id: gw, client_secret: s, {CROSS_APP}", "servers.remote.auth.oauth", "needs per: gateway"),
        (f"per: gateway, client_id: gw, private_key: k, {CROSS_APP}", "servers.remote.auth.oauth", "client_secret"),
        (
            "per: gateway, client_id: gw, client_secret: s, cross_app: {client_id: i, id_token: t, "
            "token_endpoint: 'http://idp.example.com/token'}",
            "servers.remote.auth.oauth.cross_app.token_endpoint",
            "must use https",
        ),
        (
            f"per: gateway, client_id: gw, client_secret: s, {CROSS_APP[:-1]}, issuer: 'http://as.example.com'}}",
            "servers.remote.auth.oauth.cross_app.issuer",
            "issuer must use https",
        ),
        (
            "per: gateway, client_id: gw, client_secret: s, cross_app: {client_id: i, token_endpoint: 'https://i/t'}",
            "servers.remote.auth.oauth.cross_app",
            "give id_token",
        ),
        (
            f"per: gateway, client_id: gw, client_secret: s, {CROSS_APP[:-1]}, id_token_file: /run/t}}",
            "servers.remote.auth.oauth.cross_app",
            "not both",
        ),
        (
            "per: gateway, client_id: gw, client_secret: s, cross_app: {client_id: i, token_endpoint: 'https://i/t', "
            "id_token_file: /nonexistent/id-token}",
            "servers.remote.auth.oauth.cross_app",
            "id_token_file /nonexistent/id-token cannot be read",
        ),
        (
            f"per: gateway, client_id: gw, client_secret: s, {CROSS_APP[:-1]}, audience: x}}",
            "servers.remote.auth.oauth.cross_app.audience",
            "unknown key",
        ),
    ],
    ids=["per-caller", "private-key", "idp-http", "issuer-http", "no-id-token", "both", "no-file", "unknown-key"],
)
def test_a_cross_app_mistake_is_named_at_its_key_path(oauth: str, key_path: str, words: str) -> None:
    err = config_error(yaml_text(BASE) + f"    auth: {{oauth: {{{oauth}}}}}\n", env={"ID_TOKEN": "eyJ-secret-id-token"})
    assert err.key_path == key_path, str(err)
    assert words in str(err), str(err)
    assert "eyJ-secret-id-token" not in str(err)


def test_cross_app_and_a_workload_token_may_come_from_files_beside_the_configuration(tmp_path: Path) -> None:
    (tmp_path / "id-token").write_text("eyJ-id\n")
    (tmp_path / "workload").write_text("eyJ-workload\n")
    cross_app = "cross_app: {token_endpoint: 'https://idp.example.com/token', client_id: i, id_token_file: id-token}"
    text = yaml_text(BASE) + f"    auth: {{oauth: {{per: gateway, client_id: gw, client_secret: s, {cross_app}}}}}\n"
    server = parse_config(text, file=tmp_path / "federation.yaml", env={}).servers["remote"]
    assert isinstance(server, HttpServer) and server.auth is not None and server.auth.oauth.cross_app is not None
    assert server.auth.oauth.cross_app.id_token_file == str(tmp_path / "id-token")
    text = yaml_text(BASE) + "    auth: {oauth: {per: gateway, workload_token_file: workload}}\n"
    server = parse_config(text, file=tmp_path / "federation.yaml", env={}).servers["remote"]
    assert isinstance(server, HttpServer) and server.auth is not None
    assert (server.auth.oauth.workload_token_file, server.auth.oauth.client_id) == (str(tmp_path / "workload"), None)


def test_a_workload_token_from_the_environment_is_the_gateways_own_public_client() -> None:
    text = yaml_text(BASE) + "    auth: {oauth: {per: gateway, client_id: wl, workload_token: '${WL_TOKEN}'}}\n"
    server = parse_config(text, file=FILE, env={"WL_TOKEN": "eyJ-the-workload"}).servers["remote"]
    assert isinstance(server, HttpServer) and server.auth is not None
    assert (server.auth.oauth.workload_token, server.auth.oauth.client_id) == ("eyJ-the-workload", "wl")


@pytest.mark.parametrize(
    ("oauth", "words"),
    [
        ("workload_token: '${WL_TOKEN}'", "use per: gateway"),
        ("per: gateway, workload_token: '${WL_TOKEN}', workload_token_file: /run/t", "not both"),
        ("per: gateway, client_id: gw, client_secret: s, workload_token: '${WL_TOKEN}'", "remove client_secret"),
        (f"per: gateway, client_id: gw, workload_token: '${{WL_TOKEN}}', {CROSS_APP}", "remove cross_app"),
        ("per: gateway, workload_token_file: /nonexistent/token", "workload_token_file /nonexistent/token cannot"),
    ],
    ids=["per-caller", "both", "with-secret", "with-cross-app", "no-file"],
)
def test_a_workload_token_mistake_is_named_and_never_echoed(oauth: str, words: str) -> None:
    err = config_error(
        yaml_text(BASE) + f"    auth: {{oauth: {{{oauth}}}}}\n",
        env={"WL_TOKEN": "eyJ-secret-workload", "ID_TOKEN": "t"},
    )
    assert err.key_path == "servers.remote.auth.oauth", str(err)
    assert words in str(err), str(err)
    assert "eyJ-secret-workload" not in str(err)
