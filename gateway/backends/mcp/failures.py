"""What went wrong with a downstream MCP session, as the gateway says it.

The translations live here, so nothing above ``backends/`` sees a foreign error. ``FOREIGN_ERRORS`` is the one table
from the errors a downstream session raises (the SDK's ``MCPError``, ``anyio``'s stream errors, ``OSError``,
``httpx2``) to the gateway's error tree (gateway/errors.py); ``gateway_error`` consults it (the entry nearest the
error's own class wins), and ``FOREIGN`` is the same table as a tuple for an ``except`` that only logs.
``map_call_errors`` applies it to one call, refining the SDK's codes (timeout, connection closed, answer too large)
and reading the gateway's own ``SATURATED`` answer (no connection came free, pool.py) as ``BackendSaturated``;
a failure that comes from losing the session carries that session's ``Life`` as its ``cause``, so the circuit
breaker counts a crash with eight calls in flight once. ``classify_failure`` says why a connection attempt or a
whole session failed, in plain words ("connection refused at ...", "the handshake answered HTTP 502 with an HTML
page"), from the exception, the process's exit and stderr, and the last error response (``ResponseRecorder``).
"""

from __future__ import annotations

import signal
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import TypeVar

import anyio
import httpx2
import mcp_types as types
from mcp.client.subscriptions import SubscriptionLost
from mcp.shared.exceptions import MCPError

from gateway.backends.mcp.answers import ANSWER_TOO_LARGE, answer_too_large
from gateway.backends.mcp.egress import REFUSED
from gateway.config import PACKAGE_RUNNERS, HttpServer, ServerConfig, SseServer, StdioServer
from gateway.errors import (
    BackendAnswerTooLarge,
    BackendError,
    BackendProtocolError,
    BackendRpcError,
    BackendSaturated,
    BackendTimeout,
    BackendUnavailable,
)

__all__ = [
    "FOREIGN",
    "FOREIGN_ERRORS",
    "OWN_ANSWER",
    "SATURATED",
    "Life",
    "ListTooLarge",
    "ResponseRecorder",
    "classify_failure",
    "exit_detail",
    "leaf_of",
    "lost_reason",
    "over_limits",
    "gateway_error",
    "map_call_errors",
]

FOREIGN_ERRORS: Mapping[type[Exception], type[BackendError]] = MappingProxyType(
    {
        MCPError: BackendRpcError,  # a JSON-RPC error answer (a call refines its codes: timeout, closed, too large)
        RuntimeError: BackendProtocolError,  # the SDK's word for an answer of the wrong shape
        SubscriptionLost: BackendUnavailable,  # a ``subscriptions/listen`` stream ended without the server's close
        TimeoutError: BackendTimeout,  # a bounded wait (``anyio.fail_after``) ran out
        OSError: BackendUnavailable,  # the process, its pipes or the socket went away
        anyio.BrokenResourceError: BackendUnavailable,  # the other end of a stream is gone
        anyio.ClosedResourceError: BackendUnavailable,  # the stream was closed under the request
        httpx2.HTTPError: BackendUnavailable,  # the HTTP transport failed (refused, reset, timed out, bad status)
    }
)
"""Every foreign error a downstream session may raise, and the gateway's error it stands for."""

SATURATED = -32050
"""The code of the gateway's own JSON-RPC error for a call no connection to its backend came for (pool.py); never a
downstream's, and read back as ``BackendSaturated``."""
OWN_ANSWER = "gateway.own_answer"
"""The extension that marks a response the gateway made itself (never the downstream's: not recorded)."""

FOREIGN: tuple[type[Exception], ...] = tuple(FOREIGN_ERRORS)
"""``FOREIGN_ERRORS``' keys, for ``except FOREIGN``."""


def gateway_error(exc: BaseException) -> type[BackendError] | None:
    """The gateway's error for ``exc`` (the table's entry nearest ``exc``'s own class), or None when it is not a
    downstream's error (a bug, which must not be translated into a backend's failure)."""
    for cls in type(exc).__mro__:
        mapped = FOREIGN_ERRORS.get(cls)
        if mapped is not None:
            return mapped
    return None


class ListTooLarge(Exception):
    """A downstream's list is over its server's ``max_tools`` or ``max_list_bytes`` (lists.py); the message is the
    reason in plain words."""


@dataclass(eq=False)
class Life:
    """One session's lifetime. ``lost`` is set once the session is gone, ``reason`` says first why; the object
    itself is the ``cause`` that the failures of the calls it took down share."""

    lost: anyio.Event = field(default_factory=anyio.Event)
    reason: str | None = None

    def mark_lost(self, reason: str) -> None:
        if self.reason is None:
            self.reason = reason
        self.lost.set()


@contextmanager
def map_call_errors(backend: str, timeout_s: float, life: Life) -> Iterator[None]:
    """Translate a call's foreign errors into BackendError, naming ``backend``.

    ``life`` is the session the call went out on: a failure that comes from losing it ends it (if it is not over
    already), says why it was lost, and carries it as its ``cause``. ``timeout_s`` is the call's time limit, named
    when it ran out. A -32001 before the limit ran out is not the gateway's timeout but the downstream's own answer
    (e.g. the echo of a request of its that its client never answered): a JSON-RPC error, not a failure.
    """
    started = anyio.current_time()
    try:
        yield
    except MCPError as exc:
        code = exc.error.code
        too_large = answer_too_large(exc.error.data) if code == ANSWER_TOO_LARGE else None
        if too_large is not None:
            raise BackendAnswerTooLarge(backend, *too_large) from exc
        if code == SATURATED:  # the gateway's own answer (pool.py): the downstream was never asked
            raise BackendSaturated(backend, exc.error.message) from exc
        if code == types.REQUEST_TIMEOUT and anyio.current_time() - started >= timeout_s:
            timeout = f"timed out after {timeout_s:g} s"
            if life.lost.is_set():  # the session went away meanwhile (e.g. its stdin stopped taking messages)
                raise BackendTimeout(backend, f"{timeout}: {life.reason}", cause=life) from exc
            raise BackendTimeout(backend, f"{timeout} (cancellation sent downstream)") from exc
        if code == types.CONNECTION_CLOSED:
            known = life.reason
            life.mark_lost("the connection closed during a call")
            why = f": {known}" if known is not None and known != "the connection closed" else " (server crashed?)"
            raise BackendUnavailable(backend, f"the connection closed during the call{why}", cause=life) from exc
        raise BackendRpcError(backend, code, exc.error.message, exc.error.data) from exc
    except FOREIGN as exc:
        error = gateway_error(exc) or BackendUnavailable
        if issubclass(error, BackendProtocolError):  # an answer of the wrong shape: the session is fine
            raise error(backend, str(exc)) from exc
        reason = f"transport error: {exc or type(exc).__name__}"
        life.mark_lost(reason)  # anything else lost the session the call went out on
        raise error(backend, reason, cause=life) from exc


class ResponseRecorder:
    """An httpx2 response hook keeping the last error response's status, content type and body head, and the
    ``WWW-Authenticate`` of the last 403 ``insufficient_scope`` (``challenge``: the server wants more scope)."""

    def __init__(self) -> None:
        self.status: int | None = None
        self.content_type: str = ""
        self.body_head: str = ""
        self.challenge: str | None = None

    def clear(self) -> None:
        self.status, self.content_type, self.body_head, self.challenge = None, "", "", None

    async def __call__(self, response: httpx2.Response) -> None:
        if response.status_code < 400 or response.extensions.get(OWN_ANSWER):
            return
        self.status = response.status_code
        self.content_type = response.headers.get("content-type", "")
        asked = response.headers.get("www-authenticate", "")
        if response.status_code == 403 and "insufficient_scope" in asked:
            self.challenge = asked
        try:
            body = await response.aread()
        except httpx2.HTTPError:
            body = b""
        self.body_head = body[:300].decode("utf-8", errors="replace")


def _http_reason(recorder: ResponseRecorder) -> str | None:
    status = recorder.status
    if status is None:
        return None
    if status in (401, 403):
        return f"the backend refused our credentials (HTTP {status}); check the server's `headers`"
    ctype = recorder.content_type.split(";")[0].strip() or "no content type"
    head = recorder.body_head.lstrip().lower()
    if "html" in ctype or head.startswith(("<!doctype html", "<html")):
        return f"the handshake answered HTTP {status} with an HTML page, not MCP (is the URL right?)"
    if status == 404:
        return f"the handshake answered HTTP 404 ({ctype}): no MCP endpoint at this URL"
    return f"the handshake answered HTTP {status} with a non-MCP body ({ctype})"


def _flatten(exc: BaseException) -> Iterator[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        for inner in exc.exceptions:
            yield from _flatten(inner)
    else:
        yield exc


_E = TypeVar("_E", bound=BaseException)


def leaf_of(exc: BaseException | None, kind: type[_E]) -> _E | None:
    """The first exception of type ``kind`` that ``exc`` is or groups (task groups wrap what ends them)."""
    return next((leaf for leaf in _flatten(exc) if isinstance(leaf, kind)), None) if exc is not None else None


def lost_reason(life: Life, detail: str, uptime: float, min_uptime_s: float) -> tuple[str, bool]:
    """Why a session that was ready ended, in plain words, and whether it was up less than ``min_uptime_s`` (then
    the reconnection backs off)."""
    reason = life.reason or "the connection closed"
    reason = f"{reason}; {detail}" if detail else reason
    if uptime >= min_uptime_s:
        return reason, False
    return (
        f"{reason} (it was up for {uptime:.1f} s, less than min_uptime_s of {min_uptime_s:g} s: reconnecting with "
        "backoff)",
        True,
    )


def over_limits(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an exception grouped in it) is a list over the server's limits."""
    return exc is not None and any(isinstance(leaf, ListTooLarge) for leaf in _flatten(exc))


def classify_failure(
    exc: BaseException,
    *,
    config: ServerConfig,
    stderr_tail: str = "",
    exit_code: int | None = None,
    http: ResponseRecorder | None = None,
    stray: str = "",
) -> str:
    """Describe why a connection attempt or a session failed, in plain words. A stdio server's handshake that timed
    out says what the server printed (``stderr_tail``, and ``stray``: its stdout lines that were not JSON-RPC) and
    what to check."""
    leaves = list(_flatten(exc))
    http_reason = _http_reason(http) if http is not None else None
    for leaf in leaves:
        if isinstance(leaf, ListTooLarge):
            return str(leaf)
        if isinstance(leaf, TimeoutError):
            timed_out = (
                f"handshake timed out after {config.connect_timeout_s:g} s (the server did not answer initialize)"
            )
            if isinstance(config, StdioServer):
                return f"{timed_out}; {_printed(stderr_tail, stray)}. Check: {_what_to_check(config)}"
            return timed_out
        if isinstance(leaf, FileNotFoundError) and isinstance(config, StdioServer):
            return f"command not found: {config.command}"
        if isinstance(leaf, PermissionError) and isinstance(config, StdioServer):
            return f"command is not executable: {config.command}"
        if isinstance(leaf, httpx2.ConnectError):
            if str(leaf).startswith(REFUSED):  # an address the gateway will not connect to (egress.py)
                return str(leaf)
            url = config.url if isinstance(config, HttpServer | SseServer) else ""
            return f"connection refused at {url}"
        if isinstance(leaf, httpx2.HTTPStatusError):
            status = leaf.response.status_code
            if status in (401, 403):
                return f"the backend refused our credentials (HTTP {status}); check the server's `headers`"
            return http_reason or f"the handshake answered HTTP {status}"
        if isinstance(leaf, httpx2.TimeoutException):
            return "the HTTP request timed out"
        if isinstance(leaf, httpx2.HTTPError):
            return http_reason or f"HTTP transport error: {leaf}"
        text = str(leaf)
        if "protocol version" in text.lower():
            return f"unsupported protocol version: {text}"
    if http_reason is not None:
        return http_reason
    if isinstance(config, StdioServer):
        return exit_detail(exit_code, stderr_tail)
    leaf = leaves[0] if leaves else exc
    return f"{type(leaf).__name__}: {leaf}" if str(leaf) else f"connection failed ({type(leaf).__name__})"


def _printed(stderr_tail: str, stray: str) -> str:
    said = [f"its stderr: {stderr_tail}" if stderr_tail else "it wrote nothing on stderr"]
    if stray:
        said.append(f"on stdout, not JSON-RPC: {stray}")
    return "; ".join(said)


def _what_to_check(config: StdioServer) -> str:
    """Where to look when a stdio server does not answer its handshake in time."""
    line = " ".join([config.command, *config.args])
    runner = config.command.rsplit("/", 1)[-1]
    if runner in PACKAGE_RUNNERS:
        return (
            f"{runner} fetches the server when it is not cached yet: run `{line}` once from a shell (it then starts "
            f"from the cache) or raise connect_timeout_s; the gateway passes it only pass_env (PATH, HOME, the proxy "
            "and CA variables HTTP(S)_PROXY, NO_PROXY, NODE_EXTRA_CA_CERTS, SSL_CERT_FILE, npm_config_*, PIP_*, ...) "
            "and env: add any other variable it needs to pass_env"
        )
    return (
        f"that `{line}` answers initialize on stdout when started from a shell with only pass_env (PATH, HOME, the "
        "proxy and CA variables) and env; add any other variable it needs to pass_env"
    )


def exit_detail(exit_code: int | None, stderr_tail: str) -> str:
    tail = f": {stderr_tail}" if stderr_tail else " (nothing on stderr)"
    if exit_code is None:
        return f"the process closed its output{tail}"
    if exit_code < 0:
        try:
            name = signal.Signals(-exit_code).name
        except ValueError:
            name = f"signal {-exit_code}"
        return f"process was killed by {name}{tail}"
    return f"process exited with code {exit_code}{tail}"
