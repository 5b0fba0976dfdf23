"""One request's record, from start to finish: its correlation id, the steps it took, and at its end the one log line,
span outcome, ledger row and metrics count every request leaves (``CallRecord.finish``, the one writer of ledger rows).

While the request runs, ``correlation_id`` and the tool (or method) are bound in structlog's contextvars, so every log
line written meanwhile (the router's, a backend's) carries them, and the request has a span when tracing is on. A
step under way (``attempt``) is known by name, so a request cut short (cancelled, asking the client for input, a fault
of the gateway's) ends its chain with the step that was running. Reasons are scrubbed of registered secrets before
they reach the ledger, the log or ``_meta``.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager, nullcontext
from typing import Any, Protocol

import mcp_types as types
import structlog

from gateway.calls import CallContext
from gateway.errors import ECHO_CHARS
from gateway.ledger.records import AuditRecord, AuditStep, arg_previews, args_hash
from gateway.observe.credentials import redact_value
from gateway.observe.logs import redactor
from gateway.observe.metrics import GatewayMetrics
from gateway.observe.tracing import CallTracer

__all__ = [
    "DEGRADED_KEY",
    "META_KEY",
    "CallRecord",
    "Instruments",
    "Recorder",
    "degradation_note",
    "ledger_name",
    "step",
]

log = structlog.get_logger("gateway.call")

META_KEY = "mcp-gateway/call"
"""The key of the gateway's entry in a result's ``_meta``: correlation id, who served the call, and the chain."""


class Recorder(Protocol):
    async def record(self, rec: AuditRecord) -> None: ...


class Instruments:
    """Where records go: the ledger, tracing and metrics (each optional; the gateway opens them when it runs)."""

    __slots__ = ("metrics", "recorder", "tracer")

    def __init__(
        self,
        recorder: Recorder | None = None,
        tracer: CallTracer | None = None,
        metrics: GatewayMetrics | None = None,
    ) -> None:
        self.recorder = recorder
        self.tracer = tracer
        self.metrics = metrics


def ledger_name(name: str) -> str:
    """A client-given name as the ledger keeps it: scrubbed of registered secrets, cut to ``ECHO_CHARS``, a lone
    surrogate escaped."""
    scrubbed = str(redactor.scrub(name))
    return scrubbed[:ECHO_CHARS].encode("utf-8", "backslashreplace").decode("utf-8")


def step(provider: str, variant: str | None, outcome: str, reason: str | None, started: float) -> AuditStep:
    """One step, timed from ``started`` (a ``perf_counter`` reading), its reason scrubbed of registered secrets."""
    return AuditStep(provider, variant, outcome, redactor.scrub(reason) if reason else reason, _ms(started))


class CallRecord:
    """One request's record (see the module docstring). ``kind`` is its method; ``name`` the tool, prompt or URI as
    the ledger keeps it; ``audit`` the argument previews the route allows (the rest of ``arguments`` only hashed)."""

    __slots__ = (
        "_underway",
        "arguments",
        "audit",
        "ctx",
        "id",
        "instruments",
        "kind",
        "name",
        "secrets",
        "started",
        "steps",
        "tokens_in",
        "tokens_out",
    )

    def __init__(
        self,
        instruments: Instruments,
        kind: str,
        name: str,
        ctx: CallContext,
        *,
        arguments: Mapping[str, Any] | None = None,
        audit: Mapping[str, int] | None = None,
    ) -> None:
        self.instruments = instruments
        self.kind = kind
        self.name = name
        self.ctx = ctx
        self.arguments: Mapping[str, Any] = arguments if arguments is not None else {}
        self.audit: Mapping[str, int] = audit if audit is not None else {}
        self.id = uuid.uuid4().hex[:16]
        self.started = time.perf_counter()
        self.steps: list[AuditStep] = []
        self._underway: list[tuple[str, str | None, float]] = []
        self.tokens_in: int | None = None
        """The arguments' tokens and the answer's as delivered (search/tokens.py); None when not counted."""
        self.tokens_out: int | None = None
        self.secrets: list[tuple[str, str, str]] = []
        """Credentials found in flight (core/leaks.py): kind, place, action; never the value."""

    @contextmanager
    def open(self, *, span: bool = True, bind: Mapping[str, Any] | None = None) -> Iterator[None]:
        """The request's log context (its correlation id, and its tool or method unless ``bind`` says what), and
        its span (unless ``span`` is False: a request that ended before it was routed)."""
        if bind is None:
            bind = {"tool": self.name} if self.kind == "tools/call" else {"method": self.kind}
        with ExitStack() as stack:
            stack.enter_context(structlog.contextvars.bound_contextvars(correlation_id=self.id, **bind))
            if span:
                stack.enter_context(self._span())
            yield

    def _span(self) -> AbstractContextManager[object]:
        tracer, ctx = self.instruments.tracer, self.ctx
        if tracer is None:
            return nullcontext()
        return tracer.call(
            self.name,
            self.id,
            caller=ctx.caller.name,
            client_name=ctx.client_name,
            session_id=ctx.session_id,
            carrier=ctx.upstream.meta,
            method=self.kind,
        )

    @contextmanager
    def attempt(self, provider: str, variant: str | None) -> Iterator[float]:
        """A step under way; yields its start. A step the block leaves by an exception stays under way, to be named
        by ``cut`` (cancelled, asking for input, a fault of the gateway's)."""
        started = time.perf_counter()
        self._underway.append((provider, variant, started))
        yield started
        self._underway.pop()

    def cut(self, outcome: str, reason: str | None) -> list[str]:
        """The request was cut short: the steps under way end with ``outcome``; returns their providers."""
        cut = [provider for provider, _, _ in self._underway]
        for provider, variant, started in self._underway:
            self.steps.append(step(provider, variant, outcome, reason, started))
        self._underway.clear()
        return cut

    def add(self, provider: str, outcome: str, reason: str | None, variant: str | None = None) -> None:
        """A step that took no time (the gateway's own refusal, a skipped provider)."""
        self.steps.append(AuditStep(provider, variant, outcome, redactor.scrub(reason) if reason else reason, 0.0))

    def served(self) -> AuditStep | None:
        """The step that produced the answer (ok or a downstream isError), if any did."""
        return next((s for s in reversed(self.steps) if s.outcome in ("ok", "is_error")), None)

    async def finish(self, status: str, result: types.CallToolResult | None = None, *, measured: bool = True) -> None:
        """The end of the request: its log line, its span's outcome, its ledger row (awaited: committed before the
        answer goes out) and its count in metrics. A request that ended before it was routed (``measured`` False,
        or an unknown tool) has no span outcome and no count, only its line and its row."""
        duration_ms = _ms(self.started)
        size = _result_size(result)
        served = self.served()
        steps, ctx = self.steps, self.ctx
        log.info(
            "tool.call" if self.kind == "tools/call" else "request.served",
            status=status,
            duration_ms=round(duration_ms, 2),
            served_by=served.provider if served else None,
            variant=served.variant if served else None,
            steps=len(steps),
            chain=[f"{s.provider}{'[' + s.variant + ']' if s.variant else ''}:{s.outcome}" for s in steps],
            caller=ctx.caller.name,
            client=ctx.client_name,
            client_version=ctx.client_version,
            session_id=ctx.session_id,
            result_bytes=size,
            tokens_in=self.tokens_in,
            tokens_out=self.tokens_out,
            secrets=[f"{kind} at {place} ({action})" for kind, place, action in self.secrets] or None,
        )
        known = measured and status != "unknown_tool"  # no span was opened; a made-up name is no metrics label
        instruments = self.instruments
        if instruments.tracer is not None and known:
            instruments.tracer.end_call(status, steps)
        if instruments.recorder is not None:
            await instruments.recorder.record(
                AuditRecord(
                    ts=time.time(),
                    correlation_id=self.id,
                    session_id=ctx.session_id,
                    client_name=ctx.client_name,
                    client_version=ctx.client_version,
                    caller=ctx.caller.name,
                    tool=self.name,
                    chain=tuple(steps),
                    status=status,
                    duration_ms=duration_ms,
                    result_bytes=size,
                    arg_preview=arg_previews(_previewed(self.arguments, self.audit), self.audit),
                    args_hash=args_hash(self.arguments),
                    kind=self.kind,
                    tokens_in=self.tokens_in,
                    tokens_out=self.tokens_out,
                    secrets=tuple(self.secrets),
                )
            )
        metrics = instruments.metrics
        if metrics is not None and known:  # after the commit: the latency observed includes the ledger's
            seconds = _ms(self.started) / 1000.0
            if self.kind == "tools/call":
                metrics.observe_call(self.name, status, seconds, steps)
                if self.tokens_out is not None:
                    metrics.observe_tokens(self.name, ctx.caller.name, self.tokens_in or 0, self.tokens_out)
            else:
                asked = served or (steps[-1] if steps else None)
                metrics.observe_request(self.kind, asked.provider if asked is not None else "none", status, seconds)

    def with_meta(
        self, result: types.CallToolResult, status: str, output_schema: Mapping[str, Any] | None = None
    ) -> types.CallToolResult:
        """``result`` with the gateway's ``_meta`` entry: the correlation id, who served it, and the chain when it
        took more than one step or was degraded. A degraded answer also says so where the model reads (no client
        shows it ``_meta``): one line at the end of the content, and ``degraded`` in a structured result whose
        ``output_schema`` leaves room for it."""
        entry: dict[str, Any] = {"id": self.id, "status": status}
        served, steps = self.served(), self.steps
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
        note = degradation_note(steps) if status == "degraded" else None
        if note is not None:
            result.content = [*result.content, types.TextContent(text=note)]
            if isinstance(result.structured_content, dict) and _room_for(output_schema, DEGRADED_KEY):
                result.structured_content = {**result.structured_content, DEGRADED_KEY: note}
        return result


DEGRADED_KEY = "degraded"
"""The key, in a degraded answer's structured result, of the line that says so."""
_NOTE_REASON_CHARS = 100


def degradation_note(steps: Sequence[AuditStep]) -> str | None:
    """The line a degraded answer ends with: which step could not serve the call and why (cut short), and who
    answered instead; None when no step answered or none failed before it."""
    served = next((s for s in reversed(steps) if s.outcome in ("ok", "is_error")), None)
    failed = [s for s in steps if s is not served]
    if served is None or not failed:
        return None
    first = failed[0]
    reason = f"{first.outcome}: {first.reason}" if first.reason else first.outcome
    if len(reason) > _NOTE_REASON_CHARS:
        reason = reason[: _NOTE_REASON_CHARS - 1].rstrip() + "…"
    more = f" (and {len(failed) - 1} more step{'s' if len(failed) > 2 else ''})" if len(failed) > 1 else ""
    return (
        f"[gateway] Degraded answer: {_label(first)} could not serve this call ({reason}){more}; "
        f"{_label(served)} answered instead."
    )


def _label(step: AuditStep) -> str:
    return f"{step.provider} [{step.variant}]" if step.variant else step.provider


def _room_for(schema: Mapping[str, Any] | None, key: str) -> bool:
    """Whether a structured result the schema describes may carry ``key`` besides its own properties."""
    if schema is None:
        return True
    properties = schema.get("properties")
    if isinstance(properties, Mapping) and key in properties:
        return False  # the tool's own field of that name
    return schema.get("additionalProperties", True) is not False and "unevaluatedProperties" not in schema


def _previewed(arguments: Mapping[str, Any], audit: Mapping[str, int]) -> Mapping[str, Any]:
    """The arguments the ledger previews, their credentials redacted whatever the secrets policy (core/leaks.py)."""
    if not audit:
        return arguments
    return {name: redact_value(value) if name in audit else value for name, value in arguments.items()}


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
