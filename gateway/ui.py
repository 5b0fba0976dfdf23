"""The status page: one server-rendered HTML page at ``/ui/`` for people, beside the ``/status`` JSON for programs.

``build_ui(gateway, tokens, loopback)`` is a Starlette sub-app that ``http.py`` mounts at ``/ui``. The page shows the
backends (state, reason, since, last error, tool count), the catalog, the ledger's recent calls and per-tool figures
over the last 24 hours, and reloads itself every ``REFRESH_S`` seconds with ``<meta http-equiv="refresh">``: no
script runs, no front-end build exists, and the Content-Security-Policy allows nothing but the page's own nonce'd
stylesheet. Every value that reaches the HTML goes through ``html.escape`` — backend reasons quote what a downstream
printed and tool descriptions are the downstream's words, so both are untrusted; reasons are also scrubbed of
registered secrets, as on ``/status``.

Authentication (the app does its own; the ``Guard`` still checks Host and Origin first, and lets ``UI_PATHS`` past
its bearer check). A gateway without tokens only ever serves on loopback (the CLI refuses anything else), and there
the page is open, like ``/mcp``; without tokens off loopback it is refused. With tokens, a browser signs in once at
``/ui/login`` by posting a token in a form body, compared in constant time by the same ``Tokens`` as the bearer
check; the answer is a session cookie (HttpOnly, SameSite=Strict, Path=/ui, Secure over https) holding the caller's
name and an expiry, HMAC-signed with a key drawn at random per process — never the token, and a restart signs every
browser out. A ``Authorization: Bearer`` header is accepted too (scripts, curl). Tokens never appear in a URL: the
form posts, the redirects carry nothing, and a token in a query string is ignored. POSTs (sign in, sign out) must
come from the page's own origin: SameSite=Strict keeps the cookie off cross-site requests, and an ``Origin`` header
naming another host (or none at all) is refused.
"""

from __future__ import annotations

import html
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qs

import anyio
import anyio.to_thread
import structlog
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import HTMLResponse, RedirectResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp

from gateway._logging import redactor
from gateway.audit import AuditRecord, ToolStats, query, stats
from gateway.auth.cookies import SESSION_TTL_S, SessionCookies
from gateway.auth.tokens import Tokens
from gateway.catalog import Catalog
from gateway.errors import AuditError
from gateway.runtime import VERSION, Gateway

__all__ = ["UI_PATHS", "build_ui"]

log = structlog.get_logger("gateway.ui")

UI_PATHS = ("/ui", "/ui/", "/ui/login", "/ui/logout")
"""The paths the Guard lets past its bearer check (this app authenticates itself); ``/ui`` redirects to ``/ui/``."""

COOKIE = "gateway_ui_session"
REFRESH_S = 5  # the page reloads itself this often
RECENT_CALLS = 25
STATS_WINDOW_S = 24 * 3600.0
STATS_CACHE_S = 10.0  # stats read every row of the window: open tabs refreshing every 5 s share one reading
MAX_FORM_BYTES = 4096  # a sign-in form holds one token; a bigger body is not the form
TEXT_LIMIT = 600  # characters of a reason or error shown (a stderr tail can be long)
DESCRIPTION_LIMIT = 160


# ------------------------------------------------------------------------------------------------- the app


def build_ui(
    gateway: Gateway, tokens: Tokens, loopback: bool, access: Callable[[], dict[str, Any]] | None = None
) -> ASGIApp:
    """The status page's app, to be mounted at ``/ui`` behind the ``Guard``.

    Args:
        gateway: the running gateway whose state the page shows.
        tokens: the accepted bearer tokens; none configured means the page is open (on loopback only).
        loopback: whether the gateway is bound to loopback.
        access: the policies and, per caller, how many tools it sees (``Views.statistics``), shown when given.
    """
    sessions = SessionCookies()
    allowed_origins = {o.lower() for o in gateway.config.gateway.allowed_origins}
    ledger_view = _LedgerView(gateway)

    def caller_of(request: Request) -> str | None:
        if not tokens:
            return "local" if loopback else None
        return tokens.identify(request.headers.get("authorization")) or sessions.verify(request.cookies.get(COOKIE))

    async def page(request: Request) -> Response:
        base = _base(request)
        caller = caller_of(request)
        if caller is None:
            if not tokens:
                return _refused(403, "The status page is open only on a loopback bind; configure tokens to sign in.")
            return _redirect(f"{base}/login")
        ledger = await ledger_view.read()
        nonce = secrets.token_urlsafe(16)
        body = _render_page(
            gateway,
            ledger,
            caller=caller if tokens else None,
            base=base,
            nonce=nonce,
            access=access() if access else None,
        )
        return _html(body, nonce)

    async def login_form(request: Request) -> Response:
        base = _base(request)
        if not tokens or caller_of(request) is not None:
            return _redirect(f"{base}/")
        nonce = secrets.token_urlsafe(16)
        return _html(_render_login(gateway.config.gateway.name, base, nonce, error=None), nonce)

    async def login(request: Request) -> Response:
        base = _base(request)
        if not tokens:
            return _redirect(f"{base}/")
        if not _same_origin(request, allowed_origins):
            return _refused(403, "Sign-in refused: the form must be posted from this gateway's own page.")
        form = await _read_form(request)
        if form is None:
            return _refused(413, "Sign-in refused: the form is too large.")
        caller = tokens.identify(f"Bearer {form.get('token', '')}")
        if caller is None:
            log.warning("ui.login_refused")
            nonce = secrets.token_urlsafe(16)
            body = _render_login(gateway.config.gateway.name, base, nonce, error="That token is not valid.")
            return _html(body, nonce, status=401)
        log.info("ui.login", caller=caller)
        response = _redirect(f"{base}/")
        response.set_cookie(
            COOKIE,
            sessions.issue(caller),
            max_age=int(SESSION_TTL_S),
            path=base or "/",
            secure=request.url.scheme == "https",
            httponly=True,
            samesite="strict",
        )
        return response

    async def logout(request: Request) -> Response:
        base = _base(request)
        if not _same_origin(request, allowed_origins):
            return _refused(403, "Sign-out refused: the form must be posted from this gateway's own page.")
        response = _redirect(f"{base}/login" if tokens else f"{base}/")
        response.delete_cookie(COOKIE, path=base or "/", httponly=True, samesite="strict")
        return response

    return Starlette(
        routes=[
            Route("/", page, methods=["GET"]),
            Route("/login", login_form, methods=["GET"]),
            Route("/login", login, methods=["POST"]),
            Route("/logout", logout, methods=["POST"]),
        ]
    )


def _base(request: Request) -> str:
    """Where the app is mounted (``/ui``, after any root path): links, redirects and the cookie's path hang off it."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def _same_origin(request: Request, allowed_origins: set[str]) -> bool:
    """Whether a POST comes from the gateway's own page: its ``Origin`` names the ``Host`` it was sent to (or an
    origin the operator allowed). A browser always sends ``Origin`` with a form POST, so none at all is refused."""
    origin = request.headers.get("origin", "").lower()
    if not origin or origin == "null":
        return False
    if origin in allowed_origins:
        return True
    return origin.split("://", 1)[-1] == request.headers.get("host", "").lower()


async def _read_form(request: Request) -> dict[str, str] | None:
    """The urlencoded form body, read up to ``MAX_FORM_BYTES``; None when it is larger."""
    body = b""
    async for chunk in request.stream():
        body += chunk
        if len(body) > MAX_FORM_BYTES:
            return None
    fields = parse_qs(body.decode("utf-8", errors="replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


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
    body = f"<!doctype html><title>{status}</title><p>{html.escape(message)}</p>"
    return HTMLResponse(body, status_code=status, headers={**_SECURITY_HEADERS, "Content-Security-Policy": _csp(None)})


# ------------------------------------------------------------------------------------------------- ledger


@dataclass(frozen=True, slots=True)
class _LedgerData:
    calls: Sequence[AuditRecord] = ()  # newest first
    stats: Sequence[ToolStats] = ()
    problem: str | None = None  # why there is nothing to show: the ledger is off, or unreadable


class _LedgerView:
    """Reads the ledger for the page, in a worker thread (``query`` and ``stats`` are blocking SQLite reads)."""

    def __init__(self, gateway: Gateway) -> None:
        self._gateway = gateway
        self._stats: tuple[float, list[ToolStats]] | None = None  # (read at, figures)

    async def read(self) -> _LedgerData:
        ledger = self._gateway.ledger
        if ledger is None or ledger.path is None:
            return _LedgerData(problem="The audit ledger is off (gateway.audit.enabled: false), so no calls are kept.")
        path = ledger.path
        try:
            calls = await anyio.to_thread.run_sync(lambda: query(path, limit=RECENT_CALLS))
            now = anyio.current_time()
            cached = self._stats
            if cached is None or now - cached[0] >= STATS_CACHE_S:
                figures = await anyio.to_thread.run_sync(lambda: stats(path, since=time.time() - STATS_WINDOW_S))
                cached = self._stats = (now, figures)
        except AuditError as exc:
            return _LedgerData(problem=str(exc))
        return _LedgerData(calls=list(reversed(calls)), stats=cached[1])


# ------------------------------------------------------------------------------------------------- rendering


_e = html.escape


def _clip(text: str | None, limit: int) -> str:
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


def _ms(value: float) -> str:
    return f"{value:.0f} ms" if value >= 10 else f"{value:.1f} ms"


def _pct(value: float) -> str:
    return "0 %" if value == 0 else f"{value * 100:.1f} %"


def _badge(text: str, kind: str | None = None) -> str:
    return f'<span class="badge {_e(kind or text)}">{_e(text)}</span>'


_STYLE = """
:root { color-scheme: light; --fg: #1f2328; --muted: #59636e; --line: #d1d9e0; --bg: #f6f8fa; }
* { box-sizing: border-box; }
body { margin: 0; font: 14px/1.45 system-ui, -apple-system, "Segoe UI", Roboto, sans-serif; color: var(--fg); }
header { display: flex; flex-wrap: wrap; gap: 8px 24px; align-items: center; padding: 14px 24px;
         border-bottom: 1px solid var(--line); background: var(--bg); }
header h1 { font-size: 20px; margin: 0; }
header .meta { color: var(--muted); }
header form { margin-left: auto; }
main { padding: 8px 24px 32px; max-width: 1400px; }
h2 { font-size: 16px; margin: 24px 0 8px; }
h2 small { font-weight: normal; color: var(--muted); }
table { border-collapse: collapse; width: 100%; }
th, td { text-align: left; vertical-align: top; padding: 6px 10px; border-bottom: 1px solid var(--line); }
th { background: var(--bg); font-weight: 600; white-space: nowrap; }
td.num, th.num { text-align: right; white-space: nowrap; font-variant-numeric: tabular-nums; }
tbody tr:hover { background: #fbfcfd; }
code, .mono { font-family: ui-monospace, SFMono-Regular, Menlo, Consolas, monospace; font-size: 13px; }
.text { white-space: pre-wrap; overflow-wrap: anywhere; max-width: 48ch; }
.muted { color: var(--muted); }
.nowrap { white-space: nowrap; }
.badge { display: inline-block; padding: 1px 8px; border-radius: 10px; font-size: 12px; font-weight: 600;
         background: #eaeef2; color: #424a53; white-space: nowrap; }
.badge.ready, .badge.ok { background: #dafbe1; color: #116329; }
.badge.degraded, .badge.starting { background: #fff8c5; color: #7d4e00; }
.badge.failed, .badge.error, .badge.timeout, .badge.internal_error { background: #ffebe9; color: #a40e26; }
.badge.disabled, .badge.refused, .badge.cancelled, .badge.unknown_tool, .badge.invalid_params {
  background: #eaeef2; color: #59636e; }
.note { padding: 10px 12px; background: var(--bg); border: 1px solid var(--line); border-radius: 6px; }
ul.problems { margin: 8px 0; color: #7d4e00; }
button { font: inherit; padding: 4px 12px; border: 1px solid var(--line); border-radius: 6px; background: #fff;
         cursor: pointer; }
form.login { max-width: 360px; margin: 80px auto; padding: 24px; border: 1px solid var(--line); border-radius: 8px; }
form.login input { display: block; width: 100%; margin: 6px 0 14px; padding: 6px 8px; font: inherit; }
form.login .error { color: #a40e26; }
"""


def _document(title: str, nonce: str, body: str, *, refresh: bool) -> str:
    meta = f'<meta http-equiv="refresh" content="{REFRESH_S}">' if refresh else ""
    return (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        f'{meta}<title>{_e(title)}</title><style nonce="{_e(nonce)}">{_STYLE}</style></head>'
        f"<body>{body}</body></html>"
    )


def _render_login(name: str, base: str, nonce: str, *, error: str | None) -> str:
    message = f'<p class="error">{_e(error)}</p>' if error else ""
    body = (
        f'<form class="login" method="post" action="{_e(base)}/login">'
        f'<h1>{_e(name)}</h1><p class="muted">Sign in to the status page with one of the gateway\'s bearer tokens.</p>'
        f"{message}"
        '<label for="token">Token</label>'
        '<input id="token" name="token" type="password" autocomplete="current-password" required autofocus>'
        '<button type="submit">Sign in</button></form>'
    )
    return _document(f"Sign in · {name}", nonce, body, refresh=False)


def _render_page(
    gateway: Gateway,
    ledger: _LedgerData,
    *,
    caller: str | None,
    base: str,
    nonce: str,
    access: dict[str, Any] | None = None,
) -> str:
    now = time.time()
    name = gateway.config.gateway.name
    overall = "ok" if gateway.healthy() else "degraded"
    uptime = _duration(anyio.current_time() - gateway.started_at)
    signout = ""
    if caller is not None:
        signout = (
            f'<form method="post" action="{_e(base)}/logout"><span class="muted">signed in as {_e(caller)}</span> '
            '<button type="submit">Sign out</button></form>'
        )
    header = (
        f"<header><h1>{_e(name)}</h1>{_badge(overall)}"
        f'<span class="meta">up {_e(uptime)} · version {_e(VERSION)} · {_e(_iso(now))} · '
        f"refreshes every {REFRESH_S} s</span>{signout}</header>"
    )
    sections = [
        _backends_section(gateway, now),
        _catalog_section(gateway.catalog),
        _access_section(access) if access is not None else "",
        _calls_section(ledger, now),
        _stats_section(ledger),
    ]
    return _document(f"{name} · {overall}", nonce, header + "<main>" + "".join(sections) + "</main>", refresh=True)


def _backends_section(gateway: Gateway, now: float) -> str:
    published = gateway.catalog.by_backend()
    none = '<span class="muted">—</span>'
    rows = []
    for name, kind, status in gateway.statuses():
        reason = _e(_clip(status.reason, TEXT_LIMIT)) if status.reason else none
        if status.declared and status.reason:
            reason += ' <span class="muted">(declared)</span>'
        for label, why in status.unready:  # a variant its probe found unable to run: skipped by the ladder
            detail = f"variant <code>{_e(label)}</code> not ready: {_e(_clip(why, TEXT_LIMIT))}"
            reason = ("" if reason == none else reason + "<br>") + f'{detail} <span class="muted">(detected)</span>'
        if not status.last_error:
            last_error = none
        elif status.last_error == status.reason:
            last_error = '<span class="muted">the reason</span>'
        else:
            last_error = _e(_clip(status.last_error, TEXT_LIMIT))
        rows.append(
            f'<tr id="backend-{_e(name)}"><td><code>{_e(name)}</code></td><td>{_e(kind)}</td>'
            f"<td>{_badge(str(status.state))}</td>"
            f'<td class="text">{reason}</td>'
            f'<td class="nowrap">{_e(_ago(status.since, now))}'
            f'<br><span class="muted mono">{_e(_iso(status.since))}</span></td>'
            f'<td class="text">{last_error}</td>'
            f'<td class="num">{status.tool_count}</td><td class="num">{published.get(name, 0)}</td></tr>'
        )
    if not rows:
        return '<h2>Backends</h2><p class="note">No backends are configured.</p>'
    head = (
        "<tr><th>Backend</th><th>Kind</th><th>State</th><th>Reason</th><th>Since</th><th>Last error</th>"
        '<th class="num" title="tools the backend offers now">Tools</th>'
        '<th class="num" title="published tools (routes included) it serves">Published</th></tr>'
    )
    return (
        f'<h2>Backends <small>{len(rows)}</small></h2><table id="backends"><thead>{head}</thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
    )


def _catalog_section(catalog: Catalog) -> str:
    rows = []
    for name in sorted(catalog.entries):
        entry = catalog.entries[name]
        chain = " → ".join(provider.label for provider in entry.providers)
        route = f" {_badge('route', 'route')}" if entry.route else ""
        first_line = (entry.tool.description or "").strip().split("\n", 1)[0]
        rows.append(
            f'<tr><td><code>{_e(name)}</code>{route}</td><td class="mono">{_e(chain)}</td>'
            f'<td class="muted">{_e(_clip(first_line, DESCRIPTION_LIMIT))}</td></tr>'
        )
    problems = ""
    if catalog.problems:
        items = "".join(f"<li>{_e(problem)}</li>" for problem in catalog.problems)
        problems = f'<ul class="problems">{items}</ul>'
    table = (
        '<table id="catalog"><thead><tr><th>Tool</th><th>Providers (in order)</th><th>Description</th></tr></thead>'
        f"<tbody>{''.join(rows)}</tbody></table>"
        if rows
        else '<p class="note">No tool is published yet.</p>'
    )
    return f"<h2>Catalog <small>{len(rows)} tools</small></h2>{problems}{table}"


def _access_section(access: dict[str, Any]) -> str:
    """The policies (who, how many tools) and each known caller's policy and tool count."""
    policies = "".join(
        f'<tr><td><code>{_e(p["name"])}</code></td><td class="mono">{_e(", ".join(p["callers"]))}</td>'
        f'<td class="mono">{_e(json.dumps(p["claims"]) if p["claims"] else "")} {_e(" ".join(p["scopes"]))}</td>'
        f"<td>{p['tools']}</td></tr>"
        for p in access["policies"]
    )
    callers = "".join(
        f"<tr><td><code>{_e(c['caller'])}</code></td><td>{_e(c['policy'] or '—')}</td><td>{c['tools']}</td></tr>"
        for c in access["callers"]
    )
    table = (
        '<table id="policies"><thead><tr><th>Policy</th><th>Callers</th><th>Claims, scopes</th><th>Tools</th></tr>'
        f"</thead><tbody>{policies}</tbody></table>"
        if policies
        else '<p class="note">No policies: every caller sees every tool.</p>'
    )
    who = (
        '<table id="callers"><thead><tr><th>Caller</th><th>Policy</th><th>Tools seen</th></tr></thead>'
        f"<tbody>{callers}</tbody></table>"
        if callers
        else ""
    )
    return f"<h2>Access <small>{len(access['policies'])} policies</small></h2>{table}{who}"


def _chain_summary(record: AuditRecord) -> str:
    """Who answered; for a call that fell back, every step with its outcome."""
    if not record.chain:
        return '<span class="muted">—</span>'
    if len(record.chain) == 1:
        step = record.chain[0]
        variant = f" [{step.variant}]" if step.variant else ""
        return f'<span class="mono">{_e(step.provider + variant)}</span>'
    steps = []
    for step in record.chain:
        variant = f" [{step.variant}]" if step.variant else ""
        reason = f' title="{_e(_clip(step.reason, TEXT_LIMIT))}"' if step.reason else ""
        steps.append(f'<span class="mono"{reason}>{_e(step.provider + variant)}</span> {_badge(step.outcome)}')
    return " → ".join(steps)


def _calls_section(ledger: _LedgerData, now: float) -> str:
    title = f"<h2>Recent calls <small>last {RECENT_CALLS}, newest first</small></h2>"
    if ledger.problem is not None:
        return f'{title}<p class="note">{_e(ledger.problem)}</p>'
    if not ledger.calls:
        return f'{title}<p class="note">No calls recorded yet.</p>'
    rows = []
    for record in ledger.calls:
        client = " ".join(part for part in (record.client_name, record.client_version) if part)
        client_cell = _e(client) if client else '<span class="muted">—</span>'
        caller = f'<br><span class="muted">{_e(record.caller)}</span>' if record.caller else ""
        rows.append(
            f'<tr><td class="nowrap" title="{_e(_iso(record.ts))}">{_e(_iso(record.ts)[11:])}'
            f'<br><span class="muted">{_e(_ago(record.ts, now))}</span></td>'
            f"<td><code>{_e(record.tool)}</code></td><td>{_badge(record.status)}</td>"
            f"<td>{_chain_summary(record)}</td>"
            f'<td class="num">{_e(_ms(record.duration_ms))}</td>'
            f"<td>{client_cell}{caller}</td></tr>"
        )
    head = (
        '<tr><th>Time (UTC)</th><th>Tool</th><th>Status</th><th>Served by</th><th class="num">Duration</th>'
        "<th>Client</th></tr>"
    )
    return f'{title}<table id="calls"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'


def _stats_section(ledger: _LedgerData) -> str:
    title = "<h2>Tools <small>last 24 h</small></h2>"
    if ledger.problem is not None:
        return title + '<p class="note">No figures without the ledger.</p>'
    if not ledger.stats:
        return f'{title}<p class="note">No calls in the last 24 hours.</p>'
    rows = [
        f'<tr><td><code>{_e(row.tool)}</code></td><td class="num">{row.calls}</td>'
        f'<td class="num">{_e(_ms(row.p50_ms))}</td><td class="num">{_e(_ms(row.p95_ms))}</td>'
        f'<td class="num">{_e(_pct(row.error_rate))}</td><td class="num">{_e(_pct(row.degraded_rate))}</td></tr>'
        for row in ledger.stats
    ]
    head = (
        '<tr><th>Tool</th><th class="num">Calls</th><th class="num">p50</th><th class="num">p95</th>'
        '<th class="num">Errors</th><th class="num">Fallbacks</th></tr>'
    )
    return f'{title}<table id="stats"><thead>{head}</thead><tbody>{"".join(rows)}</tbody></table>'
