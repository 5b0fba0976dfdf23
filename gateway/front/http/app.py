"""The gateway's HTTP app: ``build_app`` assembles the parts behind one ``Guard`` (guard.py).

``/mcp`` is MCP over streamable HTTP: every POST body checked (body.py), then the caller limits (limits.py), then the
gateway's session manager (sessions.py): a session's requests go to its transport (transport.py), its streams
resumable (resume.py); a 2026-07-28 request is answered by stateless.py. The routes that tell the gateway's state are
status.py's, the status page is mounted at ``/ui`` (ui.py). What is read at start (the tokens, OAuth, the shared
store, allowed hosts and origins, session limits) a reload does not change; the body check's settings, the caller
limits and the policies are read at each request.
"""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from functools import partial
from typing import Any

import anyio
from mcp.server.lowlevel.server import Server
from mcp.server.streamable_http_manager import StreamableHTTPASGIApp
from mcp.server.transport_security import TransportSecuritySettings
from starlette.applications import Starlette
from starlette.routing import Match, Mount, Route
from starlette.types import ASGIApp, Scope

from gateway.auth.oauth import ResourceServer
from gateway.auth.tokens import Tokens
from gateway.calls import Caller
from gateway.core.policies import View
from gateway.core.runtime import Gateway
from gateway.front.channels import Resumes
from gateway.front.face import Face
from gateway.front.http.body import Edge
from gateway.front.http.connect import CONNECT_PREFIX, ConnectPages
from gateway.front.http.guard import Guard, is_loopback
from gateway.front.http.limits import CallerLimits
from gateway.front.http.request_ids import InFlight
from gateway.front.http.resume import RETRY_MS, RecentEvents
from gateway.front.http.seal import session_seal
from gateway.front.http.sessions import CallerSessions, filter_session_ids
from gateway.front.http.shared import SharedRates, SharedRedis, SharedSessionEnds
from gateway.front.http.status import StatusRoutes
from gateway.front.http.ui import UI_PATHS, StatusPage
from gateway.front.scope import BindCaller

__all__ = ["build_app"]


def build_app(gateway: Gateway, *, host: str, tokens: Tokens, json_response: bool = False) -> ASGIApp:
    """The gateway's HTTP app. Run it inside ``gateway.running()`` (the caller owns the gateway's lifetime)."""
    settings = gateway.config.gateway
    resumes = Resumes()  # SEP-1699: a call's client resuming its stream (resume.py) lets its downstream resume
    face = Face(gateway, resumes=resumes)
    filter_session_ids()
    redis = SharedRedis(settings.shared) if settings.shared.redis_url is not None else None
    oauth = ResourceServer(settings.auth.oauth, name=settings.name) if settings.auth.oauth is not None else None
    in_flight = InFlight()  # the edge's request ids in flight, told of answers and session ends by the sessions
    sessions = _sessions(gateway, face.server(), in_flight, resumes, redis, json_response)
    status = StatusRoutes(
        gateway=gateway, host=host, tokens=tokens, clients=face.clients, sessions=sessions, redis=redis, oauth=oauth
    )
    gateway.metrics.watch(status.snapshot)
    limited = CallerLimits(
        BindCaller(StreamableHTTPASGIApp(sessions)),
        gateway,
        lambda: gateway.config.limit_policies,
        shared=SharedRates(redis) if redis is not None else None,
    )
    app = Starlette(
        routes=[
            *status.routes(),
            Route("/mcp", endpoint=Edge(limited, lambda: gateway.config.gateway.edge, in_flight)),
            # the status page signs people in itself, with the static tokens only (so with OAuth alone it is shut)
            Mount("/ui", app=_status_page(gateway, face, tokens, is_loopback(host) and oauth is None, status)),
        ],
        lifespan=partial(_lifespan, sessions, redis),
    )
    return Guard(
        app,
        serves=partial(_serves, app),
        tokens=tokens,
        loopback=is_loopback(host),
        allowed_hosts=settings.allowed_hosts,
        allowed_origins=settings.allowed_origins,
        public_paths=status.public_paths() + UI_PATHS + ("/ui/connections",),
        public_prefixes=(CONNECT_PREFIX + "/",),
        oauth=oauth,
    )


def _serves(app: Starlette, scope: Scope) -> bool:
    """Whether one of ``app``'s routes takes a request for ``scope``'s path (by any method), or for that path with
    its trailing slash added or removed (Starlette redirects to it: ``/ui`` to ``/ui/``)."""
    path = scope["path"]
    other = {**scope, "path": path[:-1] if path.endswith("/") else path + "/"}
    return any(route.matches(s)[0] is not Match.NONE for s in (scope, other) for route in app.routes)


def _status_page(gateway: Gateway, face: Face, tokens: Tokens, open_page: bool, status: StatusRoutes) -> ASGIApp:
    """The status page, showing each signed-in caller its own view of the catalog (operators everything)."""

    def view(name: str) -> View | None:
        return face.views.view(gateway.catalog, Caller(name))

    page = StatusPage(gateway, tokens, open_page, status.access, views=view)
    if gateway.sign_ins is None:
        return page.app()
    connect = ConnectPages(
        gateway.sign_ins,
        caller=page.caller,
        operator=lambda caller: page.shown(caller).operator,
        allowed_origins=page.allowed_origins,
    )
    return page.app(connect.routes())


def _sessions(
    gateway: Gateway,
    server: Server[Any],
    in_flight: InFlight,
    resumes: Resumes,
    redis: SharedRedis | None,
    json_response: bool,
) -> CallerSessions:
    settings = gateway.config.gateway
    return CallerSessions(
        server,
        limits=settings.limits,
        in_flight=in_flight,
        seal=session_seal(settings, str(gateway.config.source or "")),
        ends=SharedSessionEnds(redis) if redis is not None else None,  # a DELETE ends the session on every replica
        json_response=json_response,
        event_store=RecentEvents(
            max_bytes=settings.edge.replay_bytes, max_stream_bytes=settings.edge.replay_stream_bytes, resumes=resumes
        ),
        retry_interval=RETRY_MS,
        # The Guard does Host/Origin checks for every path, so the SDK's own check is off (one policy, one place).
        security_settings=TransportSecuritySettings(enable_dns_rebinding_protection=False),
    )


@asynccontextmanager
async def _lifespan(sessions: CallerSessions, redis: SharedRedis | None, app: Starlette) -> AsyncIterator[None]:
    """The app's lifetime: the sessions' task group, and the shared store's watcher and client."""
    try:
        async with anyio.create_task_group() as tasks:
            if redis is not None:
                tasks.start_soon(redis.watch)  # pings Redis, so /metrics knows it answers while no one asks
            async with sessions.run():
                yield
            tasks.cancel_scope.cancel()
    finally:
        if redis is not None:
            await redis.aclose()
