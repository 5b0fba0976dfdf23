"""What the HTTP edge hands on about a request in its ASGI scope, the one way ASGI passes a request's values between
layers of middleware: who is calling (made once by the guard), the JSON-RPC message as the client sent it, the same
message as the body passed on holds it (parsed once, for the session transport) and what was withheld from its
arguments (the body check), a ``tools/call``'s place in its caller's concurrent calls (the limits), and how much its
connection holds unsent (the edge's connection, for an event stream to wait for a client that does not keep up). One
key and one typed accessor each, so nothing reads a scope by hand.

Session ids are bearer credentials: the log, the ledger and spans name a session by ``session_digest`` only.

One value also travels as a context variable: the caller of the request a task serves (``BindCaller``, read by
``request_caller``), for the one SDK callback that is given a name and no request (its ``Mcp-Param-*`` header check
asks a tool's input schema by name alone, front/face.py ``input_schema``), so it can answer as that caller's policy.
"""

from __future__ import annotations

import contextvars
import hashlib
from collections.abc import Callable, Mapping, MutableMapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from starlette.types import ASGIApp, Receive, Scope, Send

from gateway.calls import ANONYMOUS, Caller

__all__ = [
    "BindCaller",
    "CallHold",
    "caller_of",
    "hold_of",
    "message_of",
    "parsed_of",
    "request_caller",
    "session_digest",
    "set_caller",
    "set_hold",
    "set_message",
    "set_parsed",
    "set_unsent",
    "set_withheld",
    "unsent_of",
    "withheld_of",
]

_CALLER = "gateway.caller"
_MESSAGE = "gateway.message"
_PARSED = "gateway.parsed"
_WITHHELD = "gateway.withheld"
_HOLD = "gateway.hold"
_UNSENT = "gateway.unsent"


class CallHold(Protocol):
    """A ``tools/call``'s place in its caller's concurrent calls (front/http/limits.py), taken at the edge; the handler
    that serves the call holds it (``held``) until the call has ended, however long after its POST that is."""

    def held(self) -> AbstractContextManager[None]: ...


def _state(scope: MutableMapping[str, Any]) -> dict[str, Any]:
    state: dict[str, Any] = scope.setdefault("state", {})
    return state


def set_caller(scope: MutableMapping[str, Any], caller: Caller) -> None:
    _state(scope)[_CALLER] = caller


def caller_of(scope: Mapping[str, Any] | None) -> Caller:
    """The caller the guard attributed the request to; ``ANONYMOUS`` when there was none to attribute."""
    found = scope.get("state", {}).get(_CALLER) if scope is not None else None
    return found if isinstance(found, Caller) else ANONYMOUS


def set_message(scope: MutableMapping[str, Any], message: dict[str, Any]) -> None:
    _state(scope)[_MESSAGE] = message


def message_of(scope: Mapping[str, Any]) -> dict[str, Any] | None:
    """A POST's JSON-RPC message as sent (an object), when the body check could read one."""
    found = scope.get("state", {}).get(_MESSAGE)
    return found if isinstance(found, dict) else None


def set_parsed(scope: MutableMapping[str, Any], message: dict[str, Any]) -> None:
    _state(scope)[_PARSED] = message


def parsed_of(scope: Mapping[str, Any]) -> dict[str, Any] | None:
    """A POST's JSON-RPC message as the body passed on holds it (rewritten by the body check where it withheld
    something), parsed once at the edge for the session transport (front/http/transport.py)."""
    found = scope.get("state", {}).get(_PARSED)
    return found if isinstance(found, dict) else None


def set_withheld(scope: MutableMapping[str, Any], withheld: tuple[str, str]) -> None:
    _state(scope)[_WITHHELD] = withheld


def withheld_of(scope: Mapping[str, Any] | None) -> tuple[str, str] | None:
    """(argument path, reason): what the body check found in a ``tools/call``'s arguments and did not pass on."""
    found = scope.get("state", {}).get(_WITHHELD) if scope is not None else None
    return found if isinstance(found, tuple) else None


def set_hold(scope: MutableMapping[str, Any], hold: CallHold) -> None:
    _state(scope)[_HOLD] = hold


def hold_of(scope: Mapping[str, Any] | None) -> CallHold | None:
    """The place the caller's limits gave this ``tools/call`` (None: the caller has no concurrent-calls limit)."""
    return scope.get("state", {}).get(_HOLD) if scope is not None else None


def set_unsent(scope: MutableMapping[str, Any], unsent: Callable[[], int]) -> None:
    _state(scope)[_UNSENT] = unsent


def unsent_of(scope: Mapping[str, Any]) -> Callable[[], int] | None:
    """How to tell how many bytes of answers the request's connection holds unsent (front/http/connections.py; None:
    the request did not come through the edge)."""
    found = scope.get("state", {}).get(_UNSENT)
    return found if callable(found) else None


def session_digest(session_id: str | None) -> str | None:
    """What the log, the ledger and spans say instead of a session id: 12 hex digits of its SHA-256 (whoever has
    the id can compute it; nobody can use it)."""
    return hashlib.sha256(session_id.encode()).hexdigest()[:12] if session_id else None


_REQUEST_CALLER: contextvars.ContextVar[Caller] = contextvars.ContextVar("gateway_request_caller", default=ANONYMOUS)


def request_caller() -> Caller:
    """The caller of the HTTP request the current task serves (``BindCaller``); ``ANONYMOUS`` outside one."""
    return _REQUEST_CALLER.get()


class BindCaller:
    """Pure ASGI middleware: the request's caller (``caller_of``) is ``request_caller()`` while the app serves it."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        token = _REQUEST_CALLER.set(caller_of(scope))
        try:
            await self.app(scope, receive, send)
        finally:
            _REQUEST_CALLER.reset(token)
