"""The pages where a caller signs in to an OAuth-protected server and sees their connections (under ``/ui``).

``GET /ui/connect/NAME``: the signed-in caller (the status page's cookie, or a bearer token) starts a sign-in to
server NAME (core/connect.py); the browser is sent on to the server's authorization server, with a short-lived
cookie (``SameSite=Lax``, so it comes back with the authorization server's redirect) binding the flow's ``state``
to this browser. ``GET /ui/connect/callback``: the authorization server's answer; refused unless the browser holds
the cookie for that ``state`` (a code or state pushed into another person's browser completes nothing), and the
``state`` is one-time. ``GET /ui/connections``: the caller's connections (an operator's: everyone's), never a
token; ``POST /ui/connections``: revoke one (from the page's own origin only).
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Callable
from html import escape

import structlog
from starlette.requests import Request
from starlette.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.routing import Route

from gateway.auth.connections import SignInFailed
from gateway.core.connect import SignIns
from gateway.front.http.forms import read_form, same_origin

__all__ = ["CONNECT_PREFIX", "ConnectPages"]

log = structlog.get_logger("gateway.signin")

CONNECT_PREFIX = "/ui/connect"
FLOW_COOKIE = "gateway_connect"
FLOW_COOKIE_TTL_S = 600
_HEADERS = {
    "Cache-Control": "no-store",
    "X-Frame-Options": "DENY",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",  # the callback's URL carries a code: never pass it on
    "Content-Security-Policy": "default-src 'none'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'",
}


def _binding(state: str) -> str:
    return hashlib.sha256(b"mcp-gateway/connect:" + state.encode()).hexdigest()


def _page(title: str, body: str, status: int = 200) -> Response:
    html = f"<!doctype html><meta charset=utf-8><title>{escape(title)}</title><h1>{escape(title)}</h1>{body}"
    return HTMLResponse(html, status_code=status, headers=_HEADERS)


class ConnectPages:
    """The routes (see the module docstring); ``routes()`` go into the status page's app."""

    def __init__(
        self,
        sign_ins: SignIns,
        *,
        caller: Callable[[Request], str | None],
        operator: Callable[[str], bool],
        allowed_origins: set[str],
    ) -> None:
        self._sign_ins = sign_ins
        self._caller = caller
        self._operator = operator
        self._allowed_origins = allowed_origins

    def routes(self) -> list[Route]:
        return [
            Route("/connect/callback", self.callback, methods=["GET"]),
            Route("/connect/client.json", self.client_document, methods=["GET"]),
            Route("/connect/{backend}", self.begin, methods=["GET"]),
            Route("/connections", self.listing, methods=["GET"]),
            Route("/connections", self.revoke, methods=["POST"]),
        ]

    def _who(self, request: Request) -> str | None:
        return self._caller(request)

    async def begin(self, request: Request) -> Response:
        caller = self._who(request)
        backend = request.path_params["backend"]
        if caller is None:
            return _page(
                "Sign in first", "<p>Sign in to the gateway's page (/ui/login), then open this link again.</p>", 401
            )
        try:
            url = await self._sign_ins.begin(backend, caller)
        except SignInFailed as exc:
            return _page(f"Cannot sign in to {backend}", f"<p>{escape(str(exc))}</p>", 502)
        if url is None:
            return _page(f"Connected to {backend}", f"<p>{escape(caller)} is already connected; call again.</p>")
        state = url.split("state=", 1)[1].split("&", 1)[0] if "state=" in url else ""
        response = RedirectResponse(url, status_code=303, headers=_HEADERS)
        response.set_cookie(
            FLOW_COOKIE,
            _binding(state),
            max_age=FLOW_COOKIE_TTL_S,
            path=CONNECT_PREFIX,
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="lax",
        )
        log.info("signin.started", backend=backend, caller=caller)
        return response

    async def client_document(self, request: Request) -> Response:
        """The gateway's Client ID Metadata Document: public (an authorization server fetches it, unsigned in)."""
        document = self._sign_ins.client_document
        if document is None:
            return _page("Not found", "<p>This gateway signs in to no OAuth-protected server.</p>", 404)
        return JSONResponse(dict(document), headers={"cache-control": "public, max-age=3600"})

    async def callback(self, request: Request) -> Response:
        params = request.query_params
        state = params.get("state", "")
        bound = request.cookies.get(FLOW_COOKIE, "")
        if not state or not hmac.compare_digest(bound, _binding(state)):
            log.warning("signin.callback_refused", reason="no flow cookie for this state")
            return _page("Sign-in refused", "<p>This browser did not start this sign-in: start it again.</p>", 400)
        try:
            backend, caller = await self._sign_ins.finish(
                state, params.get("code"), params.get("iss"), params.get("error")
            )
        except SignInFailed as exc:
            return _page("Sign-in failed", f"<p>{escape(str(exc))}</p>", 400)
        response = _page(
            f"Connected to {backend}",
            f"<p>{escape(caller)} is signed in to {escape(backend)}. Close this page and call the tool again.</p>",
        )
        response.delete_cookie(FLOW_COOKIE, path=CONNECT_PREFIX)
        return response

    async def listing(self, request: Request) -> Response:
        caller = self._who(request)
        if caller is None:
            return _page("Sign in first", "<p>Sign in to the gateway's page (/ui/login) first.</p>", 401)
        operator = self._operator(caller)
        rows = await self._sign_ins.connected(None if operator else caller)
        items = "".join(
            f"<li>{escape(row.caller)} -&gt; {escape(row.backend)}"
            + (" (refreshable)" if row.refreshable else "")
            + f'<form method=post><input type=hidden name=backend value="{escape(row.backend)}">'
            + f'<input type=hidden name=caller value="{escape(row.caller)}"><button>Revoke</button></form></li>'
            for row in rows
        )
        servers = "".join(
            f'<li><a href="{CONNECT_PREFIX}/{escape(name)}">{escape(name)}</a></li>'
            for name in self._sign_ins.servers()
        )
        return _page("Connections", f"<ul>{items or '<li>none</li>'}</ul><h2>Sign in to</h2><ul>{servers}</ul>")

    async def revoke(self, request: Request) -> Response:
        caller = self._who(request)
        if caller is None or not same_origin(request, self._allowed_origins):
            return _page("Refused", "<p>Revoke from the gateway's own page, signed in.</p>", 403)
        form = await read_form(request)
        if form is None:
            return _page("Refused", "<p>The form is too large.</p>", 413)
        whose = form.get("caller") or caller
        if whose != caller and not self._operator(caller):
            return _page("Refused", "<p>Only an operator revokes another caller's connection.</p>", 403)
        await self._sign_ins.revoke(whose, form.get("backend") or None)
        return RedirectResponse("/ui/connections", status_code=303, headers=_HEADERS)
