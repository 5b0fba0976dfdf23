"""One ``tools/call``, start to finish: route -> provider -> ladder -> audit -> result. The single error policy.

The policy, in one place:
  * an unknown tool raises ``ToolNotFound`` (the server turns it into a JSON-RPC error, not a tool result); so does a
    tool outside the caller's policy (``CallContext.visible``), with a ``refused`` row naming it;
  * arguments the gateway will not pass on (a lone surrogate, nesting beyond ``gateway.edge.max_argument_depth``;
    see inputs.py, and edge.py, which finds them before the SDK parses a body) raise ``InvalidArguments``: a
    JSON-RPC invalid-params error naming the argument; no backend is asked;
  * an exception nobody expected, raised while serving the call, ends that call alone: an ``isError`` answer
    (status ``internal_error``), logged once with its traceback; the backend and every other call carry on;
  * a provider's answer, including ``isError``, passes through untouched (the gateway only adds its ``_meta`` entry);
  * bad arguments (``InvalidArguments``) are the caller's to fix: an ``isError`` answer naming the argument, no
    fallback;
  * a provider failure (``BackendError``: crash, timeout, transport error, disabled, thin answer) moves to the next
    rung of the provider's ladder, then to the next provider of the route; when every step failed the answer is
    ``isError`` naming each backend and its cause — except a lone provider's JSON-RPC error, which passes through
    as that error;
  * when the gateway stops (``abort``, after its drain deadline), a call still in progress is cancelled (its
    backend's work with it) and answered ``isError`` with the reason; so is a call that arrives later. Its status
    is ``cancelled``;
  * every call has one deadline, ``gateway.call_budget``, shared by its steps (gateway/budget.py): a step that is not
    the last one left to try is cut in time for the floor to answer; a step left no time is skipped (``timeout``);
  * a route that declares a result shape (``result: {shape: search_hits}``) gets its answer brought to that shape,
    whichever provider gave it (gateway/results.py), before the ``_meta`` entry is added;
  * every call leaves one audit row, written before the answer is returned, and one canonical log line; both carry
    the correlation id and the chain of steps, which the answer's ``_meta`` carries too. Degradation is never hidden.
    Unknown tools (``unknown_tool``) and refused arguments (``invalid_params``) leave theirs too; a cancelled call's
    chain ends with the step that was under way (outcome ``cancelled``). A request that waits for the gateway's
    startup before it is routed (``wait_started``) and ends there leaves its row too (one ``gateway`` step).

Multi-round-trip calls (MCP 2026-07-28, SEP-2322): a provider that answers with an input-required result ends the
round: its step's outcome and the row's status are ``input_required``, no later rung or provider is tried, and
``InputRequired`` goes up to the server, which seals where the retry must go into the ``requestState``
(gateway/continuation.py). The retry comes back through ``resume``: one step on the backend that asked, whatever the
catalog says now, with its own row (one row per round). A handshake-era downstream that asks a stateless client
for input mid-call (bridged by the server, gateway/server.py) leaves one ``input_required`` row per question
(``note_round``), and the call its own row when it ends.

Every other request that reaches a backend goes through here too (``request``): ``resources/read``, ``prompts/get``,
``completion/complete``, ``resources/subscribe`` and ``unsubscribe``. It is sent to the first of its origins (the
backends that own the name or URI, listings.py) that answers, each a step under that backend's circuit breaker; it
leaves one audit row whose ``kind`` is its method, one log line (``request.served``), one count in metrics
(``GatewayMetrics.observe_request``) and a span; a failure that is not the backend's answer counts against the
breaker, as a tool call's does. What the client is answered when no backend answered is the server's to say.

Observability, all of it keyed by the correlation id made here: ``correlation_id`` and ``tool`` are bound in
structlog's contextvars for the whole call and ``provider`` for each step, so every log line written while the call
runs (the router's, a backend's) carries them; the step reasons that go into the log, the ledger and ``_meta`` are
scrubbed of registered secrets first; with ``metrics`` the call is counted once (``GatewayMetrics.observe_call``),
and with ``tracer`` it gets a span, as does each step. Without them the router makes no metrics or tracing call.
"""

from __future__ import annotations

import re
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

import anyio
import mcp_types as types
import structlog

from gateway.backends.base import Backend, BackendState, ProgressFn
from gateway.backends.mcp.relay import UPSTREAM, Upstream
from gateway.config import CallBudget, EdgeSettings
from gateway.core.breakers import Breakers
from gateway.core.budget import CallDeadline
from gateway.core.catalog import Catalog, CatalogEntry, Provider
from gateway.core.gate import ClientPolicy, Declared
from gateway.core.listings import Origin
from gateway.core.results import shape_result
from gateway.errors import (
    ECHO_CHARS,
    BackendError,
    BackendRpcError,
    BackendUnavailable,
    InputRequired,
    InvalidArguments,
    ToolNotFound,
    quote,
)
from gateway.inputs import MAX_DEPTH, argument_problem
from gateway.ledger.sqlite import AuditRecord, AuditStep, arg_previews, args_hash
from gateway.observe.logs import redactor
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import CallTracer

__all__ = ["META_KEY", "CallContext", "Router", "Unanswered"]

log = structlog.get_logger("gateway.call")

META_KEY = "mcp-gateway/call"
"""The key of the gateway's entry in a result's ``_meta``: correlation id, who served the call, and the chain."""


class Recorder(Protocol):
    async def record(self, rec: AuditRecord) -> None: ...


class Startup(Protocol):
    """The gateway's startup wait (runtime.py): ``started`` once it is over."""

    started: bool

    async def wait_started(self) -> None: ...


@dataclass(frozen=True, slots=True)
class CallContext:
    """Who is calling: carried into the audit row and the log line."""

    session_id: str | None = None
    client_name: str | None = None
    client_version: str | None = None
    caller: str | None = None
    upstream: Upstream | None = None
    """The client's request itself, passed once: the router makes it the ``UPSTREAM`` of the backend work the call
    causes (backends/relay.py: a downstream's sampling, elicitation, roots and log messages reach its client), and
    its ``_meta`` (W3C ``traceparent``/``tracestate``) is the parent of the call's span when tracing."""
    trace_carrier: Mapping[str, Any] | None = None
    """A parent for the call's span when there is no ``upstream`` request (a caller of the router in process)."""
    declared: Declared = Declared(None, "unknown")
    """The client's declared context window (clients.py); large-context-only tools are refused below the gate."""
    withheld: tuple[str, str] | None = None
    """(argument path, reason): what the transport's edge found in the arguments and did not pass on (edge.py)."""
    visible: frozenset[str] | None = None
    """The tools the caller's policy lets it call (gateway/auth/policies.py); None: every tool."""


T = TypeVar("T")


class Unanswered(Exception):
    """No backend answered a request (``Router.request``). ``failures`` are the backends' failures in the order
    they were asked (a skipped open circuit is a ``BackendUnavailable``); empty when none of the origins' backends
    serves requests."""

    def __init__(self, failures: Sequence[BackendError]) -> None:
        super().__init__("; ".join(str(f) for f in failures) or "no backend serves this request")
        self.failures = tuple(failures)


class _Exhausted(Exception):
    """Every step failed; ``last`` is the final failure."""

    def __init__(self, last: BackendError | None) -> None:
        self.last = last


class Router:
    def __init__(
        self,
        catalog: Callable[[], Catalog],
        backends: Callable[[], Mapping[str, Backend]],
        recorder: Recorder | None = None,
        clients: ClientPolicy | None = None,
        *,
        metrics: GatewayMetrics | None = None,
        tracer: CallTracer | None = None,
        breakers: Breakers | None = None,
        budget: Callable[[], CallBudget] | None = None,
        edge: Callable[[], EdgeSettings] | None = None,
        startup: Startup | None = None,
    ) -> None:
        self._catalog = catalog
        self._startup = startup
        self._budget = budget or CallBudget
        self._backends = backends
        self._recorder = recorder
        self._clients = clients
        self._metrics = metrics
        self._tracer = tracer
        self.breakers = breakers if breakers is not None else Breakers()
        self._edge = edge
        self._inflight: dict[int, int] = {}  # id(backend) -> calls in progress on it (a reload drains by this)
        self._idle: dict[int, anyio.Event] = {}
        self._calls: set[anyio.CancelScope] = set()  # every call being served: the shutdown cancels them
        self._no_calls: anyio.Event | None = None
        self._closing: str | None = None

    def use_instruments(self, recorder: Recorder | None, tracer: CallTracer | None) -> None:
        """Record to ``recorder`` and trace with ``tracer`` from now on (the gateway opens them when it runs)."""
        self._recorder = recorder
        self._tracer = tracer

    def use_clients(self, clients: ClientPolicy | None) -> None:
        """Swap the context gate's rules (on reload)."""
        self._clients = clients

    def _max_depth(self) -> int:
        return self._edge().max_argument_depth if self._edge is not None else MAX_DEPTH

    def inflight(self, backend: Backend) -> int:
        return self._inflight.get(id(backend), 0)

    async def wait_idle(self, backend: Backend) -> None:
        """Return once no call is in progress on ``backend`` (bound it with a deadline)."""
        while self._inflight.get(id(backend), 0):
            await self._idle.setdefault(id(backend), anyio.Event()).wait()

    def calls_in_progress(self) -> int:
        return len(self._calls)

    async def wait_no_calls(self) -> None:
        """Return once no call is being served (bound it with a deadline)."""
        while self._calls:
            if self._no_calls is None:
                self._no_calls = anyio.Event()
            await self._no_calls.wait()

    def abort(self, reason: str) -> None:
        """The gateway is stopping: every call in progress, and every later one, is answered with an error that
        gives ``reason`` (status ``cancelled``, its row written) instead of being served."""
        self._closing = reason
        for scope in list(self._calls):
            scope.cancel()

    async def wait_started(
        self,
        method: str,
        name: str,
        *,
        arguments: Mapping[str, Any] | None = None,
        ctx: CallContext = CallContext(),
    ) -> None:
        """Wait, bounded, for the gateway's startup before a request of kind ``method`` is routed (``call`` or
        ``request`` next): one that races startup would find too little (a tool not known yet, a provider about to be
        ready). At once when startup is over.

        A request accepted is a request audited, even when it ends here, before any backend: cancelled while it
        waits (the client cancelled or left), it leaves one row of kind ``method``, status ``cancelled``, whose one
        ``gateway`` step says it was waiting for startup; failing here, one of status ``internal_error``. Either way
        the exception goes on. The gateway stopping (``abort``) ends the wait: ``call`` or ``request`` then answers
        the request as cancelled, with its row.
        """
        if self._startup is None or self._startup.started or self._closing is not None:
            return  # (stopping: ``call`` or ``request`` answers it as cancelled at once)
        correlation_id = uuid.uuid4().hex[:16]
        started = time.perf_counter()
        label = _ledger_name(redactor.scrub(name))

        async def finish(outcome: str, reason: str) -> None:
            step = AuditStep("gateway", None, outcome, reason, _ms(started))
            await self._finish(
                label,
                {},
                dict(arguments or {}),
                ctx,
                correlation_id,
                started,
                [step],
                outcome,
                None,
                kind=method,
                measured=False,
            )

        with structlog.contextvars.bound_contextvars(correlation_id=correlation_id, method=method):
            log.info("request.waiting_for_startup")
            try:
                with self._abortable_scope():
                    await self._startup.wait_started()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    await finish("cancelled", "cancelled while waiting for backends still starting")
                raise
            except Exception as exc:
                await finish("internal_error", f"{type(exc).__name__} while waiting for backends still starting")
                raise

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        ctx: CallContext = CallContext(),
        progress: ProgressFn | None = None,
    ) -> types.CallToolResult:
        """Serve one tools/call. Whatever happens, the call leaves exactly one audit row and one log line.

        Raises:
            ToolNotFound: no published tool has this name (row status ``unknown_tool``).
            InvalidArguments: the arguments hold what the gateway will not pass on, a lone surrogate or nesting
                beyond ``gateway.edge.max_argument_depth`` (row status ``invalid_params``); no backend is asked.
            BackendRpcError: the lone provider answered with a JSON-RPC error (passed through by the server).
        """
        correlation_id = uuid.uuid4().hex[:16]
        started = time.perf_counter()
        entry = self._catalog().get(name)
        if entry is None:
            if self._metrics is not None:
                self._metrics.observe_unknown_tool()
            with structlog.contextvars.bound_contextvars(correlation_id=correlation_id, tool=quote(name)):
                await self._finish(_ledger_name(name), {}, {}, ctx, correlation_id, started, [], "unknown_tool", None)
            raise ToolNotFound(name)
        arguments = dict(arguments or {})
        steps: list[AuditStep] = []
        underway: list[tuple[str, str | None, float]] = []  # the attempt in progress (named if cancelled)
        status = "error"
        result: types.CallToolResult | None = None
        with (
            structlog.contextvars.bound_contextvars(correlation_id=correlation_id, tool=name),
            self._call_span(name, correlation_id, ctx),
            _upstream(ctx),
        ):
            if ctx.visible is not None and name not in ctx.visible:  # answered as an unknown tool: no existence leak
                step = AuditStep("gateway", None, "refused", "not in the caller's policy", 0.0)
                await self._finish(entry.name, {}, arguments, ctx, correlation_id, started, [step], "refused", None)
                raise ToolNotFound(name)
            invalid = ctx.withheld or argument_problem(arguments, self._max_depth())
            if invalid is not None:
                refusal = InvalidArguments(name, *invalid)
                step = AuditStep("gateway", None, "invalid_params", refusal.message, 0.0)
                await self._finish(
                    entry.name, entry.audit, {}, ctx, correlation_id, started, [step], "invalid_params", None
                )
                raise refusal
            try:
                refusal_result = self._gate(name, ctx)
                if refusal_result is not None:
                    result, status = refusal_result, "refused"
                else:
                    served = await self._abortable(entry, arguments, steps, progress, underway)
                    if served is None:  # cut short by the shutdown: the step under way is named in the chain
                        for label, variant, t0 in underway:
                            steps.append(AuditStep(label, variant, "cancelled", self._closing or "", _ms(t0)))
                    result, status = served or (_closing_result(name, self._closing or ""), "cancelled")
                    result = shape_result(entry.result, result, steps)  # the route's declared shape, if any
            except _Exhausted as exc:
                status = "timeout" if exc.last is not None and exc.last.outcome == "timeout" else "error"
                if exc.last is not None and len(steps) == 1 and isinstance(exc.last, BackendRpcError):
                    await self._finish(
                        entry.name, entry.audit, arguments, ctx, correlation_id, started, steps, status, None
                    )
                    raise exc.last from None
                result = _failure_result(name, steps)
            except InputRequired:  # the round ends asking the client for input: not a failure, no fallback
                for label, variant, t0 in underway:
                    steps.append(AuditStep(label, variant, "input_required", None, _ms(t0)))
                await self._finish(
                    entry.name, entry.audit, arguments, ctx, correlation_id, started, steps, "input_required", None
                )
                raise
            except anyio.get_cancelled_exc_class():
                for label, variant, t0 in underway:
                    steps.append(AuditStep(label, variant, "cancelled", "cancelled while under way", _ms(t0)))
                with anyio.CancelScope(shield=True):
                    await self._finish(
                        entry.name, entry.audit, arguments, ctx, correlation_id, started, steps, "cancelled", None
                    )
                raise
            except Exception as exc:  # the per-call boundary: a fault of the gateway's ends this call alone
                log.exception("tool.internal_error", error=type(exc).__name__)
                for label, variant, t0 in underway:
                    steps.append(AuditStep(label, variant, "internal_error", type(exc).__name__, _ms(t0)))
                status = "internal_error"
                text = (
                    f"Tool {quote(name)} failed: the gateway hit an unexpected error ({type(exc).__name__}) while "
                    "serving this call; other calls are not affected."
                )
                result = types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)
            result = _with_meta(result, correlation_id, steps, status)
            await self._finish(entry.name, entry.audit, arguments, ctx, correlation_id, started, steps, status, result)
            return result

    async def resume(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        backend_name: str,
        tool: str,
        ctx: CallContext = CallContext(),
        progress: ProgressFn | None = None,
    ) -> types.CallToolResult:
        """Serve a later round of a multi-round-trip ``tools/call``: straight to ``backend_name``'s ``tool`` (the
        backend that asked, as the sealed state says), one step under the call budget, one row. The caller sets the
        round's input responses and state (backends/mcp.py ``ROUND``). The published ``name`` need not be in the
        catalog any more; when it still is, with this provider, the provider's argument template applies. Counted
        as in flight on the backend (a reload drains it) and cut by the shutdown like any call.

        Raises:
            InputRequired: the backend asks for more input (row status ``input_required``).
            BackendRpcError: the backend answered with a JSON-RPC error (passed through by the server).
            ToolNotFound: the backend is gone.
        """
        correlation_id = uuid.uuid4().hex[:16]
        started = time.perf_counter()
        entry = self._catalog().get(name)
        audit = entry.audit if entry is not None else {}
        backend = self._backends().get(backend_name)
        if backend is None:
            raise ToolNotFound(name)
        if ctx.visible is not None and name not in ctx.visible:  # the policy changed since the first round
            step = AuditStep("gateway", None, "refused", "not in the caller's policy", 0.0)
            await self._finish(_ledger_name(name), {}, {}, ctx, correlation_id, started, [step], "refused", None)
            raise ToolNotFound(name)
        listed = entry.providers if entry is not None else ()
        provider = next(
            (p for p in listed if (p.backend, p.tool) == (backend_name, tool)), Provider(backend_name, tool)
        )
        arguments = dict(arguments or {})
        provider_args = provider.map_arguments(arguments)
        steps: list[AuditStep] = []
        status = "error"
        result: types.CallToolResult | None = None
        with (
            structlog.contextvars.bound_contextvars(correlation_id=correlation_id, tool=name),
            self._call_span(name, correlation_id, ctx),
            _upstream(ctx),
        ):
            t0 = time.perf_counter()
            try:
                outcome = await self._resumable(name, backend, provider, provider_args, progress)
            except InputRequired:
                steps.append(AuditStep(provider.label, None, "input_required", None, _ms(t0)))
                await self._finish(name, audit, arguments, ctx, correlation_id, started, steps, "input_required", None)
                raise
            except anyio.get_cancelled_exc_class():
                steps.append(AuditStep(provider.label, None, "cancelled", "cancelled while under way", _ms(t0)))
                with anyio.CancelScope(shield=True):
                    await self._finish(name, audit, arguments, ctx, correlation_id, started, steps, "cancelled", None)
                raise
            if outcome is None:  # cut short by the shutdown
                steps.append(AuditStep(provider.label, None, "cancelled", self._closing or "", _ms(t0)))
                result, status = _closing_result(name, self._closing or ""), "cancelled"
            else:
                step, answer, failure = outcome
                steps.append(step)
                if failure is None and answer is not None:
                    result, status = (
                        answer,
                        "refused" if step.outcome == "refused" else ("error" if answer.is_error else "ok"),
                    )
                else:
                    status = "timeout" if failure is not None and failure.outcome == "timeout" else "error"
                    if isinstance(failure, BackendRpcError):
                        await self._finish(name, audit, arguments, ctx, correlation_id, started, steps, status, None)
                        raise failure
                    result = _failure_result(name, steps)
            result = _with_meta(result, correlation_id, steps, status)
            await self._finish(name, audit, arguments, ctx, correlation_id, started, steps, status, result)
            return result

    async def note_round(
        self, name: str, arguments: Mapping[str, Any] | None, *, backend: str, method: str, ctx: CallContext
    ) -> None:
        """One row for a round of a bridged call (gateway/server.py ``bridged``): ``backend``, a handshake-era
        downstream, asked for input (``method``) mid-call and the stateless client was handed an input-required
        result. The call's own row follows when it ends, as for every call."""
        correlation_id = uuid.uuid4().hex[:16]
        entry = self._catalog().get(name)
        audit = entry.audit if entry is not None else {}
        step = AuditStep(backend, None, "input_required", method, 0.0)
        with (
            structlog.contextvars.bound_contextvars(correlation_id=correlation_id, tool=name),
            self._call_span(name, correlation_id, ctx),
        ):
            await self._finish(
                name,
                audit,
                dict(arguments or {}),
                ctx,
                correlation_id,
                time.perf_counter(),
                [step],
                "input_required",
                None,
            )

    async def request(
        self,
        method: str,
        name: str,
        origins: Sequence[Origin],
        send: Callable[[Backend, Origin], Awaitable[T]],
        *,
        arguments: Mapping[str, Any] | None = None,
        ctx: CallContext = CallContext(),
    ) -> tuple[Origin, T]:
        """Serve one request that is not a ``tools/call``: ``send`` it to the first of ``origins`` whose backend
        answers, and return that origin with the answer.

        Each origin is a step: skipped when its backend serves no requests (it is no downstream MCP session) or its
        circuit is open (``circuit_open``); a failure moves on to the next origin and, unless the backend answered
        (a JSON-RPC error), counts against its breaker. Counted as in flight on the backend (a reload drains it) and
        cut by the shutdown like a call. One audit row of kind ``method`` names ``name`` (cut to ``ECHO_CHARS``,
        scrubbed of registered secrets) and keeps only the hash of ``arguments``.

        Raises:
            Unanswered: no origin answered; its ``failures`` say why (row status ``timeout`` when the last one timed
                out, else ``error``; ``cancelled`` when the gateway stopped).
            InputRequired: the backend asked for input (row status ``input_required``); not a failure.
        """
        correlation_id = uuid.uuid4().hex[:16]
        started = time.perf_counter()
        label = _ledger_name(redactor.scrub(name))
        arguments = dict(arguments or {})
        backends = self._backends()
        steps: list[AuditStep] = []
        failures: list[BackendError] = []
        underway: list[tuple[str, float]] = []
        status = "error"

        async def finish(final: str) -> None:
            await self._finish(label, {}, arguments, ctx, correlation_id, started, steps, final, None, kind=method)

        with (
            structlog.contextvars.bound_contextvars(correlation_id=correlation_id, method=method),
            self._call_span(label, correlation_id, ctx, method),
            _upstream(ctx),
        ):
            try:
                if self._closing is None:
                    with self._abortable_scope():
                        for origin in origins:
                            backend = backends.get(origin.backend)
                            if backend is None or not backend.serves_requests:
                                continue
                            breaker = self.breakers.of(backend)
                            admission = breaker.allow()
                            if not admission:
                                steps.append(AuditStep(backend.name, None, "circuit_open", breaker.reason(), 0.0))
                                failures.append(BackendUnavailable(backend.name, breaker.reason()))
                                continue
                            underway.append((backend.name, time.perf_counter()))
                            with admission:
                                step, answer, failure = await self._ask(backend, origin, send)
                            underway.pop()
                            steps.append(step)
                            if failure is None or failure.answered:
                                breaker.success()
                            else:
                                breaker.failure(step.reason or failure.outcome, cause=failure.cause)
                            if failure is not None:
                                failures.append(failure)
                                continue
                            await finish("ok")
                            return origin, answer  # type: ignore[return-value]
                if self._closing is not None:  # cut short by the shutdown (or it had begun)
                    for provider, t0 in underway:
                        steps.append(AuditStep(provider, None, "cancelled", self._closing, _ms(t0)))
                    failures.append(BackendUnavailable(underway[0][0] if underway else "gateway", self._closing))
                    status = "cancelled"
                elif failures and failures[-1].outcome == "timeout":
                    status = "timeout"
            except InputRequired:
                for provider, t0 in underway:
                    steps.append(AuditStep(provider, None, "input_required", None, _ms(t0)))
                await finish("input_required")
                raise
            except anyio.get_cancelled_exc_class():
                for provider, t0 in underway:
                    steps.append(AuditStep(provider, None, "cancelled", "cancelled while under way", _ms(t0)))
                with anyio.CancelScope(shield=True):
                    await finish("cancelled")
                raise
            except Exception as exc:  # a fault of the gateway's: its row, then the server's per-request boundary
                for provider, t0 in underway:
                    steps.append(AuditStep(provider, None, "internal_error", type(exc).__name__, _ms(t0)))
                await finish("internal_error")
                raise
            await finish(status)
            raise Unanswered(failures)

    async def _ask(
        self, backend: Backend, origin: Origin, send: Callable[[Backend, Origin], Awaitable[T]]
    ) -> tuple[AuditStep, T | None, BackendError | None]:
        """One step of ``request``: its step (reason scrubbed of secrets), and its answer or its failure."""
        span = self._tracer.step(backend.name, None) if self._tracer is not None else nullcontext(None)
        with structlog.contextvars.bound_contextvars(provider=backend.name), span as current, self._busy(backend):
            t0 = time.perf_counter()
            outcome: tuple[AuditStep, T | None, BackendError | None]
            try:
                answer = await send(backend, origin)
            except BackendError as exc:
                step = AuditStep(backend.name, None, exc.outcome, redactor.scrub(exc.reason), _ms(t0))
                outcome = (step, None, exc)
            else:
                outcome = (AuditStep(backend.name, None, "ok", None, _ms(t0)), answer, None)
            if current is not None:
                CallTracer.end_step(current, outcome[0])
            return outcome

    @contextmanager
    def _busy(self, backend: Backend) -> Iterator[None]:
        """Count a call or request as in flight on ``backend`` while the block runs (a reload drains by this)."""
        key = id(backend)
        self._inflight[key] = self._inflight.get(key, 0) + 1
        try:
            yield
        finally:
            remaining = self._inflight[key] = self._inflight[key] - 1
            if not remaining:
                del self._inflight[key]
                idle = self._idle.pop(key, None)
                if idle is not None:
                    idle.set()

    async def _resumable(
        self,
        name: str,
        backend: Backend,
        provider: Provider,
        arguments: dict[str, Any],
        progress: ProgressFn | None,
    ) -> tuple[AuditStep, types.CallToolResult | None, BackendError | None] | None:
        """One ``_attempt`` in a scope ``abort()`` can cancel; None when it did."""
        if self._closing is not None:
            return None
        with self._abortable_scope():
            deadline = CallDeadline(self._budget())
            return await self._attempt(name, backend, provider, arguments, None, progress, deadline, True)
        return None

    def _call_span(
        self, name: str, correlation_id: str, ctx: CallContext, method: str = "tools/call"
    ) -> AbstractContextManager[object]:
        if self._tracer is None:
            return nullcontext()
        return self._tracer.call(
            name,
            correlation_id,
            caller=ctx.caller,
            client_name=ctx.client_name,
            session_id=ctx.session_id,
            carrier=ctx.trace_carrier if ctx.upstream is None else ctx.upstream.meta,
            method=method,
        )

    def _gate(self, name: str, ctx: CallContext) -> types.CallToolResult | None:
        """An isError refusal when a large-context-only tool is called by a client below the gate, else None."""
        clients = self._clients
        if clients is None or name not in clients.gated or clients.is_large(ctx.declared):
            return None
        return types.CallToolResult(
            content=[types.TextContent(text=clients.refusal(name, ctx.declared))], is_error=True
        )

    async def _abortable(
        self,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        steps: list[AuditStep],
        progress: ProgressFn | None,
        underway: list[tuple[str, str | None, float]],
    ) -> tuple[types.CallToolResult, str] | None:
        """``_serve`` in a scope ``abort()`` can cancel; None when it did (the backend's call was cancelled, so a
        command-line program's processes are killed before this returns)."""
        if self._closing is not None:
            return None
        with self._abortable_scope():
            return await self._serve(entry, arguments, steps, progress, underway)
        return None

    @contextmanager
    def _abortable_scope(self) -> Iterator[anyio.CancelScope]:
        """A scope ``abort()`` cancels (the cancellation ends inside it: the caller's code after it runs); while it
        is open the call counts as in progress, and the last one to close wakes a drain waiting for none."""
        with anyio.CancelScope() as scope:
            self._calls.add(scope)
            try:
                yield scope
            finally:
                self._calls.discard(scope)
                if not self._calls and self._no_calls is not None:
                    self._no_calls.set()
                    self._no_calls = None

    async def _serve(
        self,
        entry: CatalogEntry,
        arguments: dict[str, Any],
        steps: list[AuditStep],
        progress: ProgressFn | None,
        underway: list[tuple[str, str | None, float]],
    ) -> tuple[types.CallToolResult, str]:
        backends = self._backends()
        last: BackendError | None = None
        deadline = CallDeadline(self._budget())  # one budget for every step (gateway/budget.py)
        applicable = [p for p in entry.providers if p.backend in backends and p.applies(arguments, entry.defaults)]
        for provider in entry.providers:
            backend = backends.get(provider.backend)
            if backend is None or not provider.applies(arguments, entry.defaults):
                continue
            state = backend.status
            if state.state is BackendState.DISABLED or (
                state.state is not BackendState.READY and not backend.static_tools
            ):
                reason = state.reason or str(state.state)
                steps.append(
                    AuditStep(provider.label, None, "disabled" if state.declared else "unavailable", reason, 0.0)
                )
                continue
            breaker = self.breakers.of(backend)
            admission = breaker.allow()
            if not admission:
                steps.append(AuditStep(provider.label, None, "circuit_open", breaker.reason(), 0.0))
                continue
            provider_args = provider.map_arguments(arguments)
            ladder = backend.ladder(provider.tool, provider_args)
            for variant in ladder:
                final = variant == ladder[-1] and provider is applicable[-1]  # nothing left to try after it
                underway.append((provider.label, variant, time.perf_counter()))
                with admission:  # a trial call cut short (cancelled) hands the trial back
                    step, result, failure = await self._attempt(
                        entry.name, backend, provider, provider_args, variant, progress, deadline, final
                    )
                underway.pop()
                steps.append(step)
                if failure is None or failure.answered:
                    breaker.success()  # the backend answered (even if the answer is an error, thin or too large)
                else:
                    breaker.failure(step.reason or failure.outcome, cause=failure.cause)
                if failure is not None:
                    log.warning(
                        "tool.step_failed",
                        provider=step.provider,
                        variant=variant,
                        outcome=step.outcome,
                        reason=step.reason,
                    )
                    last = failure
                    if isinstance(failure, BackendUnavailable):
                        break  # the provider itself is down: its cheaper rungs would fail the same way
                    continue
                assert result is not None
                if step.outcome == "refused":
                    return result, "refused"
                if len(steps) > 1:
                    return result, "degraded"
                return result, "error" if result.is_error else "ok"
        raise _Exhausted(last)

    async def _attempt(
        self,
        published: str,
        backend: Backend,
        provider: Provider,
        arguments: dict[str, Any],
        variant: str | None,
        progress: ProgressFn | None,
        deadline: CallDeadline,
        final: bool,
    ) -> tuple[AuditStep, types.CallToolResult | None, BackendError | None]:
        """One rung of one provider: its step (reason scrubbed of secrets), and its answer or its failure."""
        span = self._tracer.step(provider.label, variant) if self._tracer is not None else nullcontext(None)
        with structlog.contextvars.bound_contextvars(provider=provider.label), span as current, self._busy(backend):
            t0 = time.perf_counter()
            outcome: tuple[AuditStep, types.CallToolResult | None, BackendError | None]
            try:
                result = await deadline.run(
                    lambda: backend.call_tool(provider.tool, arguments, variant=variant, progress=progress),
                    backend=backend.name,
                    last=final,
                )
            except InvalidArguments as exc:
                step = AuditStep(provider.label, variant, "refused", redactor.scrub(exc.message), _ms(t0))
                outcome = (step, _invalid_result(_as_published(exc, published, provider)), None)
            except BackendError as exc:
                step = AuditStep(provider.label, variant, exc.outcome, redactor.scrub(exc.reason), _ms(t0))
                outcome = (step, None, exc)
            else:
                step = AuditStep(provider.label, variant, "is_error" if result.is_error else "ok", None, _ms(t0))
                outcome = (step, result, None)
            if current is not None:
                CallTracer.end_step(current, step)
            return outcome

    async def _finish(
        self,
        tool: str,
        audit: Mapping[str, int],
        arguments: Mapping[str, Any],
        ctx: CallContext,
        correlation_id: str,
        started: float,
        steps: list[AuditStep],
        status: str,
        result: types.CallToolResult | None,
        *,
        kind: str = "tools/call",
        measured: bool = True,
    ) -> None:
        """The end of every call and request: its log line, its span's outcome, its audit row (awaited: committed
        before the answer goes out) and its count in metrics. ``kind`` is the request's method; a request that ended
        before it was routed (``measured=False``) has no span and no count, only its line and its row."""
        duration_ms = _ms(started)
        size = _result_size(result)
        served = _served_step(steps)
        log.info(
            "tool.call" if kind == "tools/call" else "request.served",
            status=status,
            duration_ms=round(duration_ms, 2),
            served_by=served.provider if served else None,
            variant=served.variant if served else None,
            steps=len(steps),
            chain=[f"{s.provider}{'[' + s.variant + ']' if s.variant else ''}:{s.outcome}" for s in steps],
            caller=ctx.caller,
            client=ctx.client_name,
            client_version=ctx.client_version,
            session_id=ctx.session_id,
            result_bytes=size,
        )
        known = measured and status != "unknown_tool"  # no span was opened; a made-up name is no metrics label
        if self._tracer is not None and known:
            self._tracer.end_call(status, steps)
        if self._recorder is not None:
            await self._recorder.record(
                AuditRecord(
                    ts=time.time(),
                    correlation_id=correlation_id,
                    session_id=ctx.session_id,
                    client_name=ctx.client_name,
                    client_version=ctx.client_version,
                    caller=ctx.caller,
                    tool=tool,
                    chain=tuple(steps),
                    status=status,
                    duration_ms=duration_ms,
                    result_bytes=size,
                    arg_preview=arg_previews(arguments, audit),
                    args_hash=args_hash(arguments),
                    kind=kind,
                )
            )
        if self._metrics is not None and known:  # after the commit: the latency observed includes the ledger's
            if kind == "tools/call":
                self._metrics.observe_call(tool, status, _ms(started) / 1000.0, steps)
            else:
                asked = served or (steps[-1] if steps else None)
                backend = asked.provider if asked is not None else "none"
                self._metrics.observe_request(kind, backend, status, _ms(started) / 1000.0)


@contextmanager
def _upstream(ctx: CallContext) -> Iterator[None]:
    """``ctx``'s request as the ``UPSTREAM`` of the backend work done inside (the one place it is set)."""
    if ctx.upstream is None:
        yield
        return
    token = UPSTREAM.set(ctx.upstream)
    try:
        yield
    finally:
        UPSTREAM.reset(token)


def _ledger_name(name: str) -> str:
    """An unknown tool's name as the ledger keeps it: cut to ``ECHO_CHARS``, a lone surrogate escaped."""
    return name[:ECHO_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")


def _served_step(steps: list[AuditStep]) -> AuditStep | None:
    """The step that produced the answer (ok or a downstream isError), if any did."""
    return next((s for s in reversed(steps) if s.outcome in ("ok", "is_error")), None)


def _ms(t0: float) -> float:
    return (time.perf_counter() - t0) * 1000.0


def _result_size(result: types.CallToolResult | None) -> int:
    if result is None:
        return 0
    size = 0
    for block in result.content:
        text = getattr(block, "text", None)
        if isinstance(text, str):
            size += len(text.encode("utf-8", errors="replace"))
        else:
            data = getattr(block, "data", None)
            size += len(data) if isinstance(data, str) else 0
    return size


def _with_meta(
    result: types.CallToolResult, correlation_id: str, steps: list[AuditStep], status: str
) -> types.CallToolResult:
    entry: dict[str, Any] = {"id": correlation_id, "status": status}
    served = _served_step(steps)
    if served is not None:
        entry["served_by"] = served.provider
        if served.variant is not None:
            entry["variant"] = served.variant
    if len(steps) > 1 or status == "degraded":
        entry["requested"] = {"provider": steps[0].provider, "variant": steps[0].variant}
        entry["steps"] = [
            {
                "provider": s.provider,
                "variant": s.variant,
                "outcome": s.outcome,
                "reason": s.reason,
                "ms": round(s.duration_ms, 1),
            }
            for s in steps
        ]
    meta = dict(result.meta or {})
    meta[META_KEY] = entry
    result.meta = meta
    return result


def _failure_result(name: str, steps: list[AuditStep]) -> types.CallToolResult:
    if not steps:
        text = f"Tool {name!r} has no available provider right now."
    else:
        parts = [f"{s.provider}{f' [{s.variant}]' if s.variant else ''}: {s.outcome} ({s.reason})" for s in steps]
        text = f"Tool {name!r} failed: every provider failed. " + "; ".join(parts)
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def _as_published(exc: InvalidArguments, published: str, provider: Provider) -> InvalidArguments:
    """A backend's refusal of its own tool's arguments, told in the client's terms: the published tool (renamed,
    prefixed or a route), and the published argument when a route's template passed it on under another name."""
    argument = exc.argument
    head, dot, rest = argument.partition(".")
    if isinstance(provider.arguments, Mapping):
        template = provider.arguments.get(head)
        match = _PLACEHOLDER.fullmatch(template) if isinstance(template, str) else None
        if match is not None:
            argument = match.group(1) + dot + rest
    return InvalidArguments(published, argument, exc.message)


_PLACEHOLDER = re.compile(r"\{([^{}]+)\}")


def _closing_result(name: str, reason: str) -> types.CallToolResult:
    text = f"Tool {name!r} was not completed: {reason}."
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def _invalid_result(exc: InvalidArguments) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=str(exc))], is_error=True)
