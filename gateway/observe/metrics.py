"""Prometheus metrics for one gateway: what every call did (counted on the hot path) and what the gateway is doing
now (read when ``/metrics`` is scraped).

Each ``GatewayMetrics`` owns its own ``CollectorRegistry`` (no module globals: two gateways in one process, as in the
tests, keep separate figures). The per-call cost is one ``Counter.inc`` and one ``Histogram.observe`` on label
children cached by ``(tool, provider, status)``; a failed-over step adds one ``Counter.inc``. Label values come only
from the catalog (tool and provider names), the fixed status set and the backends' error outcomes, so the number of
series is bounded by the configuration, never by what clients send: a call naming an unknown tool is counted without
its name. Gauges (backend states, live adapter processes, the ledger's queue, the shared Redis) and the counts other
parts keep themselves (the ledger's rows, the JWT access tokens verified) are collected at scrape time from a
``StateSnapshot`` callback, so nothing is kept up to date between scrapes.

The names and labels are the contract documented in docs/operations.md, "Metrics".
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Histogram,
    ProcessCollector,
    disable_created_metrics,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest
from prometheus_client.registry import Collector

from gateway.ledger.commits import LedgerStatistics

__all__ = [
    "CONTENT_TYPE",
    "DURATION_BUCKETS_S",
    "NO_PROVIDER",
    "PREFIX",
    "OAuthSnapshot",
    "SERVED_OUTCOMES",
    "AdapterSnapshot",
    "BackendSnapshot",
    "GatewayMetrics",
    "SharedStoreSnapshot",
    "StateSnapshot",
    "TokenCacheSnapshot",
]

PREFIX: Final = "mcp_gateway"
CONTENT_TYPE: Final = CONTENT_TYPE_LATEST
NO_PROVIDER: Final = "none"
"""The ``provider`` label of a call that no provider served (every step failed, or no provider was available)."""

DURATION_BUCKETS_S: Final = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 120.0)
"""From an in-memory wiki lookup (about a millisecond) to a deep search an adapter may run for minutes."""

BACKEND_STATES: Final = ("starting", "ready", "degraded", "failed", "disabled")
SERVED_OUTCOMES: Final = frozenset({"ok", "is_error"})
"""Step outcomes that answered the call: a result, or the downstream's own ``isError`` answer."""
_NOT_A_FALLBACK: Final = SERVED_OUTCOMES | {"refused", "input_required"}  # input_required: a round, not a failure


@dataclass(frozen=True, slots=True)
class BackendSnapshot:
    name: str
    kind: str
    state: str  # one of BACKEND_STATES
    tools: int


@dataclass(frozen=True, slots=True)
class AdapterSnapshot:
    name: str
    live_processes: int
    running_calls: int
    waiting_calls: int


@dataclass(frozen=True, slots=True)
class SharedStoreSnapshot:
    """The shared limits' Redis (``gateway.shared.redis_url``): whether it answered when last asked, and its failed
    round trips since start by reason (a fixed set of names, shared_limits.FAILURE_REASONS)."""

    up: bool
    failures: Mapping[str, int]


@dataclass(frozen=True, slots=True)
class TokenCacheSnapshot:
    """The verified-token cache (``gateway.auth.oauth.token_cache_s``): tokens held now, its size limit, and the
    tokens it dropped since start to make room or because their key left the issuer's JWKS."""

    entries: int
    limit: int
    evicted: int
    forgotten: int


@dataclass(frozen=True, slots=True)
class OAuthSnapshot:
    """The JWT access tokens asked about since start (``gateway.auth.oauth``), by result (a fixed set of names,
    auth.oauth.VERIFICATION_RESULTS), and the cache (None when it is off). Counts only: never a token or a claim."""

    verifications: Mapping[str, int]
    token_cache: TokenCacheSnapshot | None = None


@dataclass(frozen=True, slots=True)
class StateSnapshot:
    """What the gateway is doing now, as a scrape reads it."""

    backends: Sequence[BackendSnapshot] = ()
    adapters: Sequence[AdapterSnapshot] = ()
    ledger: LedgerStatistics | None = None  # None: the ledger is off
    catalog_tools: int = 0
    pins_pending: int = 0
    shared_store: SharedStoreSnapshot | None = None  # None: no gateway.shared.redis_url
    oauth: OAuthSnapshot | None = None  # None: no gateway.auth.oauth


class _Step(Protocol):
    """What the metrics need of one chain step (an ``AuditStep`` is one)."""

    @property
    def provider(self) -> str: ...

    @property
    def outcome(self) -> str: ...


class _StateCollector(Collector):
    def __init__(self, name: str, version: str) -> None:
        self._name = name
        self._version = version
        self.source: Callable[[], StateSnapshot] = StateSnapshot

    def collect(self) -> Iterator[Metric]:
        snapshot = self.source()
        info = GaugeMetricFamily(f"{PREFIX}_info", "The gateway's name and version.", labels=["name", "version"])
        info.add_metric([self._name, self._version], 1)
        yield info
        yield GaugeMetricFamily(f"{PREFIX}_catalog_tools", "Tools published in the catalog.", snapshot.catalog_tools)
        yield GaugeMetricFamily(
            f"{PREFIX}_pins_pending",
            "Server tools new or changed since approval (pin: warn or enforce), waiting for gateway pins approve.",
            snapshot.pins_pending,
        )
        state = GaugeMetricFamily(
            f"{PREFIX}_backend_state",
            "1 for each backend's current state, 0 for the others.",
            labels=["backend", "kind", "state"],
        )
        tools = GaugeMetricFamily(f"{PREFIX}_backend_tools", "Tools each backend offers now.", labels=["backend"])
        for backend in snapshot.backends:
            for name in BACKEND_STATES:
                state.add_metric([backend.name, backend.kind, name], 1.0 if backend.state == name else 0.0)
            tools.add_metric([backend.name], backend.tools)
        yield state
        yield tools
        live = GaugeMetricFamily(
            f"{PREFIX}_adapter_live_processes", "Subprocesses an adapter has running now.", labels=["backend"]
        )
        waiting = GaugeMetricFamily(
            f"{PREFIX}_adapter_waiting_calls", "Calls waiting for a free adapter slot.", labels=["backend"]
        )
        for adapter in snapshot.adapters:
            live.add_metric([adapter.name], adapter.live_processes)
            waiting.add_metric([adapter.name], adapter.waiting_calls)
        yield live
        yield waiting
        ledger = snapshot.ledger
        if ledger is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_ledger_pending_rows", "Audit rows accepted and not yet committed.", ledger.pending
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_ledger_pending_rows_peak", "The most audit rows ever pending at once.", ledger.peak_pending
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_ledger_pending_rows_limit",
                "Pending audit rows beyond which callers wait (back-pressure).",
                ledger.max_pending,
            )
            yield CounterMetricFamily(f"{PREFIX}_ledger_rows_written", "Audit rows committed.", ledger.rows_written)
            yield CounterMetricFamily(f"{PREFIX}_ledger_commits", "Audit ledger transactions.", ledger.commits)
            yield CounterMetricFamily(
                f"{PREFIX}_ledger_rows_pruned", "Audit rows deleted by retention.", ledger.rows_pruned
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_ledger_spooling",
                "1 while the PostgreSQL ledger is unreachable and rows are committed to the local spool.",
                int(ledger.spooling),
            )
            yield GaugeMetricFamily(
                f"{PREFIX}_ledger_spooled_rows",
                "Audit rows in the local spool waiting to be replayed into PostgreSQL.",
                ledger.spooled_rows,
            )
        shared = snapshot.shared_store
        if shared is not None:
            yield GaugeMetricFamily(
                f"{PREFIX}_shared_store_up",
                "1 while the shared limits' Redis answers (when last asked: a request, or the probe every few "
                "seconds), 0 while it does not.",
                int(shared.up),
            )
            failures = CounterMetricFamily(
                f"{PREFIX}_shared_store_failures",
                "Round trips to the shared limits' Redis that failed, by reason.",
                labels=["reason"],
            )
            for reason, count in shared.failures.items():
                failures.add_metric([reason], count)
            yield failures
        if snapshot.oauth is not None:
            yield from _oauth_metrics(snapshot.oauth)


def _oauth_metrics(oauth: OAuthSnapshot) -> Iterator[Metric]:
    verifications = CounterMetricFamily(
        f"{PREFIX}_oauth_token_verifications",
        "JWT access tokens presented, by result: accepted from the cache (cached) or after the full check "
        "(verified), refused with 401 or 403 (refused), or not judged because the issuer's keys could not be had "
        "(unavailable).",
        labels=["result"],
    )
    for result, count in oauth.verifications.items():
        verifications.add_metric([result], count)
    yield verifications
    cache = oauth.token_cache
    if cache is None:
        return
    yield GaugeMetricFamily(f"{PREFIX}_oauth_token_cache_entries", "Verified tokens remembered now.", cache.entries)
    yield GaugeMetricFamily(
        f"{PREFIX}_oauth_token_cache_entries_limit",
        "The most verified tokens remembered at once (token_cache_size).",
        cache.limit,
    )
    yield CounterMetricFamily(
        f"{PREFIX}_oauth_token_cache_evicted",
        "Verified tokens forgotten to make room for another (least recently used first).",
        cache.evicted,
    )
    yield CounterMetricFamily(
        f"{PREFIX}_oauth_token_cache_forgotten",
        "Verified tokens forgotten at once because their issuer stopped publishing the key that verified them.",
        cache.forgotten,
    )


class _Timed:
    """A count and a latency histogram under the same labels; each label set's children are made once."""

    def __init__(
        self,
        registry: CollectorRegistry,
        count: tuple[str, str],
        duration: tuple[str, str],
        labels: tuple[str, str, str],
    ) -> None:
        self._count = Counter(*count, labels, namespace=PREFIX, registry=registry)
        self._duration = Histogram(*duration, labels, namespace=PREFIX, registry=registry, buckets=DURATION_BUCKETS_S)
        self._children: dict[tuple[str, str, str], tuple[Counter, Histogram]] = {}

    def observe(self, key: tuple[str, str, str], duration_s: float) -> None:
        children = self._children.get(key)
        if children is None:
            children = self._children[key] = (self._count.labels(*key), self._duration.labels(*key))
        children[0].inc()
        children[1].observe(duration_s)


class GatewayMetrics:
    """The gateway's metrics. ``observe_call`` runs once per call; ``exposition()`` renders a scrape.

    Args:
        name: the gateway's name (``gateway.name``), for ``mcp_gateway_info``.
        version: the gateway's version.
        process: also export the process's CPU, memory and file descriptors (``process_*``).
    """

    def __init__(self, name: str = "mcp-gateway", version: str = "", *, process: bool = True) -> None:
        # No ``*_created`` series: they double what every scrape carries and no dashboard here reads them. (The
        # switch is the library's, process-wide; the gateway owns its process.)
        disable_created_metrics()  # type: ignore[no-untyped-call]
        self.registry = CollectorRegistry(auto_describe=False)
        self._calls = _Timed(
            self.registry,
            ("tool_calls", "Tool calls answered, by published tool, the provider that served it, and status."),
            (
                "tool_call_duration_seconds",
                "Tool call latency in the gateway, from routing to the audit row committed.",
            ),
            ("tool", "provider", "status"),
        )
        self._fallbacks = Counter(
            "fallback_steps",
            "Provider steps that failed and moved the call on to the next rung or provider, by outcome.",
            ["tool", "provider", "outcome"],
            namespace=PREFIX,
            registry=self.registry,
        )
        self._unknown = Counter(
            "unknown_tool_calls",
            "Calls naming no published tool (a JSON-RPC error).",
            namespace=PREFIX,
            registry=self.registry,
        )
        self._requests = _Timed(
            self.registry,
            (
                "requests",
                "Requests besides tool calls that reached a backend (resources/read, prompts/get, "
                "completion/complete, resources/subscribe and unsubscribe), by method, the backend that answered "
                "(or was last asked), and status.",
            ),
            (
                "request_duration_seconds",
                "Latency of those requests in the gateway, from routing to the audit row committed.",
            ),
            ("method", "backend", "status"),
        )
        self._tokens = Counter(
            "tokens",
            "Tokens of tool calls: `in` the arguments, `out` the answers as delivered, by published tool and caller "
            "(a static token's name, or an OAuth caller's; '' for nobody in particular).",
            ["tool", "caller", "direction"],
            namespace=PREFIX,
            registry=self.registry,
        )
        self._limited = Counter(
            "caller_limited",
            "Requests refused by a per-caller limit (gateway.auth.caller_limits), by rule and limit",
            ["rule", "limit"],
            namespace=PREFIX,
            registry=self.registry,
        )
        self._state = _StateCollector(name, version)
        self.registry.register(self._state)
        if process:
            ProcessCollector(registry=self.registry)

    def watch(self, source: Callable[[], StateSnapshot]) -> None:
        """Read the gateway's current state from ``source`` at every scrape."""
        self._state.source = source

    def observe_call(self, tool: str, status: str, duration_s: float, steps: Iterable[_Step]) -> None:
        """Count one answered call and its latency, and every step of it that failed over."""
        provider = NO_PROVIDER
        for step in steps:
            if step.outcome in SERVED_OUTCOMES:
                provider = step.provider
            elif step.outcome not in _NOT_A_FALLBACK:
                self._fallbacks.labels(tool, step.provider, step.outcome).inc()
        self._calls.observe((tool, provider, status), duration_s)

    def observe_tokens(self, tool: str, caller: str | None, tokens_in: int, tokens_out: int) -> None:
        """Count one call's tokens in and out."""
        self._tokens.labels(tool, caller or "", "in").inc(tokens_in)
        self._tokens.labels(tool, caller or "", "out").inc(tokens_out)

    def observe_request(self, method: str, backend: str, status: str, duration_s: float) -> None:
        """Count one request that is not a tool call (its labels are bounded: a method, a configured backend)."""
        self._requests.observe((method, backend, status), duration_s)

    def observe_unknown_tool(self) -> None:
        self._unknown.inc()

    def observe_limited(self, rule: str, limit: str) -> None:
        """Count one request refused by a per-caller limit."""
        self._limited.labels(rule, limit).inc()

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (``CONTENT_TYPE``)."""
        return generate_latest(self.registry)
