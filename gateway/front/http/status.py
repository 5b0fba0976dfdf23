"""What the gateway tells of itself over HTTP (``StatusRoutes``): ``/`` says where things are; ``/healthz`` each
backend's state (public, no reasons); ``/status`` every state and reason with the sessions, connections, access, shared
store, OAuth and ledger figures (behind the bearer check; ``gateway check --json`` prints the same document);
``/metrics`` the Prometheus text format, names, states and counts only, never a reason, an argument or a secret
(behind the bearer check as ``metrics_need_token`` says); with ``gateway.auth.oauth``, the Protected Resource
Metadata at its well-known paths (public). Reasons quote what a backend printed: registered secrets are scrubbed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import BaseRoute, Route

from gateway.auth.oauth import ResourceServer, VerifierStatistics
from gateway.auth.tokens import Tokens
from gateway.core.runtime import Gateway
from gateway.front.clients import Clients
from gateway.front.http.guard import is_loopback
from gateway.front.http.sessions import CallerSessions
from gateway.front.http.shared import SharedRedis
from gateway.observe.logs import redactor
from gateway.observe.metrics import (
    CONTENT_TYPE,
    AdapterSnapshot,
    BackendSnapshot,
    OAuthSnapshot,
    SharedStoreSnapshot,
    StateSnapshot,
    TokenCacheSnapshot,
)
from gateway.version import VERSION

__all__ = ["StatusRoutes", "metrics_need_token", "state_snapshot", "status_document"]


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class StatusRoutes:
    """The routes above, one method each, over a running gateway and the parts of the HTTP app they report on."""

    gateway: Gateway
    host: str
    tokens: Tokens
    clients: Clients
    sessions: CallerSessions
    redis: SharedRedis | None = None
    oauth: ResourceServer | None = None

    def routes(self) -> list[BaseRoute]:
        metadata = self.oauth.metadata_paths if self.oauth is not None else ()
        return [
            Route("/", self.index, methods=["GET"]),
            Route("/healthz", self.healthz, methods=["GET"]),
            Route("/status", self.status, methods=["GET"]),
            Route("/metrics", self.metrics, methods=["GET"]),
            *(Route(path, self.resource_metadata, methods=["GET"]) for path in metadata),
        ]

    def public_paths(self) -> tuple[str, ...]:
        """The paths of these routes served without a token."""
        metrics = ("/metrics",) if not metrics_need_token(self.gateway, self.host) else ()
        return ("/", "/healthz", *metrics, *(self.oauth.metadata_paths if self.oauth is not None else ()))

    def access(self) -> dict[str, Any]:
        """The policies, and per caller its policy and how many tools it sees (``/status`` and the status page)."""
        return self.clients.views.statistics(self.gateway.catalog, self.tokens.names)

    def snapshot(self) -> StateSnapshot:
        """What ``/metrics`` reports of the gateway's current state (``state_snapshot``)."""
        return state_snapshot(self.gateway, self.redis, self.oauth)

    async def index(self, request: Request) -> Response:
        # GET / is where a person lands first: say where things are instead of a bare 404 (no state, no reasons).
        return JSONResponse(
            {
                "gateway": self.gateway.config.gateway.name,
                "mcp": "/mcp (MCP over streamable HTTP: point your client here)",
                "ui": "/ui (the status page, in a browser)",
                "status": "/status (every backend's state and reason, JSON; needs the bearer token when one is set)",
                "healthz": "/healthz",
                "metrics": "/metrics",
            }
        )

    async def healthz(self, request: Request) -> Response:
        gateway = self.gateway
        states = {name: str(status.state) for name, _, status in gateway.statuses()}
        return JSONResponse({"status": "ok" if gateway.healthy() else "degraded", "backends": states})

    async def status(self, request: Request) -> Response:
        return JSONResponse(
            status_document(
                self.gateway,
                connections=len(self.clients),
                sessions=self.sessions.statistics(),
                access=self.access(),
                shared=self.redis.statistics() if self.redis is not None else None,
                oauth=self.oauth.statistics() if self.oauth is not None else None,
            )
        )

    async def metrics(self, request: Request) -> Response:
        return Response(self.gateway.metrics.exposition(), headers={"content-type": CONTENT_TYPE})

    async def resource_metadata(self, request: Request) -> Response:
        assert self.oauth is not None
        return JSONResponse(self.oauth.metadata(), headers={"cache-control": "max-age=300"})


def status_document(
    gateway: Gateway,
    *,
    connections: int | None = None,
    sessions: dict[str, int] | None = None,
    access: dict[str, Any] | None = None,
    shared: dict[str, Any] | None = None,
    oauth: VerifierStatistics | None = None,
) -> dict[str, Any]:
    """``/status`` and ``gateway check --json``: every backend's state and reason, the catalog's size and problems.

    Reasons quote what a backend printed (a stderr tail); registered secrets are scrubbed from them (by
    ``BackendStatus`` itself, as on every other way out).
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
                "reason": status.reason,  # scrubbed when the status was made (backends/base.py)
                "declared": status.declared,
                "since": status.since,
                "last_error": status.last_error,
                "tools": per_backend.get(name, 0),
                "downstream_tools": status.tool_count,
                "variants_not_ready": [
                    {"variant": label, "reason": reason, "detected": True} for label, reason in status.unready
                ],
            }
        )
    doc: dict[str, Any] = {
        "gateway": gateway.config.gateway.name,
        "version": VERSION,
        "status": "ok" if gateway.healthy() else "degraded",
        "catalog": {
            "tools": len(catalog),
            "problems": list(catalog.problems),
            "tokens": {"large_context": catalog.tokens[0], "others": catalog.tokens[1]},  # what tools/list costs
        },
        "backends": backends,
        "config": {"file": gateway.config.source, "loaded_at": gateway.loaded_at, "reload_error": gateway.reload_error},
        "time": time.time(),
    }
    if gateway.answers.on:
        doc["kept_results"] = gateway.answers.kept.statistics()  # the rest of answers cut to a budget (counts)
    if connections is not None:
        doc["connections"] = connections
    if sessions is not None:
        doc["sessions"] = sessions
    if access is not None:
        doc["access"] = access  # the policies, and per caller its policy and how many tools it sees
    if shared is not None:
        doc["shared_limits"] = shared  # the Redis of gateway.shared.redis_url: up or down, failures since start
    if oauth is not None:
        cache = oauth.token_cache
        doc["auth"] = {  # counts only: never a token, a digest or a claim
            "oauth": {
                "verifications": dict(oauth.verifications),
                "key_fetches": dict(oauth.key_fetches),
                "token_cache": dataclasses.asdict(cache) if cache is not None else None,
            }
        }
    if gateway.ledger is not None and not gateway.ledger.disabled:
        ledger = gateway.ledger.statistics()
        doc["ledger"] = {
            "engine": ledger.engine,
            "state": "spooling" if ledger.spooling else "ok",
            "spooled_rows": ledger.spooled_rows,
            "pending_rows": ledger.pending,
            "rows_written": ledger.rows_written,
            "problem": redactor.scrub(ledger.problem),
        }
    return doc


def state_snapshot(
    gateway: Gateway, shared: SharedRedis | None = None, oauth: ResourceServer | None = None
) -> StateSnapshot:
    """What ``/metrics`` reports of the gateway's current state: backend states, adapter processes, the ledger, the
    shared limits' Redis, the JWT access tokens verified."""
    catalog = gateway.catalog
    backends = [
        BackendSnapshot(name, kind, str(status.state), status.tool_count) for name, kind, status in gateway.statuses()
    ]
    adapters = []
    for backend in gateway.backends.values():
        stats = backend.process_statistics()
        if stats is not None:
            adapters.append(
                AdapterSnapshot(backend.name, stats.live_processes, stats.running_calls, stats.waiting_calls)
            )
    ledger = gateway.ledger.statistics() if gateway.ledger is not None and not gateway.ledger.disabled else None
    store = SharedStoreSnapshot(not shared.down, dict(shared.failures_by_reason)) if shared is not None else None
    tokens = None
    if oauth is not None:
        verified = oauth.statistics()
        cache = verified.token_cache
        held = TokenCacheSnapshot(cache.entries, cache.limit, cache.evicted, cache.forgotten) if cache else None
        tokens = OAuthSnapshot(verified.verifications, held)
    return StateSnapshot(
        backends=backends,
        adapters=adapters,
        ledger=ledger,
        catalog_tools=len(catalog),
        pins_pending=len(catalog.pins_pending),
        shared_store=store,
        oauth=tokens,
    )


def metrics_need_token(gateway: Gateway, host: str) -> bool:
    """Whether ``/metrics`` asks for the bearer token: ``gateway.auth.metrics_requires_token``, or by default
    yes unless the gateway is bound to loopback (a scraper on the same machine needs no token)."""
    configured = gateway.config.gateway.auth.metrics_requires_token
    return (not is_loopback(host)) if configured is None else configured
