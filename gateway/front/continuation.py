"""The gateway's own ``requestState`` for multi-round-trip requests (MCP 2026-07-28, SEP-2322), sealed.

A downstream that needs input answers ``tools/call``, ``prompts/get`` or ``resources/read`` with an
``InputRequiredResult``: its input requests and, perhaps, its own opaque ``requestState``. The client answers the
requests and retries the same request with its input responses and the state it was given. The gateway keeps
nothing of this in memory: it hands the client, as the ``requestState``, a token that carries everything the retry
needs, so any gateway process that holds the key (another replica, the same one after a restart) routes the retry.

The token's claims: the method and the name the client asked for (a tool or prompt name, a resource URI, as
published), a digest of the arguments, the backend that asked and its own name for the thing, a digest of the
caller's identity (the bearer token's caller name), an expiry, and the downstream's own state, passed back to it
verbatim. They are sealed with the SDK's AES-256-GCM codec (``mcp.server.request_state``): encrypted, not only
signed, so a client can neither read the routing facts nor change them. A token that does not unseal, has expired,
was minted for another request, another caller or a backend the gateway no longer has, is refused exactly as the
SDK's ``RequestStateBoundary`` refuses one: JSON-RPC ``-32602`` "Invalid or expired requestState" with
``data.reason = "invalid_request_state"``; the real reason goes to the log only.

The key (``load_key``): the environment variable named by ``gateway.continuation.key_env`` (several, comma-separated,
for a rotation: the first seals, all open); else a random key kept
in a file beside the audit ledger (``<audit.path>.state-key``, created 0600 on first use, so a restart keeps it); else
(ledger off) a key of this process alone, said in one warning line at startup.
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn

import structlog
from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState
from mcp.shared.exceptions import MCPError
from mcp_types import INVALID_PARAMS

from gateway.auth.keys import load_key
from gateway.backends.base import Backend
from gateway.core.catalog import Catalog

__all__ = ["Continuation", "Continuations", "invalid_state", "load_key", "may_ask_mid_call"]

log = structlog.get_logger("gateway.continuation")

_VERSION = 1
_PRINCIPAL_LABEL = b"mcp-gateway/request-state/caller:"


@dataclass(frozen=True, slots=True)
class Continuation:
    """What a verified token says: where the retry goes, and the downstream's own state to hand back."""

    backend: str
    local: str
    """The backend's own name for the tool or prompt, or its URI for the resource."""
    state: str | None


def invalid_state(method: str, reason: str) -> NoReturn:
    """The spec's refusal (as the SDK's ``RequestStateBoundary`` words it); ``reason`` goes to the log only."""
    log.warning("request_state.refused", method=method, reason=reason)
    raise MCPError(
        code=INVALID_PARAMS, message="Invalid or expired requestState", data={"reason": "invalid_request_state"}
    )


def _digest(value: Any) -> str:
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))  # ASCII: a lone surrogate escapes
    return base64.urlsafe_b64encode(hashlib.sha256(text.encode()).digest()[:16]).decode().rstrip("=")


def _principal(caller: str | None) -> str | None:
    if caller is None:
        return None
    raw = hashlib.sha256(_PRINCIPAL_LABEL + caller.encode("utf-8", "surrogatepass")).digest()[:16]
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


class Continuations:
    """Seals and opens the gateway's ``requestState`` tokens under one key."""

    def __init__(self, keys: Sequence[bytes], ttl_s: float, *, clock: Callable[[], float] = time.time) -> None:
        self._codec = AESGCMRequestStateCodec(keys)  # keys[0] seals; every key opens (a rotation)
        self._ttl = ttl_s
        self._clock = clock

    def seal(
        self,
        *,
        method: str,
        name: str,
        arguments: Mapping[str, Any] | None,
        backend: str,
        local: str,
        caller: str | None,
        state: str | None,
    ) -> str:
        claims = {
            "v": _VERSION,
            "exp": self._clock() + self._ttl,
            "m": method,
            "n": name,
            "a": _digest(dict(arguments or {})),
            "b": backend,
            "l": local,
            "p": _principal(caller),
            "s": state,
        }
        return self._codec.seal(json.dumps(claims, separators=(",", ":")).encode())

    def open(
        self, token: object, *, method: str, name: str, arguments: Mapping[str, Any] | None, caller: str | None
    ) -> Continuation:
        """The claims of a token minted by ``seal`` for this very request and caller, unexpired.

        Raises:
            MCPError: -32602 "Invalid or expired requestState" (the reason is logged, never answered).
        """
        if not isinstance(token, str):
            invalid_state(method, "not a string")
        try:
            claims = json.loads(self._codec.unseal(token))
        except InvalidRequestState as exc:
            invalid_state(method, f"does not unseal ({exc})")
        except ValueError:
            invalid_state(method, "malformed claims")
        if not isinstance(claims, dict) or claims.get("v") != _VERSION:
            invalid_state(method, "malformed claims")
        expiry = claims.get("exp")
        if not isinstance(expiry, int | float) or not self._clock() < expiry:
            invalid_state(method, "expired")
        if claims.get("m") != method or claims.get("n") != name:
            invalid_state(method, "minted for another request")
        if claims.get("a") != _digest(dict(arguments or {})):
            invalid_state(method, "minted for other arguments")
        if claims.get("p") != _principal(caller):
            invalid_state(method, "minted for another caller")
        backend, local, state = claims.get("b"), claims.get("l"), claims.get("s")
        if not isinstance(backend, str) or not isinstance(local, str) or not isinstance(state, str | None):
            invalid_state(method, "malformed claims")
        return Continuation(backend, local, state)


def may_ask_mid_call(catalog: Catalog, backends: Mapping[str, Backend], name: str) -> bool:
    """Whether a call of the published tool ``name`` may reach a backend that asks its client for input mid-call,
    so that a stateless client's call must run bridged (its own task, able to wait for the client's retry). Any
    other call runs in the request's own task, without the bridge's cost."""
    entry = catalog.get(name)
    if entry is None:
        return False
    return any(
        (backend := backends.get(provider.backend)) is not None and backend.asks_mid_call
        for provider in entry.providers
    )
