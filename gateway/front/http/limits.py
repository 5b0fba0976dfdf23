"""Per-caller limits at ``/mcp``: a request rate (token bucket) and concurrent tool calls, per caller.

``CallerLimits`` is pure ASGI middleware between the edge (``body.py``, which leaves each POST's JSON-RPC message in the
scope state) and the SDK. A caller's limits are the ``limits`` of the first of ``Federation.limit_policies`` that
matches it (``policies``, with the deprecated ``gateway.auth.caller_limits`` rewritten into them by the config loader),
read at every request so a reload applies; each caller gets its own bucket and its own in-flight count (one caller's
burst never spends another's share). Counted: every JSON-RPC request (not notifications, responses or GET streams)
against ``requests_per_s`` / ``burst``; every ``tools/call`` against ``concurrent_calls`` until both its POST and the
call have ended (``_Hold``: in the handshake era a call runs on in its session after its client walked away, so a client
that drops its connections is still held to its limit). Over a limit, the request is answered HTTP 429 with
``Retry-After`` and a JSON-RPC error (``LIMITED``) naming the limit, where it is written and when to retry, before the
SDK sees it; a refused ``tools/call`` leaves a ``refused`` ledger row (the arguments only hashed) and every refusal is
counted in ``/metrics`` (``mcp_gateway_caller_limited_total``, by the limits' label and the limit). The state is per
process (a replica keeps its own buckets); callers idle with a full bucket are forgotten once more than ``MAX_TRACKED``
are held. With ``gateway.shared.redis_url`` the request rate is counted in Redis instead, for all replicas at once
(shared.py); when Redis cannot answer, ``gateway.shared.redis_down`` says whether the request is counted here alone
(``open``) or refused with HTTP 503 (``closed``).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import anyio
import structlog
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from gateway.calls import CallContext, Caller, Upstream
from gateway.config import Policy, PolicyLimits
from gateway.core.policies import policy_for
from gateway.core.runtime import Gateway
from gateway.front.http.replies import reply, rpc_error
from gateway.front.http.shared import SharedRates
from gateway.front.scope import caller_of, message_of, session_digest, set_hold

__all__ = ["LIMITED", "CallerLimits"]

log = structlog.get_logger("gateway.quotas")

LIMITED = -32000
"""The JSON-RPC error code of a request refused by a caller limit (the implementation-defined server-error range;
MCP defines none for it). The HTTP status (429) and ``Retry-After`` say the same to HTTP-aware clients."""
MAX_TRACKED = 10_000
CONCURRENCY_RETRY_S = 1
"""What ``Retry-After`` says when a caller is at its concurrent calls: when one of them ends is not known."""
ADOPT_WAIT_S = 1.0
"""How long a POST that handed its call to a session (HTTP 200) waits, once it has ended, for that call's handler
to take its place (normally long done); past it the place is let go, and a handler that starts later takes a new
one."""


@dataclass
class _State:
    rule: PolicyLimits
    tokens: float
    stamp: float
    in_flight: int = 0

    def take(self, now: float) -> float:
        """Spend one token; 0.0 if there was one, else the seconds until there is."""
        rate = self.rule.requests_per_s
        if rate is None:
            return 0.0
        burst = _burst(self.rule)
        self.tokens = min(burst, self.tokens + (now - self.stamp) * rate)
        self.stamp = now
        if self.tokens >= 1.0:
            self.tokens -= 1.0
            return 0.0
        return (1.0 - self.tokens) / rate

    def idle(self, now: float) -> bool:
        rate = self.rule.requests_per_s
        full = rate is None or self.tokens + (now - self.stamp) * rate >= _burst(self.rule)
        return full and self.in_flight == 0


class _Hold:
    """One admitted ``tools/call``'s place in its caller's ``in_flight``, kept until both the POST that carried it
    (``post_ended``) and the handler that serves it (``held``) are done."""

    def __init__(self, state: _State) -> None:
        self._state = state
        self._holders = 1  # the POST
        self._counted = True
        self._adopted = anyio.Event()
        state.in_flight += 1

    @contextmanager
    def held(self) -> Iterator[None]:
        if not self._counted:  # the POST let go before the handler started: counted again while it runs
            self._state.in_flight += 1
            self._counted = True
        self._holders += 1
        self._adopted.set()
        try:
            yield
        finally:
            self._drop()

    async def post_ended(self, delivered: bool) -> None:
        """The POST is done; ``delivered``: the session took the call (HTTP 200), whose handler may not run yet."""
        try:
            if delivered and not self._adopted.is_set():
                with anyio.move_on_after(ADOPT_WAIT_S):
                    await self._adopted.wait()
        finally:
            self._drop()

    def _drop(self) -> None:
        self._holders -= 1
        if self._holders == 0 and self._counted:
            self._state.in_flight -= 1
            self._counted = False


def _burst(rule: PolicyLimits) -> float:
    return float(rule.burst if rule.burst is not None else math.ceil(rule.requests_per_s or 1.0))


class CallerLimits:
    """Pure ASGI middleware: each caller's request rate and concurrent tool calls, per its policy's ``limits``."""

    def __init__(
        self,
        app: ASGIApp,
        gateway: Gateway,
        policies: Callable[[], Mapping[str, Policy]],
        shared: SharedRates | None = None,
    ) -> None:
        self.app = app
        self.gateway = gateway
        self.policies = policies
        self.shared = shared
        self._callers: dict[str, _State] = {}

    async def _take(self, state: _State, caller: str, rule: PolicyLimits, now: float) -> float | None:
        """One token of the caller's rate: from Redis when shared, else (or when Redis is down and the
        configuration says ``open``) this replica's bucket; None: Redis is down and the configuration says
        ``closed``."""
        shared = self.shared
        if shared is None or rule.requests_per_s is None:
            return state.take(now)
        wait = await shared.take(caller, rule, _burst(rule))
        if wait is None:
            return state.take(now) if shared.fail_open else None
        return wait

    def _limits(self, caller: Caller) -> PolicyLimits | None:
        """The limits of the caller's policy (core/policies.py ``policy_for`` picks it); None: not limited."""
        policies = self.policies()
        policy = policies.get(policy_for(policies, caller))
        return policy.limits if policy is not None else None

    def _state(self, caller: str, rule: PolicyLimits, now: float) -> _State:
        state = self._callers.get(caller)
        if state is None or state.rule != rule:  # new, or its rule changed on a reload: a fresh bucket
            if len(self._callers) >= MAX_TRACKED:
                for name in [name for name, held in self._callers.items() if held.idle(now)]:
                    del self._callers[name]
            state = _State(rule, tokens=_burst(rule), stamp=now)  # calls in flight count on the old state
            self._callers[caller] = state
        return state

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        message = message_of(scope) if scope["type"] == "http" else None
        who = caller_of(scope)
        caller = who.name
        if message is None or "method" not in message or "id" not in message or not caller:
            await self.app(scope, receive, send)
            return
        rule = self._limits(who)
        if rule is None:
            await self.app(scope, receive, send)
            return
        where, rule_name = rule.written_at, rule.label
        now = time.monotonic()
        state = self._state(caller, rule, now)
        call = message.get("method") == "tools/call"
        wait = await self._take(state, caller, rule, now)
        if wait is None:
            text = (
                f"The request rate of caller {caller} cannot be counted: the shared limits' Redis "
                "(gateway.shared.redis_url) does not answer and gateway.shared.redis_down is closed; retry shortly."
            )
            await self._refuse(scope, send, message, who, rule_name, "shared", text, 1.0, call, status=503)
            return
        if wait > 0:
            text = (
                f"Too many requests for caller {caller}: the limit is {rule.requests_per_s:g} per second "
                f"(burst {_burst(rule):g}, {where}); retry in {wait:.1f} s."
            )
            await self._refuse(scope, send, message, who, rule_name, "rate", text, wait, call)
            return
        limit = rule.concurrent_calls
        if call and limit is not None:
            if state.in_flight >= limit:
                text = (
                    f"Too many concurrent tool calls for caller {caller}: {state.in_flight} in flight, the limit "
                    f"({where}.concurrent_calls); retry when one has ended."
                )
                await self._refuse(scope, send, message, who, rule_name, "concurrency", text, None, call)
                return
            hold = _Hold(state)
            set_hold(scope, hold)
            status = 0

            async def watched(reply: Message) -> None:
                nonlocal status
                if reply["type"] == "http.response.start":
                    status = reply["status"]
                await send(reply)

            try:
                await self.app(scope, receive, watched)
            finally:
                await hold.post_ended(status == 200)
            return
        await self.app(scope, receive, send)

    async def _refuse(
        self,
        scope: Scope,
        send: Send,
        message: dict[str, Any],
        caller: Caller,
        rule_name: str,
        limit: str,
        text: str,
        wait: float | None,
        call: bool,
        status: int = 429,
    ) -> None:
        retry = max(1, math.ceil(wait)) if wait is not None else CONCURRENCY_RETRY_S
        log.info("caller.limited", caller=caller.name, limit=limit, rule=rule_name, method=message.get("method"))
        self.gateway.metrics.observe_limited(rule_name, limit)
        if call:
            await self._record(scope, message, caller, text)
        error = rpc_error(message.get("id"), LIMITED, text, {"limit": limit, "retry_after_s": retry})
        await reply(send, status, error, [(b"retry-after", str(retry).encode())])

    async def _record(self, scope: Scope, message: dict[str, Any], caller: Caller, text: str) -> None:
        params = message.get("params")
        params = params if isinstance(params, dict) else {}
        arguments = params.get("arguments")
        name = params.get("name")
        session = dict(scope.get("headers", [])).get(b"mcp-session-id")
        ctx = CallContext(
            upstream=Upstream(caller=caller),
            session_id=session_digest(session.decode("latin-1")) if session else None,
        )
        await self.gateway.router.refuse(
            "tools/call",
            str(name) if name is not None else "",
            arguments if isinstance(arguments, dict) else {},
            ctx,
            "limited",
            text,
        )
