"""The status page (``StatusPage``, mounted at ``/ui``): one server-rendered HTML page for people, beside the
``/status`` JSON for programs, with its own sign-in (the ``Guard`` checks Host and Origin, and lets ``UI_PATHS`` past
its bearer check). The page shows the backends, the catalog, the ledger's recent calls and per-tool figures over the
last 24 hours (refusals counted apart from the tools' errors and latencies), and reloads itself every ``REFRESH_S``
seconds. An operator (``gateway.auth.operators``, or anyone on the open loopback page) sees all of it, who sees what,
and a banner while an edit of the configuration file is refused (``Gateway.reload_error``); anyone else sees what its
policy shows it (its backends and tools) and its own calls, figures and tokens only, so the page is no way around a
policy. No script runs, and the Content-Security-Policy allows nothing but the page's own nonce'd stylesheet. The
HTML comes from Jinja2 templates (``templates/``, package data) with autoescape on: backend reasons and tool
descriptions are a downstream's words, untrusted, and reasons are also scrubbed of registered secrets, as on
``/status``.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from fnmatch import fnmatchcase
from typing import Any

import anyio
import anyio.to_thread
import jinja2
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway.auth.connections import OPEN_CALLER
from gateway.auth.cookies import SESSION_TTL_S, SessionCookies
from gateway.auth.tokens import Tokens
from gateway.backends.base import BackendStatus
from gateway.core.catalog import Catalog
from gateway.core.pins import Item, approval_rows, definition_diff, digest, findings, pin_key
from gateway.core.policies import View
from gateway.core.runtime import Gateway
from gateway.errors import AuditError
from gateway.front.http.forms import read_form, same_origin
from gateway.ledger.engines import open_reader
from gateway.ledger.pins import write_pins
from gateway.ledger.readers import CallerTokens, Filters, ToolStats
from gateway.ledger.records import AuditRecord
from gateway.observe.logs import redactor
from gateway.version import VERSION

__all__ = ["UI_PATHS", "StatusPage"]

log = structlog.get_logger("gateway.ui")

UI_PATHS = ("/ui", "/ui/", "/ui/login", "/ui/logout", "/ui/pins/approve")
"""The paths the Guard lets past its bearer check (this app authenticates itself); ``/ui`` redirects to ``/ui/``."""

COOKIE = "gateway_ui_session"
REFRESH_S = 5  # the page reloads itself this often
RECENT_CALLS = 25
STATS_WINDOW_S = 24 * 3600.0
STATS_CACHE_S = 10.0  # stats read every row of the window: open tabs refreshing every 5 s share one reading
MAX_STATS_CALLERS = 64  # per-caller figures kept (the least recently read out first)
TEXT_LIMIT = 600  # characters of a reason or error shown (a stderr tail can be long)
DESCRIPTION_LIMIT = 160


# ------------------------------------------------------------------------------------------------- the app


class StatusPage:
    """The status page's routes, one method each; ``app()`` is the sub-app to mount at ``/ui`` behind the ``Guard``.

    A gateway without tokens only ever serves on loopback (the CLI refuses anything else), and there the page is
    open, like ``/mcp``; without tokens off loopback it is refused. With tokens, a browser signs in once at
    ``/ui/login`` by posting a token in a form body, compared in constant time by the same ``Tokens`` as the bearer
    check; the answer is a session cookie (HttpOnly, SameSite=Strict, Path=/ui, Secure over https) holding the
    caller's name and an expiry, HMAC-signed with a key drawn at random per process: never the token, and a restart
    signs every browser out. An ``Authorization: Bearer`` header is accepted too (scripts, curl). Tokens never appear
    in a URL: the form posts, the redirects carry nothing, and a token in a query string is ignored. POSTs (sign in,
    sign out) must come from the page's own origin: SameSite=Strict keeps the cookie off cross-site requests, and an
    ``Origin`` naming another host (or none at all) is refused.

    Args:
        gateway: the running gateway whose state the page shows.
        tokens: the accepted bearer tokens; none configured means the page is open (on loopback only).
        loopback: whether the gateway is bound to loopback.
        access: the policies and, per caller, how many tools it sees (``Views.statistics``), shown to operators.
        views: a caller's view of the catalog by its name (None: no policies, it sees every tool).
    """

    def __init__(
        self,
        gateway: Gateway,
        tokens: Tokens,
        loopback: bool,
        access: Callable[[], dict[str, Any]] | None = None,
        views: Callable[[str], View | None] | None = None,
    ) -> None:
        self.gateway = gateway
        self.tokens = tokens
        self.loopback = loopback
        self.access = access
        self.views = views
        self.cookies = SessionCookies()
        self.allowed_origins = {o.lower() for o in gateway.config.gateway.allowed_origins}
        self.ledger = _LedgerView(gateway)

    def app(self, extra: Sequence[Route] = ()) -> ASGIApp:
        """The sub-app; ``extra`` routes join it (the connect pages, front/http/connect.py)."""
        return Starlette(
            routes=[
                Route("/", self.page, methods=["GET"]),
                Route("/login", self.login_form, methods=["GET"]),
                Route("/login", self.login, methods=["POST"]),
                Route("/logout", self.logout, methods=["POST"]),
                Route("/pins/approve", self.approve_pin, methods=["POST"]),
                *extra,
            ]
        )

    def caller(self, request: Request) -> str | None:
        """Who the browser (or script) is: a bearer token's caller or a signed-in cookie's; "local" when open."""
        if not self.tokens:
            return OPEN_CALLER if self.loopback else None
        identified = self.tokens.identify(request.headers.get("authorization"))
        return identified or self.cookies.verify(request.cookies.get(COOKIE))

    async def page(self, request: Request) -> Response:
        base = _base(request)
        caller = self.caller(request)
        if caller is None:
            if not self.tokens:
                return _refused(403, "The status page is open only on a loopback bind; configure tokens to sign in.")
            return _redirect(f"{base}/login")
        shown = self.shown(caller)
        ledger = await self.ledger.read(None if shown.operator else caller)
        nonce = secrets.token_urlsafe(16)
        body = _render_page(
            self.gateway,
            ledger,
            caller=caller if self.tokens else None,
            base=base,
            nonce=nonce,
            access=self.access() if self.access and shown.operator else None,
            shown=shown,
        )
        return _html(body, nonce)

    def shown(self, caller: str) -> _Shown:
        """What ``caller`` is shown: everything when it is an operator (or the page is open, without tokens), else
        what its policy shows it."""
        operators = self.gateway.config.gateway.auth.operators
        if not self.tokens or any(fnmatchcase(caller, pattern) for pattern in operators):
            return _Shown(operator=True, view=None)
        return _Shown(operator=False, view=self.views(caller) if self.views is not None else None)

    async def login_form(self, request: Request) -> Response:
        base = _base(request)
        if not self.tokens or self.caller(request) is not None:
            return _redirect(f"{base}/")
        nonce = secrets.token_urlsafe(16)
        return _html(_render_login(self.gateway.config.gateway.name, base, nonce, error=None), nonce)

    async def login(self, request: Request) -> Response:
        base = _base(request)
        if not self.tokens:
            return _redirect(f"{base}/")
        if not same_origin(request, self.allowed_origins):
            return _refused(403, "Sign-in refused: the form must be posted from this gateway's own page.")
        form = await read_form(request)
        if form is None:
            return _refused(413, "Sign-in refused: the form is too large.")
        caller = self.tokens.identify(f"Bearer {form.get('token', '')}")
        if caller is None:
            log.warning("ui.login_refused")
            nonce = secrets.token_urlsafe(16)
            body = _render_login(self.gateway.config.gateway.name, base, nonce, error="That token is not valid.")
            return _html(body, nonce, status=401)
        log.info("ui.login", caller=caller)
        response = _redirect(f"{base}/")
        response.set_cookie(
            COOKIE,
            self.cookies.issue(caller),
            max_age=int(SESSION_TTL_S),
            path=base or "/",
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return response

    async def logout(self, request: Request) -> Response:
        base = _base(request)
        if not same_origin(request, self.allowed_origins):
            return _refused(403, "Sign-out refused: the form must be posted from this gateway's own page.")
        response = _redirect(f"{base}/login" if self.tokens else f"{base}/")
        response.delete_cookie(COOKIE, path=base or "/", httponly=True, samesite="strict")
        return response

    async def approve_pin(self, request: Request) -> Response:
        """An operator approves one pending definition, as the page showed it (its digest): a definition that changed
        again since is not approved. Recorded as ``gateway pins approve`` does, with the operator's name."""
        base = _base(request)
        caller = self.caller(request)
        if caller is None or not self.shown(caller).operator:
            return _refused(403, "Only an operator approves tool definitions.")
        if not same_origin(request, self.allowed_origins):
            return _refused(403, "Approval refused: the form must be posted from this gateway's own page.")
        form = await read_form(request) or {}
        server, name, wanted = form.get("server", ""), form.get("tool", ""), form.get("digest", "")
        tool = _listed(self.gateway, server, name)
        if tool is None or digest(tool) != wanted:
            return _refused(
                409, f"{server}/{name} is not listed as the page showed it any more; reload and look again."
            )
        audit = self.gateway.config.gateway.audit
        by = caller if self.tokens else "local"
        try:
            await anyio.to_thread.run_sync(write_pins, audit.url or audit.path, approval_rows(server, [tool], by))
        except AuditError as exc:
            return _refused(503, f"Approval not recorded: {exc}")
        log.info("ui.pin_approved", tool=f"{server}/{name}", by=by)
        await self.gateway.refresh_pins()
        return _redirect(f"{base}/")


def _base(request: Request) -> str:
    """Where the app is mounted (``/ui``, after any root path): links, redirects and the cookie's path hang off it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


_SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    # Not "no-referrer": under it a browser sends ``Origin: null`` with a form POST, which both the Guard and
    # ``_same_origin`` must refuse. "same-origin" still sends nothing to any other site.
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
    "X-Content-Type-Options": "nosniff",
}


def _csp(nonce: str | None) -> str:
    style = f"'nonce-{nonce}'" if nonce else "'none'"
    return f"default-src 'none'; style-src {style}; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"


def _html(body: str, nonce: str, *, status: int = 200) -> Response:
    return HTMLResponse(body, status_code=status, headers={**_SECURITY_HEADERS, "Content-Security-Policy": _csp(nonce)})


def _redirect(location: str) -> Response:
    return RedirectResponse(
        location, status_code=303, headers={**_SECURITY_HEADERS, "Content-Security-Policy": _csp(None)}
    )


def _refused(status: int, message: str) -> Response:
    body = _render_refused(status, message)
    return HTMLResponse(body, status_code=status, headers={**_SECURITY_HEADERS, "Content-Security-Policy": _csp(None)})


@dataclass(frozen=True, slots=True)
class _Shown:
    """What one person is shown: everything (``operator``), or what ``view`` shows (None: no policies, every tool)."""

    operator: bool
    view: View | None


# ------------------------------------------------------------------------------------------------- ledger


@dataclass(frozen=True, slots=True)
class _TokenRow:
    """One caller's tokens over the stats window, and its tokens out per hour (oldest first) as chart bars."""

    caller: str | None
    calls: int
    tokens_in: int
    tokens_out: int
    bars: Sequence[tuple[int, int, int]]  # (x, height, tokens) of each hour's bar in the chart


@dataclass(frozen=True, slots=True)
class _LedgerData:
    calls: Sequence[AuditRecord] = ()  # newest first
    stats: Sequence[ToolStats] = ()
    problem: str | None = None  # why there is nothing to show: the ledger is off, or unreadable
    tokens: Sequence[_TokenRow] = ()


CHART_HOURS = 24
BAR_W, CHART_H = 6, 24  # each hour's bar, and the chart's height, in pixels


def _token_rows(
    callers: Sequence[CallerTokens], hourly: Sequence[tuple[int, str | None, int]], now: float
) -> list[_TokenRow]:
    """Each caller's row, its bars scaled to the busiest hour of any caller."""
    last = int(now // 3600)
    per: dict[str | None, dict[int, int]] = {}
    for hour, caller, tokens in hourly:
        per.setdefault(caller, {})[hour] = tokens
    top = max((t for hours in per.values() for t in hours.values()), default=0) or 1
    rows = []
    for item in callers:
        hours = per.get(item.caller, {})
        bars = []
        for n in range(CHART_HOURS):
            tokens = hours.get(last - CHART_HOURS + 1 + n, 0)
            bars.append((n * BAR_W, max(1, round(tokens / top * CHART_H)) if tokens else 0, tokens))
        rows.append(_TokenRow(item.caller, item.calls, item.tokens_in, item.tokens_out, bars))
    return rows


class _LedgerView:
    """Reads the ledger for the page, in a worker thread (``query`` and ``stats`` are blocking SQLite reads)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._stats: dict[
            str | None, tuple[float, list[ToolStats], list[_TokenRow]]
        ] = {}  # caller -> (read at, figures)

    async def read(self, caller: str | None) -> _LedgerData:
        """The recent calls and figures of ``caller`` (None: of every caller)."""
        ledger = self._gateway.ledger
        if ledger is None or ledger.target is None:
            return _LedgerData(problem="The audit ledger is off (gateway.audit.enabled: false), so no calls are kept.")
        reader = open_reader(ledger.target)
        try:
            calls = await anyio.to_thread.run_sync(lambda: reader.query(Filters(caller=caller), limit=RECENT_CALLS))
            now = anyio.current_time()
            cached = self._stats.pop(caller, None)
            if cached is None or now - cached[0] >= STATS_CACHE_S:
                window = Filters(since=time.time() - STATS_WINDOW_S, caller=caller)

                def figures() -> tuple[list[ToolStats], list[_TokenRow]]:
                    tokens = _token_rows(reader.callers(window), reader.hourly(window), time.time())
                    return reader.stats(window), tokens

                cached = (now, *await anyio.to_thread.run_sync(figures))
            self._stats[caller] = cached  # the most recently read last
            if len(self._stats) > MAX_STATS_CALLERS:
                self._stats.pop(next(iter(self._stats)))
        except AuditError as exc:
            return _LedgerData(problem=str(exc))
        return _LedgerData(calls=list(reversed(calls)), stats=cached[1], tokens=cached[2])


# ------------------------------------------------------------------------------------------------- rendering


def _clip(text: str | None, limit: int = TEXT_LIMIT) -> str:
    text = "" if text is None else str(redactor.scrub(text))
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _iso(ts: float) -> str:
    return datetime.fromtimestamp(ts, UTC).strftime("%Y-%m-%d %H:%M:%SZ")


def _duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min"
    if seconds < 86400:
        return f"{seconds // 3600} h {seconds % 3600 // 60:02d} min"
    return f"{seconds // 86400} d {seconds % 86400 // 3600} h"


def _ago(ts: float, now: float) -> str:
    return "just now" if now - ts < 1 else f"{_duration(now - ts)} ago"


def _ms(value: float | None) -> str:
    if value is None:
        return "—"
    return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _pct(value: float) -> str:
    return "0 %" if value == 0 else f"{value * 100:.1f} %"


_TEMPLATES = jinja2.Environment(
    loader=jinja2.PackageLoader("gateway.front.http", "templates"),
    # Every .html template escapes every value (status.css, included verbatim, holds no value).
    autoescape=jinja2.select_autoescape(enabled_extensions=("html",), default_for_string=True),
    undefined=jinja2.StrictUndefined,
    trim_blocks=True,
    lstrip_blocks=True,
)
_TEMPLATES.filters.update(clip=_clip, iso=_iso, ago=_ago, ms=_ms, pct=_pct)


def _render_refused(status: int, message: str) -> str:
    return _TEMPLATES.get_template("refused.html").render(status=status, message=message)


def _render_login(name: str, base: str, nonce: str, *, error: str | None) -> str:
    return _TEMPLATES.get_template("login.html").render(name=name, base=base, nonce=nonce, error=error, refresh=None)


@dataclass(frozen=True, slots=True)
class _BackendRow:
    name: str
    kind: str
    status: BackendStatus
    published: int


@dataclass(frozen=True, slots=True)
class _ToolRow:
    name: str
    route: bool
    chain: str  # the providers in order
    description: str  # its first line


def _tool_rows(catalog: Catalog, view: View | None) -> list[_ToolRow]:
    rows = []
    for name in sorted(catalog.entries):
        if view is not None and name not in view.tools:
            continue
        entry = catalog.entries[name]
        chain = " → ".join(provider.label for provider in entry.providers)
        first_line = (entry.tool.description or "").strip().split("\n", 1)[0]
        rows.append(_ToolRow(name, bool(entry.route), chain, first_line))
    return rows


@dataclass(frozen=True, slots=True)
class _PinRow:
    server: str
    tool: str
    change: str
    mode: str
    digest: str
    findings: list[str]
    diff: str


def _listed(gateway: Gateway, server: str, key: str) -> Item | None:
    """The tool or prompt ``server`` lists now under its pin's name ``key`` (pins.py ``pin_key``)."""
    backend = gateway.backends.get(server)
    listed: list[Item] = [*backend.tools(), *backend.prompts()] if backend is not None else []
    return next((item for item in listed if pin_key(item) == key), None)


def _pin_rows(gateway: Gateway) -> list[_PinRow]:
    """What waits for an operator's approval, each with its findings and its diff from what was approved."""
    rows = []
    for pending in gateway.catalog.pins_pending:
        tool = _listed(gateway, pending.server, pending.tool)
        if tool is None:
            continue
        pinned = gateway.pins.get((pending.server, pending.tool))
        found = [str(f) for f in findings(tool, pending.digest)]
        diff = definition_diff(pinned.definition if pinned is not None else None, tool)
        rows.append(_PinRow(pending.server, pending.tool, pending.change, pending.mode, pending.digest, found, diff))
    return rows


def _render_page(
    gateway: Gateway,
    ledger: _LedgerData,
    *,
    caller: str | None,
    base: str,
    nonce: str,
    access: dict[str, Any] | None = None,
    shown: _Shown = _Shown(operator=True, view=None),
) -> str:
    published = gateway.catalog.by_backend()
    view = shown.view
    backends = [
        _BackendRow(name, kind, status, published.get(name, 0))
        for name, kind, status in gateway.statuses()
        if view is None or view.sees_backend(name)
    ]
    return _TEMPLATES.get_template("status.html").render(
        name=gateway.config.gateway.name,
        overall="ok" if gateway.healthy() else "degraded",
        uptime=_duration(anyio.current_time() - gateway.started_at),
        version=VERSION,
        now=time.time(),
        refresh=REFRESH_S,
        caller=caller,
        base=base,
        nonce=nonce,
        backends=backends,
        tools=_tool_rows(gateway.catalog, view),
        problems=gateway.catalog.problems if shown.operator else (),
        pins=_pin_rows(gateway) if shown.operator else [],
        reload_error=gateway.reload_error if shown.operator else None,
        config_file=gateway.config.source,
        loaded_at=gateway.loaded_at,
        catalog_tokens=gateway.catalog.tokens,
        chart=(CHART_HOURS * BAR_W, CHART_H),
        ledger=ledger,
        recent_calls=RECENT_CALLS,
        description_limit=DESCRIPTION_LIMIT,
        access=access,
    )
