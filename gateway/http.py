"""The gateway's HTTP surface: ``/mcp`` (streamable HTTP), ``/healthz``, ``/status`` and ``/metrics``, behind one guard.

The only module that imports Starlette. ``build_app(gateway, ...)`` wraps everything in one pure ASGI ``Guard`` that
checks Host/Origin (DNS-rebinding protection on loopback binds) and the bearer token — in constant time, before any
MCP work — then answers ``/healthz`` (no auth, no reasons), ``/status`` (auth, full reasons) and ``/metrics``
(Prometheus text format; auth unless ``gateway.auth.metrics_requires_token`` says otherwise — by default it is
required unless the gateway is bound to loopback). ``/metrics`` holds names, states and counts only: no reasons,
arguments or secrets.
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import json
import re
import time
from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from mcp.server.streamable_http_manager import StreamableHTTPASGIApp, StreamableHTTPSessionManager
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Mount, Route
from starlette.types import ASGIApp, Receive, Scope, Send

from gateway._logging import redactor
from gateway.backends.cli import CliBackend
from gateway.edge import Edge
from gateway.events import RETRY_MS, RecentEvents
from gateway.metrics import CONTENT_TYPE, AdapterSnapshot, BackendSnapshot, StateSnapshot
from gateway.runtime import VERSION, Gateway
from gateway.server import build_server
from gateway.ui import UI_PATHS, build_ui

__all__ = ["Guard", "Tokens", "build_app", "is_loopback", "metrics_need_token", "state_snapshot", "status_document"]

_NAME = re.compile(r"^[A-Za-z0-9_.@-]{1,64}$")


def is_loopback(host: str) -> bool:
    """Whether binding ``host`` listens on loopback only ("" and 0.0.0.0 bind every interface: not loopback)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


class Tokens:
    """Accepted bearer tokens. ``GATEWAY_TOKENS="alice=tok1,bob=tok2"`` names callers; a bare token is named by
    its hash prefix. Tokens are compared in constant time and never logged or stored."""

    def __init__(self, spec: str | None) -> None:
        self._tokens: list[tuple[bytes, str]] = []
        for item in (spec or "").split(","):
            item = item.strip()
            if not item:
                continue
            name, sep, token = (part.strip() for part in item.partition("="))
            if not (sep and _NAME.fullmatch(name) and token.strip("=")):
                name, token = "", item  # a bare token (which may itself contain '=', e.g. base64 padding)
            digest = hashlib.sha256(token.encode()).hexdigest()[:12]
            self._tokens.append((token.encode(), name or f"token-{digest}"))

    def __bool__(self) -> bool:
        return bool(self._tokens)

    @property
    def secrets(self) -> list[str]:
        return [token.decode() for token, _ in self._tokens]

    def identify(self, authorization: str | None) -> str | None:
        """The caller's name for a valid ``Authorization: Bearer`` header, else None."""
        if not authorization or not authorization[:7].lower() == "bearer ":
            return None
        offered = authorization[7:].strip().encode()
        if not offered:
            return None
        found: str | None = None
        for token, name in self._tokens:  # compare against every token: timing reveals nothing
            if hmac.compare_digest(offered, token):
                found = name
        return found


class Guard:
    """Pure ASGI middleware: Host/Origin validation, then bearer auth for protected paths, before anything else."""

    def __init__(
        self,
        app: ASGIApp,
        *,
        tokens: Tokens,
        loopback: bool,
        allowed_hosts: Sequence[str] = (),
        allowed_origins: Sequence[str] = (),
        public_paths: Sequence[str] = ("/healthz",),
    ) -> None:
        self.app = app
        self.tokens = tokens
        self.loopback = loopback
        self.allowed_hosts = {h.lower() for h in allowed_hosts}
        self.allowed_origins = {o.lower() for o in allowed_origins}
        self.public_paths = set(public_paths)

    def _host_ok(self, host: str) -> bool:
        host = host.lower()
        name = host.rsplit(":", 1)[0] if not host.endswith("]") else host  # the port does not matter
        if host in self.allowed_hosts or name in self.allowed_hosts:
            return True
        if not self.loopback:
            return True  # behind a real name: the operator's proxy owns Host; auth is required anyway
        return name in ("127.0.0.1", "localhost", "[::1]")

    def _origin_ok(self, origin: str) -> bool:
        origin = origin.lower()
        if origin in self.allowed_origins:
            return True
        if not self.loopback:
            return not self.allowed_origins  # a list, when given, is exhaustive
        rest = origin.split("://", 1)[-1]
        name = rest.rsplit(":", 1)[0] if not rest.endswith("]") else rest
        return name in ("127.0.0.1", "localhost", "[::1]")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in scope["headers"]}
        if not self._host_ok(headers.get("host", "")):
            await _plain(send, 421, "Misdirected request: Host header not allowed.")
            return
        origin = headers.get("origin")
        if origin is not None and not self._origin_ok(origin):
            await _plain(send, 403, "Forbidden: Origin not allowed.")
            return
        if scope["path"] not in self.public_paths and self.tokens:
            caller = self.tokens.identify(headers.get("authorization"))
            if caller is None:
                await _plain(
                    send,
                    401,
                    "Unauthorized: a valid bearer token is required.",
                    [(b"www-authenticate", b'Bearer realm="mcp-gateway"')],
                )
                return
            scope.setdefault("state", {})["caller"] = caller
        await self.app(scope, receive, send)


async def _plain(send: Send, status: int, text: str, extra: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"error": text}).encode()
    headers = [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode())]
    await send({"type": "http.response.start", "status": status, "headers": headers + (extra or [])})
    await send({"type": "http.response.body", "body": body})


def status_document(gateway: Gateway, *, connections: int | None = None) -> dict[str, Any]:
    """``/status`` and ``gateway check --json``: every backend's state and reason, the catalog's size and problems.

    Reasons quote what a backend printed (a stderr tail); registered secrets are scrubbed from them.
    """
    catalog = gateway.catalog
    per_backend = catalog.by_backend()
    backends = []
    for name, kind, status in gateway.statuses():
        backends.append(
            {
                "name": name,
                "kind": kind,
                "state": str(status.state),
                "reason": redactor.scrub(status.reason),
                "declared": status.declared,
                "since": status.since,
                "last_error": redactor.scrub(status.last_error),
                "tools": per_backend.get(name, 0),
                "downstream_tools": status.tool_count,
            }
        )
    doc: dict[str, Any] = {
        "gateway": gateway.config.gateway.name,
        "version": VERSION,
        "status": "ok" if gateway.healthy() else "degraded",
        "catalog": {"tools": len(catalog), "problems": list(catalog.problems)},
        "backends": backends,
        "config": {"file": gateway.config.source, "loaded_at": gateway.loaded_at, "reload_error": gateway.reload_error},
        "time": time.time(),
    }
    if connections is not None:
        doc["connections"] = connections
    return doc


def state_snapshot(gateway: Gateway) -> StateSnapshot:
    """What ``/metrics`` reports of the gateway's current state: backend states, adapter processes, the ledger."""
    catalog = gateway.catalog
    backends = [
        BackendSnapshot(name, kind, str(status.state), status.tool_count) for name, kind, status in gateway.statuses()
    ]
    adapters = []
    for backend in gateway.backends.values():
        if isinstance(backend, CliBackend):
            stats = backend.statistics()
            adapters.append(
                AdapterSnapshot(backend.name, stats.live_processes, stats.running_calls, stats.waiting_calls)
            )
    ledger = gateway.ledger.statistics() if gateway.ledger is not None and not gateway.ledger.disabled else None
    return StateSnapshot(backends=backends, adapters=adapters, ledger=ledger, catalog_tools=len(catalog))


def metrics_need_token(gateway: Gateway, host: str) -> bool:
    """Whether ``/metrics`` asks for the bearer token: ``gateway.auth.metrics_requires_token``, or by default
    yes unless the gateway is bound to loopback (a scraper on the same machine needs no token)."""
    configured = gateway.config.gateway.auth.metrics_requires_token
    return (not is_loopback(host)) if configured is None else configured


def build_app(gateway: Gateway, *, host: str, tokens: Tokens, json_response: bool = False) -> ASGIApp:
    """The gateway's HTTP app. Run it inside ``gateway.running()`` (the caller owns the gateway's lifetime)."""
    server, connections = build_server(gateway)
    manager = StreamableHTTPSessionManager(
        app=server,
        json_response=json_response,
        # resumable streams (SEP-1699), bounded in events, age and bytes: see events.py
        event_store=RecentEvents(
            max_bytes=gateway.config.gateway.edge.replay_bytes,
            max_stream_bytes=gateway.config.gateway.edge.replay_stream_bytes,
        ),
        retry_interval=RETRY_MS,
        # The Guard does Host/Origin checks for every path, so the SDK's own check is off (one policy, one place).
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )
    mcp_app = StreamableHTTPASGIApp(manager)

    async def healthz(request: Request) -> Response:
        states = {name: str(status.state) for name, _, status in gateway.statuses()}
        return JSONResponse({"status": "ok" if gateway.healthy() else "degraded", "backends": states})

    async def status(request: Request) -> Response:
        return JSONResponse(status_document(gateway, connections=len(connections)))

    gateway.metrics.watch(lambda: state_snapshot(gateway))

    async def metrics(request: Request) -> Response:
        return Response(gateway.metrics.exposition(), headers={"content-type": CONTENT_TYPE})

    @asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        async with manager.run():
            yield

    app = Starlette(
        routes=[
            Route("/healthz", healthz, methods=["GET"]),
            Route("/status", status, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
            # Every POST body is checked before the SDK parses it (edge.py): one rule for both protocol eras.
            Route("/mcp", endpoint=Edge(mcp_app, lambda: gateway.config.gateway.edge)),
            Mount("/ui", app=build_ui(gateway, tokens, is_loopback(host))),  # the status page; signs people in itself
        ],
        lifespan=lifespan,
    )
    gateway_settings = gateway.config.gateway
    guarded = Guard(
        app,
        tokens=tokens,
        loopback=is_loopback(host),
        allowed_hosts=gateway_settings.allowed_hosts,
        allowed_origins=gateway_settings.allowed_origins,
        public_paths=(("/healthz",) if metrics_need_token(gateway, host) else ("/healthz", "/metrics")) + UI_PATHS,
    )
    return guarded
