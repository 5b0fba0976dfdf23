"""OpenTelemetry tracing: one span per ``tools/call`` and one per provider step, exported only when configured.

Off by default (``gateway.tracing.exporter: none``): ``open_tracing`` yields None, the router is given no tracer and
makes no OpenTelemetry call at all, so tracing costs nothing when off. On (``otlp`` or ``console``), it builds an SDK
``TracerProvider`` (service name, a parent-based ratio sampler) whose ``BatchSpanProcessor`` exports from its own
thread, never on the call path. The provider is installed as the process's global one unless another is already
there, so the MCP SDK's own client spans (``MCP send tools/call``) nest under the gateway's step span and the W3C
trace context travels on to downstream MCP servers in each request's ``_meta``. Leaving ``open_tracing`` flushes
what is queued, bounded by ``SHUTDOWN_TIMEOUT_S``.

The SDK and the OTLP exporter are optional dependencies (the ``tracing`` extra), imported only when tracing is on.

Spans (names and attributes are documented in docs/operations.md, "Tracing"):
  * ``tools/call {tool}`` (kind SERVER): ``gen_ai.tool.name``, ``mcp_gateway.correlation_id``,
    ``mcp_gateway.caller``, ``mcp_gateway.client.name``, ``mcp.session.id``; at the end ``mcp_gateway.status``,
    ``mcp_gateway.served_by``, ``mcp_gateway.steps``; status ERROR for the statuses ``gateway audit stats`` counts
    as errors (``error``, ``timeout``). Its parent is the client's trace context when the request's ``_meta`` carries
    one (``traceparent``).
  * ``step {backend}/{tool}`` (kind INTERNAL), one per provider step and ladder rung: ``mcp_gateway.provider``,
    ``mcp_gateway.variant``, ``mcp_gateway.outcome``; status ERROR with the (redacted) reason when the step failed.
"""

from __future__ import annotations

import sys
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager, contextmanager
from typing import Any, Final, Protocol

import anyio
import anyio.to_thread
from opentelemetry import propagate, trace
from opentelemetry.trace import Span, SpanKind, StatusCode, Tracer

from gateway.config import TracingSettings
from gateway.errors import ConfigError
from gateway.ledger.records import ERROR_STATUSES
from gateway.observe.metrics import SERVED_OUTCOMES

__all__ = ["SHUTDOWN_TIMEOUT_S", "CallTracer", "open_tracing"]

SHUTDOWN_TIMEOUT_S: Final = 5.0
"""Bound on flushing queued spans at shutdown: an unreachable collector must not hold the gateway's exit."""
INSTRUMENTATION: Final = "mcp-gateway"


class _Step(Protocol):
    @property
    def provider(self) -> str: ...

    @property
    def variant(self) -> str | None: ...

    @property
    def outcome(self) -> str: ...

    @property
    def reason(self) -> str | None: ...


class CallTracer:
    """The router's view of tracing: a span for the call, one for each step."""

    def __init__(self, tracer: Tracer) -> None:
        self._tracer = tracer

    @contextmanager
    def call(
        self,
        tool: str,
        correlation_id: str,
        *,
        caller: str | None,
        client_name: str | None,
        session_id: str | None,
        carrier: Mapping[str, Any] | None,
        method: str = "tools/call",
    ) -> Iterator[Span]:
        """The span of one request (a ``tools/call`` unless ``method`` says otherwise: ``tool`` is then the prompt's
        name or the resource's URI); current (the parent of its step spans) while the block runs."""
        parent = propagate.extract(carrier) if carrier else None
        attributes: dict[str, str] = {"mcp.method.name": method, "mcp_gateway.correlation_id": correlation_id}
        if method == "tools/call":
            attributes.update({"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool})
        elif method == "prompts/get":
            attributes["gen_ai.prompt.name"] = tool
        elif method.startswith("resources/"):
            attributes["mcp.resource.uri"] = tool
        else:
            attributes["mcp_gateway.target"] = tool  # completion/complete: the prompt's name or the template's URI
        for key, value in (
            ("mcp_gateway.caller", caller),
            ("mcp_gateway.client.name", client_name),
            ("mcp.session.id", session_id),
        ):
            if value is not None:
                attributes[key] = value
        with self._tracer.start_as_current_span(
            f"{method} {tool}", context=parent, kind=SpanKind.SERVER, attributes=attributes
        ) as span:
            yield span

    @staticmethod
    def end_call(status: str, steps: Sequence[_Step]) -> None:
        """Record the outcome on the current call span (called inside ``call``)."""
        span = trace.get_current_span()
        served = next((s for s in reversed(steps) if s.outcome in SERVED_OUTCOMES), None)
        span.set_attribute("mcp_gateway.status", status)
        span.set_attribute("mcp_gateway.steps", len(steps))
        if served is not None:
            span.set_attribute("mcp_gateway.served_by", served.provider)
        if status in ERROR_STATUSES:
            span.set_attribute("error.type", status)
            span.set_status(StatusCode.ERROR)

    @contextmanager
    def step(self, provider: str, variant: str | None) -> Iterator[Span]:
        attributes = {"mcp_gateway.provider": provider}
        if variant is not None:
            attributes["mcp_gateway.variant"] = variant
        with self._tracer.start_as_current_span(
            f"step {provider}", kind=SpanKind.INTERNAL, attributes=attributes
        ) as span:
            yield span

    @staticmethod
    def end_step(span: Span, step: _Step) -> None:
        span.set_attribute("mcp_gateway.outcome", step.outcome)
        if step.outcome != "ok":
            span.set_status(StatusCode.ERROR, step.reason)


@asynccontextmanager
async def open_tracing(
    settings: TracingSettings,
    *,
    service_name: str,
    version: str,
    source: str = "federation.yaml",
    install_global: bool = True,
) -> AsyncIterator[CallTracer | None]:
    """Yield a ``CallTracer`` exporting as ``settings`` say, or None when tracing is off; flush on the way out.

    Args:
        settings: ``gateway.tracing``.
        service_name: the ``service.name`` when the settings name none (the gateway's name).
        version: the gateway's version (``service.version``).
        source: the configuration file, named in the error when the SDK is missing.
        install_global: make the provider the process's global one if none is installed yet (the gateway does, so
            the MCP SDK's client spans join the trace; a test may not).

    Raises:
        ConfigError: tracing is on but the OpenTelemetry SDK (or the OTLP exporter) is not installed.
    """
    if settings.exporter == "none":
        yield None
        return
    provider = _provider(settings, service_name=settings.service_name or service_name, version=version, source=source)
    if install_global and isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider):  # none installed yet
        trace.set_tracer_provider(provider)
    try:
        yield CallTracer(provider.get_tracer(INSTRUMENTATION, version))
    finally:
        with anyio.CancelScope(shield=True), anyio.move_on_after(SHUTDOWN_TIMEOUT_S):
            await anyio.to_thread.run_sync(provider.force_flush, int(SHUTDOWN_TIMEOUT_S * 1000), abandon_on_cancel=True)
        provider.shutdown()


def _provider(settings: TracingSettings, *, service_name: str, version: str, source: str) -> Any:
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor, ConsoleSpanExporter, SpanExporter
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError as exc:
        raise _missing(source, "opentelemetry-sdk") from exc
    exporter: SpanExporter
    if settings.exporter == "console":
        exporter = ConsoleSpanExporter(out=sys.stderr)  # stdout carries the MCP protocol in `serve --stdio`
    else:
        try:
            from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
        except ImportError as exc:
            raise _missing(source, "opentelemetry-exporter-otlp-proto-http") from exc
        exporter = OTLPSpanExporter(endpoint=settings.endpoint, headers=dict(settings.headers) or None)
    provider = TracerProvider(
        sampler=ParentBased(TraceIdRatioBased(settings.sample_ratio)),
        resource=Resource.create({"service.name": service_name, "service.version": version}),
        shutdown_on_exit=False,
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def _missing(source: str, package: str) -> ConfigError:
    return ConfigError(
        source,
        "gateway.tracing.exporter",
        None,
        f"tracing needs the {package} package, which is not installed: "
        'pip install "mcp-federation-gateway[tracing]", or set the exporter to none',
    )
