"""The HTTP guard in front of the gateway (``gateway/http.py``): bearer tokens (``Tokens``), Host/Origin checks and
auth as one pure ASGI middleware (``Guard``), driven in memory through httpx2's ASGI transport; ``is_loopback``; and
the ``/status`` document."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from types import SimpleNamespace
from typing import Any, cast

import anyio
import httpx2
import pytest
from starlette.types import Message, Receive, Scope, Send
from structlog.testing import capture_logs

from gateway.auth.tokens import Tokens
from gateway.backends.base import BackendState
from gateway.config import Federation, parse_config
from gateway.core.answers import Answers
from gateway.core.catalog import Catalog
from gateway.core.runtime import Gateway
from gateway.front.http import guard as guard_module
from gateway.front.http.guard import Guard, RefusalLog, is_loopback
from gateway.front.http.status import status_document
from gateway.front.scope import caller_of
from gateway.testing import FakeBackend

BASE_URL = "http://127.0.0.1:8080"

pytestmark = pytest.mark.anyio


# ----------------------------------------------------------------------------------------------- Tokens


@pytest.mark.parametrize(
    ("authorization", "caller"),
    [
        ("Bearer tok-alice-1", "alice"),
        ("bearer tok-bob-2", "bob"),
        ("BEARER tok-bob-2", "bob"),
        ("Bearer  tok-alice-1 ", "alice"),
        ("Bearer tok-alice-2", None),
        ("Bearer tok-alice", None),
        ("Bearer tok-alice-1x", None),
        ("Basic tok-alice-1", None),
        ("tok-alice-1", None),
        ("Bearertok-alice-1", None),
        ("", None),
        (None, None),
    ],
)
def test_identify_names_the_caller_only_for_a_valid_bearer_token(authorization: str | None, caller: str | None) -> None:
    tokens = Tokens("alice=tok-alice-1, bob=tok-bob-2")
    assert tokens.identify(authorization) == caller


def test_a_bare_token_is_named_by_a_hash_prefix_never_by_the_token() -> None:
    tokens = Tokens("plain-secret-token")
    name = tokens.identify("Bearer plain-secret-token")
    assert name == "token-" + hashlib.sha256(b"plain-secret-token").hexdigest()[:12]
    assert "plain-secret-token" not in name


def test_named_and_bare_tokens_mix_and_all_are_secrets() -> None:
    tokens = Tokens(" alice=tok-a ,, tok-bare ,")
    assert bool(tokens)
    assert tokens.identify("Bearer tok-a") == "alice"
    assert (tokens.identify("Bearer tok-bare") or "").startswith("token-")
    assert sorted(tokens.secrets) == ["tok-a", "tok-bare"]


@pytest.mark.parametrize("spec", [None, "", " , ,"])
def test_no_tokens_configured_is_falsy_and_identifies_nobody(spec: str | None) -> None:
    tokens = Tokens(spec)
    assert not tokens
    assert tokens.identify("Bearer ") is None
    assert tokens.identify("Bearer anything") is None


def test_an_empty_token_never_authenticates() -> None:
    tokens = Tokens("alice=,bob=tok-bob")
    assert tokens.identify("Bearer ") is None
    assert tokens.identify("Bearer   ") is None


def test_a_bare_base64_token_with_padding_is_accepted_whole() -> None:
    tokens = Tokens("dG9rZW4tYWJj=")
    assert tokens.identify("Bearer dG9rZW4tYWJj=") is not None


# ----------------------------------------------------------------------------------------------- Guard


class App:
    """A trivial ASGI app that answers with the path and the caller the guard put in the scope state."""

    def __init__(self) -> None:
        self.paths: list[str] = []
        self.scopes: list[str] = []

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.scopes.append(scope["type"])
        if scope["type"] != "http":
            return
        self.paths.append(scope["path"])
        body = json.dumps({"path": scope["path"], "caller": caller_of(scope).name}).encode()
        await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]})
        await send({"type": "http.response.body", "body": body})


async def get(
    guard: Guard, path: str = "/mcp", *, token: str | None = None, headers: dict[str, str] | None = None
) -> httpx2.Response:
    all_headers = dict(headers or {})
    if token is not None:
        all_headers["Authorization"] = f"Bearer {token}"
    with anyio.fail_after(5):
        async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=guard), base_url=BASE_URL) as client:
            return await client.get(path, headers=all_headers)


def guard(
    app: App,
    *,
    tokens: str | None = "alice=tok-alice",
    loopback: bool = True,
    allowed_hosts: Sequence[str] = (),
    allowed_origins: Sequence[str] = (),
) -> Guard:
    return Guard(
        app, tokens=Tokens(tokens), loopback=loopback, allowed_hosts=allowed_hosts, allowed_origins=allowed_origins
    )


@pytest.mark.parametrize("token", [None, "wrong", ""])
async def test_a_request_without_the_right_token_gets_401_with_a_bearer_challenge(token: str | None) -> None:
    app = App()
    response = await get(guard(app), token=token)
    assert response.status_code == 401
    assert response.headers["www-authenticate"].startswith("Bearer")
    assert "bearer token" in response.json()["error"]["message"]
    assert app.paths == []  # refused before any app work


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ({"host": "127.0.0.1:8080", "authorization": "Bearer wrong"}, 401),
        ({"host": "evil.example"}, 421),
        ({"host": "127.0.0.1:8080", "origin": "https://evil.example"}, 403),
    ],
)
async def test_a_refusal_reads_the_request_body_before_it_answers_and_closes(
    headers: dict[str, str], status: int
) -> None:
    """A client may send the body after the head. Closing the connection with body bytes still on their way makes
    the kernel answer with a reset, which destroys the refusal before the client reads it (seen over TCP: the 401
    lost as "connection reset by peer"); so the body is read first."""
    events: list[str] = []
    chunks = [b'{"jsonrpc": "2.0", ', b'"id": 1, "method": "initialize"}']

    async def receive() -> Message:
        events.append("receive")
        body = chunks.pop(0) if chunks else b""
        return {"type": "http.request", "body": body, "more_body": bool(chunks)}

    async def send(message: Message) -> None:
        events.append(message["type"])
        if message["type"] == "http.response.start":
            assert message["status"] == status
            assert (b"connection", b"close") in message["headers"]

    scope = {
        "type": "http",
        "method": "POST",
        "path": "/mcp",
        "headers": [(k.encode(), v.encode()) for k, v in headers.items()],
        "query_string": b"",
    }
    app = App()
    with anyio.fail_after(5):
        await guard(app)(scope, receive, send)
    assert events == ["receive", "receive", "http.response.start", "http.response.body"]
    assert app.paths == []


async def test_a_non_bearer_authorization_gets_401() -> None:
    app = App()
    response = await get(guard(app), headers={"Authorization": "Basic dG9rLWFsaWNl"})
    assert response.status_code == 401
    assert app.paths == []


async def test_the_right_token_passes_with_the_callers_name_in_the_scope_state() -> None:
    app = App()
    response = await get(guard(app), "/status", token="tok-alice")
    assert response.status_code == 200
    assert response.json() == {"path": "/status", "caller": "alice"}


async def test_healthz_is_public() -> None:
    app = App()
    response = await get(guard(app), "/healthz")
    assert response.status_code == 200
    assert response.json() == {"path": "/healthz", "caller": None}


async def test_without_configured_tokens_requests_pass_on_a_loopback_bind() -> None:
    app = App()
    response = await get(guard(app, tokens=None))
    assert response.status_code == 200
    assert app.paths == ["/mcp"]


@pytest.mark.parametrize(
    "host",
    [
        "evil.example.com",
        "127.0.0.1.evil.example.com",
        "localhost.evil.com:8080",
        "",
        "localhost:1.evil.example.com",
        "127.0.0.1:8080:evil",
        "[::1]evil.example.com",
        "localhost:99999",
    ],
)
async def test_a_foreign_host_header_gets_421_on_a_loopback_bind_even_with_a_token(host: str) -> None:
    app = App()
    response = await get(guard(app), token="tok-alice", headers={"Host": host})
    assert response.status_code == 421
    assert app.paths == []


@pytest.mark.parametrize("host", ["127.0.0.1:8080", "127.0.0.1", "localhost", "LocalHost:9999", "[::1]:8080", "[::1]"])
async def test_loopback_host_headers_are_accepted_on_a_loopback_bind(host: str) -> None:
    app = App()
    response = await get(guard(app), token="tok-alice", headers={"Host": host})
    assert response.status_code == 200


async def test_a_non_loopback_bind_leaves_the_host_to_the_proxy_but_still_requires_the_token() -> None:
    app = App()
    assert (await get(guard(app, loopback=False), headers={"Host": "gw.example.com"})).status_code == 401
    response = await get(guard(app, loopback=False), token="tok-alice", headers={"Host": "gw.example.com"})
    assert response.status_code == 200


async def test_allowed_hosts_extend_the_loopback_names() -> None:
    app = App()
    g = guard(app, allowed_hosts=["Gateway.Internal"])
    assert (await get(g, token="tok-alice", headers={"Host": "gateway.internal"})).status_code == 200
    assert (await get(g, token="tok-alice", headers={"Host": "localhost:8080"})).status_code == 200
    assert (await get(g, token="tok-alice", headers={"Host": "other.internal"})).status_code == 421


async def test_an_allowed_host_is_accepted_on_any_port_like_the_loopback_names() -> None:
    g = guard(App(), allowed_hosts=["gateway.internal"])
    assert (await get(g, token="tok-alice", headers={"Host": "gateway.internal:8080"})).status_code == 200


@pytest.mark.parametrize(
    "origin",
    [
        "http://evil.example.com",
        "https://127.0.0.1.evil.example.com",
        "null",
        "http://localhost:1.evil.example.com",
        "http://127.0.0.1:80.evil.example.com",
        "http://localhost@evil.example.com",
        "http://localhost:8080/path",
        "ftp://localhost",
        "localhost",
        "http://[::1]:1.evil.example.com",
    ],
)
async def test_a_foreign_origin_gets_403_on_a_loopback_bind(origin: str) -> None:
    app = App()
    response = await get(guard(app), token="tok-alice", headers={"Origin": origin})
    assert response.status_code == 403
    assert app.paths == []


@pytest.mark.parametrize("origin", ["http://localhost:3000", "http://127.0.0.1", "https://[::1]:8443"])
async def test_a_loopback_origin_is_accepted(origin: str) -> None:
    response = await get(guard(App()), token="tok-alice", headers={"Origin": origin})
    assert response.status_code == 200


async def test_allowed_origins_extend_the_loopback_ones_and_are_exhaustive_off_loopback() -> None:
    origins = ["https://app.example.com"]
    on_loopback = guard(App(), allowed_origins=origins)
    assert (await get(on_loopback, token="tok-alice", headers={"Origin": "https://app.example.com"})).status_code == 200
    assert (await get(on_loopback, token="tok-alice", headers={"Origin": "https://x.example.com"})).status_code == 403

    remote = guard(App(), loopback=False, allowed_origins=origins)
    assert (await get(remote, token="tok-alice", headers={"Origin": "https://app.example.com"})).status_code == 200
    assert (await get(remote, token="tok-alice", headers={"Origin": "http://localhost"})).status_code == 403


async def test_an_allowed_origin_matches_by_scheme_host_and_port_not_by_prefix() -> None:
    g = guard(App(), loopback=False, allowed_origins=["https://app.example.com"])
    assert (await get(g, token="tok-alice", headers={"Origin": "https://app.example.com:443"})).status_code == 200
    for origin in [
        "https://app.example.com:1.evil.example.com",
        "http://app.example.com",
        "https://app.example.com:8443",
    ]:
        assert (await get(g, token="tok-alice", headers={"Origin": origin})).status_code == 403, origin


async def test_a_refusal_closes_the_connection_and_only_a_token_holder_keeps_one() -> None:
    refused = await get(guard(App()), token="wrong")
    assert (refused.status_code, refused.headers["connection"]) == (401, "close")
    public = await get(guard(App()), "/healthz")
    assert (public.status_code, public.headers["connection"]) == (200, "close")
    held = await get(guard(App()), "/healthz", token="tok-alice")
    assert held.status_code == 200 and "connection" not in held.headers


async def test_a_token_holder_is_the_principal_the_sdk_binds_sessions_to() -> None:
    seen: list[Any] = []

    async def app(scope: Scope, receive: Receive, send: Send) -> None:
        seen.append(scope.get("user"))
        await App()(scope, receive, send)

    g = Guard(app, tokens=Tokens("alice=tok-alice"), loopback=True)
    await get(g, token="tok-alice")
    (user,) = seen
    assert user.access_token.client_id == "alice" and user.access_token.token == ""


async def test_a_non_http_scope_passes_through_untouched() -> None:
    app = App()
    g = guard(app)

    async def receive() -> Message:  # pragma: no cover - the trivial app never reads
        return {"type": "lifespan.startup"}

    async def send(message: Message) -> None:  # pragma: no cover - the trivial app never sends
        raise AssertionError(message)

    await g({"type": "lifespan", "asgi": {"version": "3.0"}}, receive, send)
    assert app.scopes == ["lifespan"]


async def test_an_empty_bearer_never_passes_the_guard() -> None:
    app = App()
    response = await get(guard(app, tokens="alice="), headers={"Authorization": "Bearer "})
    assert response.status_code == 401


# ----------------------------------------------------------------------------------------------- is_loopback


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.10.20.30", True),
        ("::1", True),
        ("[::1]", True),
        ("localhost", True),
        ("0.0.0.0", False),
        ("::", False),
        ("10.0.0.1", False),
        ("192.168.1.20", False),
        ("gateway.example.com", False),
    ],
)
def test_is_loopback_accepts_only_loopback_addresses_and_localhost(host: str, loopback: bool) -> None:
    assert is_loopback(host) is loopback


def test_an_empty_bind_host_is_not_loopback() -> None:
    assert is_loopback("") is False


# ----------------------------------------------------------------------------------------------- status document


class StubGateway:
    """What ``status_document`` reads from a running gateway: config, catalog, statuses() and healthy()."""

    def __init__(self, config: Federation, *backends: FakeBackend) -> None:
        self.config = config
        self.backends = {b.name: b for b in backends}
        self.catalog = Catalog.build(config, dict(self.backends))
        self.loaded_at = 1_700_000_000.0
        self.reload_error: str | None = None
        self.ledger: Any = None  # status_document reads the ledger's state; the stub keeps none
        self.answers = Answers(lambda: config)  # and what is kept of answers cut to a budget

    def statuses(self) -> list[tuple[str, str, Any]]:
        return [(b.name, b.kind, b.status) for b in self.backends.values()]

    def healthy(self) -> bool:
        return all(b.status.state in (BackendState.READY, BackendState.DISABLED) for b in self.backends.values())


def stub_gateway(config: Federation, *backends: FakeBackend) -> Gateway:
    return cast(Gateway, StubGateway(config, *backends))


def test_the_status_document_shows_every_backend_with_state_reason_and_tool_counts() -> None:
    config = parse_config(
        "gateway: {name: gw}\nservers:\n  a: {transport: stdio, command: x}\n  b: {transport: stdio, command: x}\n"
        "routes:\n  ghost: [b/t]\n",
        file="federation.yaml",
        env={},
    )
    a = FakeBackend("a", ["one", "two"])
    b = FakeBackend("b", ["t"], state=BackendState.FAILED, reason="handshake answered HTTP 502")
    doc = status_document(stub_gateway(config, a, b), connections=3, sessions={"open": 2, "evicted": 5})

    assert (doc["gateway"], doc["status"], doc["connections"]) == ("gw", "degraded", 3)
    assert doc["sessions"] == {"open": 2, "evicted": 5}
    assert doc["catalog"]["tools"] == 2
    assert any("'ghost'" in problem for problem in doc["catalog"]["problems"])
    rows = {row["name"]: row for row in doc["backends"]}
    assert (rows["a"]["state"], rows["a"]["tools"], rows["a"]["downstream_tools"]) == ("ready", 2, 2)
    assert (rows["b"]["state"], rows["b"]["reason"], rows["b"]["tools"]) == ("failed", "handshake answered HTTP 502", 0)
    json.dumps(doc)  # served as JSON as is

    a.set_state(BackendState.READY)
    b.set_state(BackendState.DISABLED, "not today", declared=True)
    doc = status_document(stub_gateway(config, a, b))
    assert doc["status"] == "ok" and "connections" not in doc and "sessions" not in doc
    assert {row["name"]: row["declared"] for row in doc["backends"]} == {"a": False, "b": True}


def test_the_refusal_log_says_in_its_next_line_how_many_refusals_it_left_out(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = [100.0]
    monkeypatch.setattr(guard_module, "time", SimpleNamespace(monotonic=lambda: clock[0]))
    refusals = RefusalLog(every_s=60)
    scope: dict[str, Any] = {"client": ("10.0.0.7", 5123), "path": "/mcp"}
    with capture_logs() as logs:
        for _ in range(5):
            refusals.note(scope, "invalid_token", "a bearer token the gateway does not hold")
        refusals.note({**scope, "client": ("10.0.0.8", 1)}, "invalid_token", "a bearer token the gateway does not hold")
        clock[0] += 61
        refusals.note(scope, "invalid_token", "a bearer token the gateway does not hold")
    assert [(e["client"], e["suppressed"]) for e in logs] == [("10.0.0.7", 0), ("10.0.0.8", 0), ("10.0.0.7", 4)]
