"""Every request that reaches a backend, start to finish: route -> provider -> ladder -> result, under one error
policy, each leaving one record (core/record.py: one log line, one ledger row, one count, one span).

The policy, in one place:
  * an unknown tool, or one outside the caller's policy, raises ``ToolNotFound`` (a JSON-RPC error: a hidden tool is
    told as a missing one); arguments the gateway will not pass on (a lone surrogate, nesting beyond
    ``gateway.edge.max_argument_depth``, or what the transport's edge withheld) raise ``InvalidArguments``;
  * a provider's answer, including ``isError``, passes through untouched but for the gateway's ``_meta`` entry and a
    route's declared result shape (core/results.py); arguments that break the published schema (checked once, before
    any provider) or that a provider refuses are an ``isError`` refusal naming the argument;
  * a provider failure (``BackendError``) moves to the next rung of its ladder, then to the next provider of the
    route, all under one deadline (core/budget.py) and each backend's circuit breaker; when every step failed the
    answer is ``isError`` naming each, except a lone provider's JSON-RPC error, which passes through as that error;
  * an input-required answer (SEP-2322) ends the round (``InputRequired`` goes up; the retry comes back through
    ``resume``, one step on the backend that asked); a cancelled request is recorded and cancelled; a fault of the
    gateway's ends that request alone (an ``isError`` answer for a call, ``internal_error`` for a request);
  * when the gateway stops (``abort``), what is in progress and what comes later is answered as cancelled.

``request`` serves resources, prompts, completion and subscriptions the same way over a request's origins (the
backends that own the name or URI); ``wait_started`` holds a request that races startup, and records it if it ends
there; ``refuse`` records a request the front refused before routing it (a caller's limit).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Mapping, Sequence
from contextlib import asynccontextmanager, nullcontext
from functools import partial
from typing import Any, Protocol, TypeVar

import anyio
import mcp_types as types
import structlog

from gateway.backends.base import Backend, BackendState, ProgressFn
from gateway.calls import NO_CONTEXT, CallContext, Origin
from gateway.config import CallBudget, EdgeSettings
from gateway.core.answers import Answers
from gateway.core.breakers import Breakers
from gateway.core.budget import CallDeadline
from gateway.core.catalog import Catalog, CatalogEntry, Provider
from gateway.core.drain import Drain
from gateway.core.failures import Unanswered
from gateway.core.failures import failure_result as _failure_result
from gateway.core.failures import fault as _fault
from gateway.core.failures import refusal as _refusal
from gateway.core.failures import refused as _refused
from gateway.core.gate import ClientPolicy
from gateway.core.kept import READ_TOOL
from gateway.core.leaks import Leaks
from gateway.core.published import as_url_elicitation, error_as_published, result_as_published
from gateway.core.record import META_KEY, CallRecord, Instruments, Recorder, ledger_name, step
from gateway.core.results import shape_result
from gateway.core.unserved import why_off
from gateway.errors import (
    BackendError,
    BackendRpcError,
    BackendUnavailable,
    InputRequired,
    InvalidArguments,
    ToolNotFound,
    quote,
)
from gateway.inputs import MAX_DEPTH, PublishedSchemas, argument_problem
from gateway.ledger.records import AuditStep, canonical_json
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import CallTracer
from gateway.search.tokens import count_tokens

__all__ = ["META_KEY", "Router", "Unanswered"]

log = structlog.get_logger("gateway.call")

T = TypeVar("T")
Outcome = tuple[AuditStep, Any, BackendError | None]
"""One attempt: its step, and its answer or its failure."""


class Startup(Protocol):
    """The gateway's startup wait (runtime.py): ``started`` once it is over."""

    started: bool

    async def wait_started(self) -> None: ...


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
        answers: Answers | None = None,
    ) -> None:
        self._catalog = catalog
        self.answers = answers
        self._startup = startup
        self._budget = budget or CallBudget
        self._backends = backends
        self.instruments = Instruments(recorder, tracer, metrics)
        self._clients = clients
        self.breakers = breakers if breakers is not None else Breakers()
        self._edge = edge
        self._schemas = PublishedSchemas()
        self.drain = Drain()
        self.leaks = Leaks()  # credentials in flight (core/leaks.py): the runtime gives it the configuration

    def use_instruments(self, recorder: Recorder | None, tracer: CallTracer | None) -> None:
        """Record to ``recorder`` and trace with ``tracer`` from now on (the gateway opens them when it runs)."""
        self.instruments.recorder = recorder
        self.instruments.tracer = tracer

    def use_clients(self, clients: ClientPolicy | None) -> None:
        """Swap the context gate's rules (on reload)."""
        self._clients = clients

    def _record(self, kind: str, name: str, ctx: CallContext, **kwargs: Any) -> CallRecord:
        return CallRecord(self.instruments, kind, name, ctx, **kwargs)

    # -- the skeleton every request shares ------------------------------------------------------------------------

    @asynccontextmanager
    async def _boundary(self, record: CallRecord) -> AsyncIterator[None]:
        """A request's end when it does not answer: asking the client for input, or cancelled, it is recorded (the
        steps under way named) and the exception goes on."""
        try:
            yield
        except InputRequired as exc:  # the round ends asking for input, or with a task: not a failure, no fallback
            record.cut(exc.status, None)
            await record.finish(exc.status)
            raise
        except anyio.get_cancelled_exc_class():
            record.cut("cancelled", "cancelled while under way")
            with anyio.CancelScope(shield=True):
                await record.finish("cancelled")
            raise

    async def _attempt(
        self,
        record: CallRecord,
        backend: Backend,
        label: str,
        variant: str | None,
        send: Callable[[], Awaitable[Any]],
        *,
        refusable: bool = True,
    ) -> Outcome:
        """One step on ``backend``: counted in flight on it, timed, traced, its failure translated into its step (a
        tool's refusal of its arguments, when ``refusable``, into a ``refused`` step whose answer is the refusal)."""
        tracer = self.instruments.tracer
        span = tracer.step(label, variant) if tracer is not None else nullcontext()
        with structlog.contextvars.bound_contextvars(provider=label), span as current, self.drain.busy(backend):
            with record.attempt(label, variant) as started:
                outcome: Outcome
                try:
                    answer = await send()
                except InvalidArguments as exc:
                    if not refusable:
                        raise
                    outcome = (step(label, variant, "refused", exc.message, started), exc, None)
                except BackendError as exc:
                    outcome = (step(label, variant, exc.outcome, exc.reason, started), None, exc)
                else:
                    is_error = isinstance(answer, types.CallToolResult) and answer.is_error
                    outcome = (step(label, variant, "is_error" if is_error else "ok", None, started), answer, None)
            if current is not None:
                CallTracer.end_step(current, outcome[0])
            return outcome

    def _closed(self, record: CallRecord) -> types.CallToolResult:
        """A call cut short by the shutdown (or that came after it): the step under way is named in the chain."""
        record.cut("cancelled", self.drain.closing or "")
        text = f"Tool {record.name!r} was not completed: {self.drain.closing or ''}."
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)

    # -- tools/call ---------------------------------------------------------------------------------------------------

    async def call(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        ctx: CallContext = NO_CONTEXT,
        progress: ProgressFn | None = None,
    ) -> types.CallToolResult:
        """Serve one tools/call. Whatever happens, the call leaves exactly one record.

        Raises:
            ToolNotFound: no tool of this name is published to this caller (status ``unknown_tool`` or ``refused``).
            InvalidArguments: arguments the gateway will not pass on (status ``invalid_params``); no backend asked.
            BackendRpcError: the lone provider answered with a JSON-RPC error (passed through by the server).
        """
        entry = (catalog := self._catalog()).get(name)
        if entry is None:
            if self.instruments.metrics is not None:
                self.instruments.metrics.observe_unknown_tool()
            record = self._record("tools/call", ledger_name(name), ctx)
            with record.open(span=False, bind={"tool": quote(name)}):
                await record.finish("unknown_tool")
            raise ToolNotFound(name, why_off(catalog.unserved, name, ctx.visible))  # whose it is, why it is off
        arguments = dict(arguments or {})
        record = self._record("tools/call", entry.name, ctx, arguments=arguments, audit=entry.audit)
        with record.open():
            await self._policy(record, name)
            invalid = ctx.withheld or argument_problem(arguments, self._max_depth())
            if invalid is not None:
                refusal = InvalidArguments(name, *invalid)
                record.add("gateway", "invalid_params", refusal.message)
                record.arguments = {}
                await record.finish("invalid_params")
                raise refusal
            record.tokens_in = count_tokens(canonical_json(arguments)) if arguments else 0
            async with self._boundary(record):
                try:
                    result, status = await self._served_call(record, entry, arguments, progress)
                except (InputRequired, BackendRpcError):
                    raise  # the round asks the client for input; a lone provider's error passes through
                except Exception as exc:  # the per-call boundary: a fault of the gateway's ends this call alone
                    log.exception("tool.internal_error", error=type(exc).__name__)
                    record.cut("internal_error", type(exc).__name__)
                    result, status = _fault(name, exc), "internal_error"
            if self.answers is not None:  # within the call's token budget, its tokens counted (core/answers.py)
                result, record.tokens_out = self.answers.deliver(result, status, ctx, record.name)
            result = record.with_meta(result, status, entry.tool.output_schema)
            await record.finish(status, result)
            return result

    async def _policy(self, record: CallRecord, tool: str) -> None:
        """A request for ``tool`` outside the caller's policy (``ctx.visible``) ends here, told as an unknown tool (no
        existence leak): recorded ``refused``, no argument previewed.

        Raises:
            ToolNotFound: ``tool`` is hidden from the caller.
        """
        if record.ctx.visible is None or tool in record.ctx.visible:
            return
        record.add("gateway", "refused", "not in the caller's policy")
        record.name, record.audit = ledger_name(record.name), {}
        await record.finish("refused")
        raise ToolNotFound(tool)

    def _max_depth(self) -> int:
        return self._edge().max_argument_depth if self._edge is not None else MAX_DEPTH

    async def _served_call(
        self, record: CallRecord, entry: CatalogEntry, arguments: dict[str, Any], progress: ProgressFn | None
    ) -> tuple[types.CallToolResult, str]:
        """The call's answer and status; a lone provider's JSON-RPC error is recorded and raised."""
        refusal = self._gate(entry.name, record.ctx)
        if refusal is None and self.answers is not None:
            refusal = self.answers.refusal(record.ctx, entry.name)  # over the caller's daily allowance
        if refusal is not None:
            return refusal, "refused"
        invalid = self._schemas.problem(entry.name, entry.tool.input_schema, arguments)
        if invalid is not None:  # the published schema, held here once for every provider, mode and route
            record.add("gateway", "refused", invalid.message)
            return _refusal(invalid), "refused"
        if not entry.providers and entry.name == READ_TOOL and self.answers is not None:  # the built-in reader
            record.add("gateway", "ok", None)
            result = self.answers.read_tool(record.ctx, arguments)
            return result, "error" if result.is_error else "ok"
        try:
            served = None
            if self.drain.closing is None:
                with self.drain.abortable():
                    served = await self._serve(record, entry, arguments, progress)
            if served is None:  # cut short by the shutdown
                return self._closed(record), "cancelled"
            result, status = served  # a downstream's error names the tool as the client knows it (published.py)
            return result_as_published(
                shape_result(entry.result, result, record.steps), entry.name, record.steps
            ), status
        except _Exhausted as exc:
            last = as_url_elicitation(exc.last, record.ctx.upstream, len(record.steps))
            status = "timeout" if last is not None and last.outcome == "timeout" else "error"
            if last is not None and len(record.steps) == 1 and isinstance(last, BackendRpcError):
                await record.finish(status)
                raise error_as_published(last, entry.name, record.steps) from None
            return _failure_result(entry.name, record.steps), status

    def _gate(self, name: str, ctx: CallContext) -> types.CallToolResult | None:
        """An isError refusal when a large-context-only tool is called by a client below the gate, else None."""
        clients = self._clients
        if clients is None or clients.allowed(name, ctx.declared):
            return None
        text = clients.refusal(name, ctx.declared)
        return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)

    async def _serve(
        self, record: CallRecord, entry: CatalogEntry, arguments: dict[str, Any], progress: ProgressFn | None
    ) -> tuple[types.CallToolResult, str]:
        """Each provider of the route in turn, each rung of its ladder, until one answers."""
        backends = self._backends()
        last: BackendError | None = None
        deadline = CallDeadline(self._budget())  # one budget for every step (core/budget.py)
        applicable = [p for p in entry.providers if p.backend in backends and p.applies(arguments, entry.defaults)]
        for provider in applicable:
            backend = backends[provider.backend]
            state = backend.status
            if state.state is BackendState.DISABLED or not backend.serves(record.ctx.caller.name):
                outcome = "disabled" if state.declared else "unavailable"
                record.add(provider.label, outcome, state.reason or str(state.state))
                continue
            breaker = self.breakers.of(backend)
            admission = breaker.allow()
            if not admission:
                record.add(provider.label, "circuit_open", breaker.reason())
                continue
            provider_args = provider.map_arguments(arguments)
            ladder = backend.ladder(provider.tool, provider_args)
            for variant in ladder:
                final = variant == ladder[-1] and provider is applicable[-1]  # nothing left to try after it
                with admission:  # a trial call cut short (cancelled) hands the trial back
                    taken, answer, failure = await self._rung(
                        record, backend, provider, provider_args, variant, progress, deadline, final
                    )
                record.steps.append(taken)
                breaker.judge(failure, taken.reason, abandoned=_abandoned(record.ctx))
                if failure is not None:
                    log.warning(
                        "tool.step_failed",
                        provider=taken.provider,
                        variant=variant,
                        outcome=taken.outcome,
                        reason=taken.reason,
                    )
                    last = failure
                    if isinstance(failure, BackendUnavailable):
                        break  # the provider itself is down: its cheaper rungs would fail the same way
                    continue
                if taken.outcome == "refused":
                    return _refused(answer, entry.name, provider), "refused"
                if len(record.steps) > 1:
                    return answer, "degraded"
                return answer, "error" if answer.is_error else "ok"
        raise _Exhausted(last)

    async def _rung(
        self,
        record: CallRecord,
        backend: Backend,
        provider: Provider,
        arguments: dict[str, Any],
        variant: str | None,
        progress: ProgressFn | None,
        deadline: CallDeadline,
        final: bool,
    ) -> Outcome:
        """One rung of one provider, within the call's deadline (``final``: nothing is left to try after it)."""
        upstream, call = record.ctx.upstream, self.leaks.guard(record, backend.name, backend.call_tool)

        def send() -> Awaitable[types.CallToolResult]:
            return deadline.run(
                lambda: call(provider.tool, arguments, variant=variant, progress=progress, upstream=upstream),
                backend=backend.name,
                last=final,
            )

        return await self._attempt(record, backend, provider.label, variant, send)

    async def resume(
        self,
        name: str,
        arguments: Mapping[str, Any] | None,
        *,
        backend_name: str,
        tool: str,
        ctx: CallContext = NO_CONTEXT,
        progress: ProgressFn | None = None,
    ) -> types.CallToolResult:
        """Serve a later round of a multi-round-trip ``tools/call``: straight to ``backend_name``'s ``tool`` (the
        backend that asked, as the sealed state says; the round travels in ``ctx.upstream``), one step under the
        call budget, one record. The published ``name`` need not be in the catalog any more; when it still is, with
        this provider, the provider's argument template applies.

        Raises:
            InputRequired: the backend asks for more input (status ``input_required``).
            BackendRpcError: the backend answered with a JSON-RPC error (passed through by the server).
            ToolNotFound: the backend is gone, or the tool is no longer in the caller's policy.
        """
        entry = self._catalog().get(name)
        backend = self._backends().get(backend_name)
        if backend is None:
            raise ToolNotFound(name)
        arguments = dict(arguments or {})
        record = self._record(
            "tools/call", name, ctx, arguments=arguments, audit=entry.audit if entry is not None else {}
        )
        with record.open():
            await self._policy(record, name)  # the policy may have changed since the first round
            listed = entry.providers if entry is not None else ()
            provider = next(
                (p for p in listed if (p.backend, p.tool) == (backend_name, tool)), Provider(backend_name, tool)
            )
            provider_args = provider.map_arguments(arguments)
            deadline, call = CallDeadline(self._budget()), self.leaks.guard(record, backend.name, backend.call_tool)

            def send() -> Awaitable[types.CallToolResult]:
                return deadline.run(
                    lambda: call(tool, provider_args, progress=progress, upstream=ctx.upstream),
                    backend=backend.name,
                    last=True,
                )

            async with self._boundary(record):
                outcome = None
                if self.drain.closing is None:
                    with self.drain.abortable():
                        outcome = await self._attempt(record, backend, provider.label, None, send)
            if outcome is None:  # cut short by the shutdown
                result, status = self._closed(record), "cancelled"
            else:
                taken, answer, failure = outcome
                record.steps.append(taken)
                if taken.outcome == "refused":
                    result, status = _refused(answer, name, provider), "refused"
                elif failure is None:
                    result, status = answer, "error" if answer.is_error else "ok"
                else:
                    status = "timeout" if failure.outcome == "timeout" else "error"
                    if isinstance(failure, BackendRpcError):
                        await record.finish(status)
                        raise failure
                    result = _failure_result(name, record.steps)
            result = record.with_meta(result, status)
            await record.finish(status, result)
            return result

    async def note_round(
        self, name: str, arguments: Mapping[str, Any] | None, *, backend: str, method: str, ctx: CallContext
    ) -> None:
        """One record for a round of a bridged call (front/eras.py): ``backend``, a handshake-era downstream, asked
        for input (``method``) mid-call and the stateless client was handed an input-required result. The call's
        own record follows when it ends, as for every call."""
        entry = self._catalog().get(name)
        record = self._record(
            "tools/call", name, ctx, arguments=dict(arguments or {}), audit=entry.audit if entry is not None else {}
        )
        with record.open():
            record.add(backend, "input_required", method)
            await record.finish("input_required")

    # -- every other request ------------------------------------------------------------------------------------------

    async def request(
        self,
        method: str,
        name: str,
        origins: Sequence[Origin],
        send: Callable[[Backend, Origin], Awaitable[T]],
        *,
        arguments: Mapping[str, Any] | None = None,
        ctx: CallContext = NO_CONTEXT,
        tool: str | None = None,
        recorded: Callable[[T], str | None] | None = None,
    ) -> tuple[Origin, T]:
        """Serve one request that is not a ``tools/call``: ``send`` it to the first of ``origins`` whose backend
        answers, and return that origin with the answer. ``tool``: the published tool the request acts for (a
        task's), held to the caller's policy as a call to it is.

        Each origin is a step: skipped when its backend serves no requests (it is no downstream MCP session) or its
        circuit is open; a failure moves on to the next origin and, unless the backend answered (a JSON-RPC error),
        counts against its breaker. One record of kind ``method`` names ``name`` and keeps only the hash of
        ``arguments``; answered, its status is ``recorded(answer)`` (default ``ok``; None: no record, e.g. a poll
        that found nothing new).

        Raises:
            Unanswered: no origin answered; its ``failures`` say why (status ``timeout`` when the last one timed
                out, else ``error``; ``cancelled`` when the gateway stopped).
            InputRequired: the backend asked for input (status ``input_required``); not a failure.
            ToolNotFound: ``tool`` is outside the caller's policy (status ``refused``); no backend asked.
        """
        record = self._record(method, ledger_name(name), ctx, arguments=dict(arguments or {}))
        failures: list[BackendError] = []
        with record.open():
            if tool is not None:
                await self._policy(record, tool)
            async with self._boundary(record):
                try:
                    found = (
                        await self._ask_origins(record, origins, send, failures) if self.drain.closing is None else None
                    )
                except InputRequired:
                    raise
                except Exception as exc:  # a fault of the gateway's: its record, then the server's boundary
                    record.cut("internal_error", type(exc).__name__)
                    await record.finish("internal_error")
                    raise
            if found is not None:
                verdict = recorded(found[1]) if recorded is not None else "ok"
                if verdict is not None:
                    await record.finish(verdict)
                return found
            status = "error"
            if self.drain.closing is not None:  # cut short by the shutdown (or it had begun)
                cut = record.cut("cancelled", self.drain.closing)
                failures.append(BackendUnavailable(cut[0] if cut else "gateway", self.drain.closing))
                status = "cancelled"
            elif failures and failures[-1].outcome == "timeout":
                status = "timeout"
            await record.finish(status)
            raise Unanswered(failures)

    async def _ask_origins(
        self,
        record: CallRecord,
        origins: Sequence[Origin],
        send: Callable[[Backend, Origin], Awaitable[T]],
        failures: list[BackendError],
    ) -> tuple[Origin, T] | None:
        backends = self._backends()
        with self.drain.abortable():
            for origin in origins:
                backend = backends.get(origin.backend)
                if backend is None or not backend.serves_requests:
                    continue
                breaker = self.breakers.of(backend)
                admission = breaker.allow()
                if not admission:
                    record.add(backend.name, "circuit_open", breaker.reason())
                    failures.append(BackendUnavailable(backend.name, breaker.reason()))
                    continue
                with admission:
                    taken, answer, failure = await self._attempt(
                        record, backend, backend.name, None, partial(send, backend, origin), refusable=False
                    )
                record.steps.append(taken)
                breaker.judge(failure, taken.reason, abandoned=_abandoned(record.ctx))
                if failure is not None:
                    failures.append(failure)
                    continue
                return origin, answer
        return None

    async def refuse(
        self, kind: str, name: str, arguments: Mapping[str, Any] | None, ctx: CallContext, outcome: str, reason: str
    ) -> None:
        """Record a request the front refused before routing it (e.g. over a caller's limit): one ``gateway`` step
        with ``outcome`` and ``reason``, status ``refused``, the arguments only hashed."""
        record = self._record(kind, ledger_name(name), ctx, arguments=dict(arguments or {}))
        with record.open(span=False):
            record.add("gateway", outcome, reason)
            await record.finish("refused", measured=False)

    async def wait_started(
        self, method: str, name: str, *, arguments: Mapping[str, Any] | None = None, ctx: CallContext = NO_CONTEXT
    ) -> None:
        """Wait, bounded, for the gateway's startup before a request of kind ``method`` is routed (``call`` or
        ``request`` next): one that races startup would find too little. At once when startup is over.

        A request accepted is a request recorded, even when it ends here: cancelled while it waits (the client left),
        it leaves one record of status ``cancelled`` whose one ``gateway`` step says it was waiting for startup;
        failing here, one of status ``internal_error``. Either way the exception goes on. The gateway stopping
        (``abort``) ends the wait: ``call`` or ``request`` then answers the request as cancelled.
        """
        if self._startup is None or self._startup.started or self.drain.closing is not None:
            return
        record = self._record(method, ledger_name(name), ctx, arguments=dict(arguments or {}))
        with record.open(span=False, bind={"method": method}):
            log.info("request.waiting_for_startup")
            try:
                with self.drain.abortable():
                    await self._startup.wait_started()
            except anyio.get_cancelled_exc_class():
                with anyio.CancelScope(shield=True):
                    record.steps.append(step("gateway", None, "cancelled", f"cancelled {_WAITING}", record.started))
                    await record.finish("cancelled", measured=False)
                raise
            except Exception as exc:
                reason = f"{type(exc).__name__} {_WAITING}"
                record.steps.append(step("gateway", None, "internal_error", reason, record.started))
                await record.finish("internal_error", measured=False)
                raise


_WAITING = "while waiting for backends still starting"


def _abandoned(ctx: CallContext) -> bool:
    """Whether the call's backend waited on its caller's own answer, which never came (front/bridges.py)."""
    return bool(getattr(ctx.upstream.channel, "unanswered", False))
