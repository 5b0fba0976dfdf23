"""Observability: which configured values are secrets and that none of them leaks (logs, ledger, /status, /metrics),
the correlation id on every log line of a call, Prometheus metrics and their auth switch, and OpenTelemetry spans.

Router-level behaviour runs in memory against scripted backends (gateway/testing.py); what only the real process can
show (a secret a backend prints reaching neither the log nor the ledger; spans exported and the trace context reaching
a downstream server) runs the real gateway (tests/fixtures/gateway_proc.py).
"""

from __future__ import annotations

import json
import signal
import subprocess
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest
import structlog
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import SpanKind, StatusCode
from prometheus_client.parser import text_string_to_metric_families
from structlog.testing import capture_logs

from gateway.auth.tokens import Tokens
from gateway.backends.base import Backend
from gateway.calls import CallContext, Caller, Upstream
from gateway.config import TracingSettings, parse_config
from gateway.core.catalog import Catalog
from gateway.core.router import META_KEY, Router
from gateway.core.runtime import Gateway
from gateway.errors import BackendTimeout, BackendUnavailable
from gateway.front.http.app import build_app
from gateway.front.http.status import metrics_need_token
from gateway.ledger.engines import open_reader
from gateway.observe.logs import MASK, Redactor, config_secrets, is_secret_name, redactor
from gateway.observe.metrics import NO_PROVIDER, GatewayMetrics
from gateway.observe.tracing import CallTracer, open_tracing
from gateway.testing import FakeBackend, FakeRecorder, text_result
from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.anyio

CONFIG = """
servers:
  a:
    transport: stdio
    command: x
  b:
    transport: stdio
    command: x
routes:
  search:
    providers: [a/search, b/search]
    audit: {q: 4}
"""


class LoggingBackend(FakeBackend):
    """A scripted backend that writes a log line of its own while it serves a call, as real backends may."""

    async def call_tool(self, tool: str, arguments: dict[str, Any], **kw: Any) -> Any:
        structlog.get_logger("gateway.backend").info("backend.working", backend=self.name)
        return await super().call_tool(tool, arguments, **kw)


class Setup:
    def __init__(self, *backends: FakeBackend, tracer: CallTracer | None = None) -> None:
        self.config = parse_config(CONFIG, file="federation.yaml", env={})
        self.backends: dict[str, Backend] = {b.name: b for b in backends}
        self.catalog = Catalog.build(self.config, self.backends)
        self.recorder = FakeRecorder()
        self.metrics = GatewayMetrics("test", "0", process=False)
        self.router = Router(
            lambda: self.catalog, lambda: self.backends, self.recorder, metrics=self.metrics, tracer=tracer
        )

    async def call(self, name: str, arguments: dict[str, Any] | None = None, **kw: Any) -> Any:
        with anyio.fail_after(5):
            return await self.router.call(name, arguments, **kw)


def samples(metrics: GatewayMetrics) -> dict[tuple[str, frozenset[tuple[str, str]]], float]:
    """Every sample of a scrape, keyed by (sample name, labels)."""
    out = {}
    for family in text_string_to_metric_families(metrics.exposition().decode()):
        for sample in family.samples:
            out[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return out


def labels(**kw: str) -> frozenset[tuple[str, str]]:
    return frozenset(kw.items())


# ------------------------------------------------------------------------------------------------ secrets


@pytest.mark.parametrize(
    "name",
    [
        "Authorization",
        "Proxy-Authorization",
        "X-Api-Key",
        "Cookie",
        "QMD_TOKEN",
        "access_token",
        "OPENAI_API_KEY",
        "AWS_SECRET_ACCESS_KEY",
        "DB_PASSWORD",
        "PGPASSWORD",
        "SSH_PASSPHRASE",
        "GOOGLE_APPLICATION_CREDENTIALS",
        "SIGNING_KEY",
        "GITHUB_PAT",
        "key",
    ],
)
def test_names_that_say_they_hold_a_secret_are_secret_names(name: str) -> None:
    assert is_secret_name(name)


@pytest.mark.parametrize("name", ["PATH", "HOME", "XDG_CACHE_HOME", "MEMORY_FILE_PATH", "Accept", "MONKEY", "keyword"])
def test_ordinary_names_are_not_secret_names(name: str) -> None:
    assert not is_secret_name(name)


def test_config_secrets_takes_secret_named_and_listed_values_and_leaves_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("UPSTREAM_API_KEY", "passed-through-key")
    monkeypatch.setenv("LANG", "C.UTF-8")
    monkeypatch.setenv("HTTPS_PROXY", "http://alice:proxy%21pass@proxy.corp.invalid:3128")  # passed by default
    monkeypatch.setenv("NO_PROXY", "localhost,127.0.0.1")
    config = parse_config(
        """
gateway:
  tracing: {exporter: none, headers: {x-honeycomb-team: collector-credential}}
servers:
  mem:
    transport: stdio
    command: x
    env: {MEMORY_TOKEN: stdio-token-value, DATABASE_URL: "postgres://u:pw@h/db", MEMORY_FILE_PATH: ./memory.jsonl}
    secret_env: [DATABASE_URL]
  remote:
    transport: streamable_http
    url: http://127.0.0.1:9/mcp
    headers: {Authorization: "Bearer header-bearer-value", X-Tenant: tenant-secret, Accept: application/json}
    secret_headers: [x-tenant]
adapters:
  qmd:
    command: qmd
    env: {XDG_CACHE_HOME: ./.cache, QMD_PASSWORD: adapter-password}
    pass_env: [PATH, LANG, UPSTREAM_API_KEY]
    tools: {s: {argv: [search]}}
""",
        file="federation.yaml",
        env={},
    )
    secrets = set(config_secrets(config))
    assert secrets == {
        "stdio-token-value",
        "postgres://u:pw@h/db",
        "Bearer header-bearer-value",
        "header-bearer-value",  # the credential alone, as a program might print it
        "tenant-secret",
        "adapter-password",
        "passed-through-key",
        "collector-credential",
        "proxy%21pass",  # a proxy's password, as written and as a program would print it
        "proxy!pass",
    }


def test_a_boolean_or_number_under_a_secret_looking_key_is_kept() -> None:
    out = Redactor()(None, "info", {"event": "gateway.serving", "auth": True, "tokens": 2, "token": "abcdef"})
    assert (out["auth"], out["tokens"], out["token"]) == (True, 2, MASK)


# ------------------------------------------------------------------------------------------------ logs of a call


async def test_every_log_line_written_while_a_call_runs_carries_its_correlation_id_and_tool() -> None:
    a = LoggingBackend("a", ["search"])
    a.script("search", BackendUnavailable("a", "connection refused"))
    setup = Setup(a, LoggingBackend("b", ["search"]))

    with capture_logs(processors=[structlog.contextvars.merge_contextvars]) as logs:
        result = await setup.call(
            "search", {"q": "hello"}, ctx=CallContext(upstream=Upstream(Caller("alice")), client_name="cli")
        )

    correlation_id = result.meta[META_KEY]["id"]
    assert [line["event"] for line in logs] == ["backend.working", "tool.step_failed", "backend.working", "tool.call"]
    assert all(line["correlation_id"] == correlation_id and line["tool"] == "search" for line in logs)
    assert [line.get("provider") for line in logs[:3]] == ["a/search", "a/search", "b/search"]
    assert "provider" not in logs[3]  # the canonical line is the call's, not a step's
    assert setup.recorder.records[0].correlation_id == correlation_id


async def test_the_canonical_line_names_the_caller_client_session_and_chain() -> None:
    setup = Setup(FakeBackend("a", ["search"]), FakeBackend("b", ["search"]))
    ctx = CallContext(
        upstream=Upstream(Caller("alice")), session_id="s-1", client_name="claude-code", client_version="2.1"
    )
    with capture_logs() as logs:
        await setup.call("search", {"q": "x"}, ctx=ctx)
    (line,) = [entry for entry in logs if entry["event"] == "tool.call"]
    assert {
        k: line[k] for k in ("status", "served_by", "chain", "caller", "client", "client_version", "session_id")
    } == {
        "status": "ok",
        "served_by": "a/search",
        "chain": ["a/search:ok"],
        "caller": "alice",
        "client": "claude-code",
        "client_version": "2.1",
        "session_id": "s-1",
    }
    assert line["result_bytes"] == len("a/search answered") and line["duration_ms"] >= 0


async def test_a_secret_in_a_step_reason_is_scrubbed_from_the_log_the_ledger_row_and_meta() -> None:
    planted = "planted-reason-secret-7f3a"
    redactor.add([planted])
    a = FakeBackend("a", ["search"])
    a.script("search", BackendUnavailable("a", f"process exited with code 1: bad key {planted}"))
    setup = Setup(a, FakeBackend("b", ["search"]))

    with capture_logs() as logs:
        result = await setup.call("search", {"q": "x"})

    (row,) = setup.recorder.records
    assert row.chain[0].reason == f"process exited with code 1: bad key {MASK}"
    assert planted not in json.dumps(result.meta) and MASK in json.dumps(result.meta)
    assert planted not in repr(logs)


# ------------------------------------------------------------------------------------------------ metrics


async def test_each_call_is_counted_once_by_tool_serving_provider_and_status() -> None:
    a, b = FakeBackend("a", ["search"]), FakeBackend("b", ["search"])
    a.script("search", text_result("ok"), text_result("tool said no", is_error=True), BackendTimeout("a", "15 s"))
    b.script("search", text_result("fallback"))
    setup = Setup(a, b)
    for _ in range(3):
        await setup.call("search", {"q": "x"})

    got = samples(setup.metrics)
    calls = "mcp_gateway_tool_calls_total"
    assert got[(calls, labels(tool="search", provider="a/search", status="ok"))] == 1
    assert got[(calls, labels(tool="search", provider="a/search", status="error"))] == 1
    assert got[(calls, labels(tool="search", provider="b/search", status="degraded"))] == 1
    count = "mcp_gateway_tool_call_duration_seconds_count"
    assert got[(count, labels(tool="search", provider="b/search", status="degraded"))] == 1
    fallback = "mcp_gateway_fallback_steps_total"
    assert got == got | {(fallback, labels(tool="search", provider="a/search", outcome="timeout")): 1.0}


async def test_a_call_no_provider_served_is_counted_under_provider_none() -> None:
    a, b = FakeBackend("a", ["search"]), FakeBackend("b", ["search"])
    a.script("search", BackendUnavailable("a", "down"))
    b.script("search", BackendTimeout("b", "slow"))
    setup = Setup(a, b)
    await setup.call("search", {})
    got = samples(setup.metrics)
    assert got[("mcp_gateway_tool_calls_total", labels(tool="search", provider=NO_PROVIDER, status="timeout"))] == 1
    fallback = "mcp_gateway_fallback_steps_total"
    assert got[(fallback, labels(tool="search", provider="a/search", outcome="unavailable"))] == 1
    assert got[(fallback, labels(tool="search", provider="b/search", outcome="timeout"))] == 1


async def test_an_unknown_tool_is_counted_without_its_name_so_clients_cannot_grow_the_label_set() -> None:
    setup = Setup(FakeBackend("a", ["search"]), FakeBackend("b", ["search"]))
    for n in range(5):
        with pytest.raises(Exception, match="no_such"):
            await setup.call(f"no_such_{n}")
    text = setup.metrics.exposition().decode()
    assert "no_such" not in text
    assert samples(setup.metrics)[("mcp_gateway_unknown_tool_calls_total", frozenset())] == 5


def test_gateway_state_is_read_at_scrape_time() -> None:
    from gateway.ledger.commits import LedgerStatistics
    from gateway.observe.metrics import AdapterSnapshot, BackendSnapshot, StateSnapshot

    metrics = GatewayMetrics("kg", "9.9", process=False)
    ledger = LedgerStatistics(
        pending=3, peak_pending=7, max_pending=1024, rows_written=40, commits=12, largest_commit=9, rows_pruned=0
    )
    metrics.watch(
        lambda: StateSnapshot(
            backends=[BackendSnapshot("qmd", "adapter", "ready", 2), BackendSnapshot("mem", "stdio", "failed", 0)],
            adapters=[AdapterSnapshot("qmd", live_processes=2, running_calls=2, waiting_calls=1)],
            ledger=ledger,
            catalog_tools=5,
            pins_pending=2,
        )
    )
    got = samples(metrics)
    assert got[("mcp_gateway_info", labels(name="kg", version="9.9"))] == 1
    assert got[("mcp_gateway_backend_state", labels(backend="mem", kind="stdio", state="failed"))] == 1
    assert got[("mcp_gateway_backend_state", labels(backend="mem", kind="stdio", state="ready"))] == 0
    assert got[("mcp_gateway_adapter_live_processes", labels(backend="qmd"))] == 2
    assert got[("mcp_gateway_adapter_waiting_calls", labels(backend="qmd"))] == 1
    assert got[("mcp_gateway_ledger_pending_rows", frozenset())] == 3
    assert got[("mcp_gateway_ledger_rows_written_total", frozenset())] == 40
    assert got[("mcp_gateway_catalog_tools", frozenset())] == 5
    assert got[("mcp_gateway_pins_pending", frozenset())] == 2
    assert not any(name.startswith("mcp_gateway_oauth_") for name, _ in got)  # no gateway.auth.oauth


def test_the_oauth_metrics_carry_every_result_and_the_cache_only_while_it_is_on() -> None:
    from gateway.observe.metrics import OAuthSnapshot, StateSnapshot, TokenCacheSnapshot

    metrics = GatewayMetrics("kg", "9.9", process=False)
    counted = {"cached": 0, "verified": 3, "refused": 2, "unavailable": 0}
    metrics.watch(lambda: StateSnapshot(oauth=OAuthSnapshot(counted)))  # token_cache_s: 0
    got = {key: value for key, value in samples(metrics).items() if key[0].startswith("mcp_gateway_oauth_")}
    name = "mcp_gateway_oauth_token_verifications_total"
    assert got == {(name, labels(result=result)): count for result, count in counted.items()}

    metrics.watch(lambda: StateSnapshot(oauth=OAuthSnapshot(counted, TokenCacheSnapshot(2, 8, 1, 4))))
    got = samples(metrics)
    assert got[("mcp_gateway_oauth_token_cache_entries", frozenset())] == 2
    assert got[("mcp_gateway_oauth_token_cache_entries_limit", frozenset())] == 8
    assert got[("mcp_gateway_oauth_token_cache_evicted_total", frozenset())] == 1
    assert got[("mcp_gateway_oauth_token_cache_forgotten_total", frozenset())] == 4


@pytest.mark.parametrize(
    ("setting", "host", "needed"),
    [
        ("", "127.0.0.1", False),
        ("", "localhost", False),
        ("", "0.0.0.0", True),
        ("", "10.1.2.3", True),
        ("metrics_requires_token: true", "127.0.0.1", True),
        ("metrics_requires_token: false", "0.0.0.0", False),
    ],
)
def test_metrics_need_the_token_unless_on_loopback_or_configured_otherwise(
    setting: str, host: str, needed: bool
) -> None:
    config = parse_config(f"gateway:\n  auth: {{{setting}}}\n", file="federation.yaml", env={})
    assert metrics_need_token(Gateway(config), host) is needed


@pytest.fixture
async def empty_gateway() -> AsyncIterator[Gateway]:
    config = parse_config("gateway:\n  audit: {enabled: false}\n", file="federation.yaml", env={})
    async with Gateway(config).running() as gateway:
        yield gateway


@pytest.mark.parametrize(("host", "status"), [("127.0.0.1", 200), ("0.0.0.0", 401)])
async def test_metrics_endpoint_follows_the_token_rule_and_serves_the_prometheus_format(
    empty_gateway: Gateway, host: str, status: int
) -> None:
    app = build_app(empty_gateway, host=host, tokens=Tokens("alice=tok-alice"))
    transport = httpx2.ASGITransport(app=app)
    async with httpx2.AsyncClient(transport=transport, base_url="http://127.0.0.1:8080") as http:
        anonymous = await http.get("/metrics")
        authorized = await http.get("/metrics", headers={"Authorization": "Bearer tok-alice"})
    assert anonymous.status_code == status
    assert authorized.status_code == 200
    assert authorized.headers["content-type"].startswith("text/plain")
    assert "mcp_gateway_info{" in authorized.text and "mcp_gateway_catalog_tools 0.0" in authorized.text


# ------------------------------------------------------------------------------------------------ tracing


@pytest.fixture
def spans() -> Iterator[tuple[CallTracer, InMemorySpanExporter]]:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield CallTracer(provider.get_tracer("test")), exporter
    provider.shutdown()


async def test_a_traced_call_has_one_span_with_a_child_span_per_step(
    spans: tuple[CallTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    a, b = FakeBackend("a", ["search"]), FakeBackend("b", ["search"])
    a.script("search", BackendTimeout("a", "timed out after 15 s"))
    setup = Setup(a, b, tracer=tracer)

    result = await setup.call(
        "search", {"q": "x"}, ctx=CallContext(upstream=Upstream(Caller("alice")), session_id="s-9")
    )

    finished: list[ReadableSpan] = list(exporter.get_finished_spans())
    assert [s.name for s in finished] == ["step a/search", "step b/search", "tools/call search"]
    step_a, step_b, call = finished
    assert call.kind is SpanKind.SERVER
    assert call.attributes is not None and step_a.attributes is not None
    assert call.attributes["mcp_gateway.correlation_id"] == result.meta[META_KEY]["id"]
    assert (call.attributes["mcp_gateway.status"], call.attributes["mcp_gateway.served_by"]) == ("degraded", "b/search")
    assert (call.attributes["mcp_gateway.caller"], call.attributes["mcp.session.id"]) == ("alice", "s-9")
    assert all(s.parent is not None and s.parent.span_id == call.context.span_id for s in (step_a, step_b))
    assert step_a.attributes["mcp_gateway.outcome"] == "timeout"
    assert step_a.status.status_code is StatusCode.ERROR and step_a.status.description == "timed out after 15 s"
    assert step_b.status.status_code is StatusCode.UNSET


async def test_a_call_continues_the_clients_trace_when_its_meta_carries_a_traceparent(
    spans: tuple[CallTracer, InMemorySpanExporter],
) -> None:
    tracer, exporter = spans
    setup = Setup(FakeBackend("a", ["search"]), FakeBackend("b", ["search"]), tracer=tracer)
    trace_id = "4bf92f3577b34da6a3ce929d0e0e4736"
    carrier = {"traceparent": f"00-{trace_id}-00f067aa0ba902b7-01"}
    await setup.call("search", {}, ctx=CallContext(upstream=Upstream(meta=carrier)))
    call = exporter.get_finished_spans()[-1]
    assert format(call.context.trace_id, "032x") == trace_id
    assert call.parent is not None and format(call.parent.span_id, "016x") == "00f067aa0ba902b7"


def test_a_direct_call_hands_on_the_current_trace_and_adds_nothing_without_one() -> None:
    from opentelemetry import trace
    from opentelemetry.trace import NonRecordingSpan, SpanContext, TraceFlags

    from gateway.backends.mcp.fastpath import _client_span

    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)  # tracing off: no provider installed
    meta: dict[str, Any] = {}
    with _client_span("tools/call", "echo", "gw-1", meta):
        assert not trace.get_current_span().get_span_context().is_valid
    assert meta == {}
    # A tracer of the gateway's own that is not the process's (``install_global=False``): its step span is current,
    # and the downstream is handed that trace.
    trace_id, span_id = 0x4BF92F3577B34DA6A3CE929D0E0E4736, 0x00F067AA0BA902B7
    step = NonRecordingSpan(SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(1)))
    with trace.use_span(step), _client_span("tools/call", "echo", "gw-2", meta):
        pass
    assert meta["traceparent"] == f"00-{trace_id:032x}-{span_id:016x}-01"


async def test_tracing_is_off_by_default_and_then_yields_no_tracer() -> None:
    assert TracingSettings().exporter == "none"
    async with open_tracing(TracingSettings(), service_name="gw", version="0") as tracer:
        assert tracer is None


async def test_the_console_exporter_writes_spans_to_stderr_and_flushes_them_on_exit(
    capsys: pytest.CaptureFixture[str],
) -> None:
    settings = TracingSettings(exporter="console")
    async with open_tracing(settings, service_name="gw", version="0", install_global=False) as tracer:
        assert tracer is not None
        setup = Setup(FakeBackend("a", ["search"]), FakeBackend("b", ["search"]), tracer=tracer)
        await setup.call("search", {})
    captured = capsys.readouterr()
    assert "tools/call" not in captured.out  # stdout is the MCP protocol in `serve --stdio`
    assert '"name": "tools/call search"' in captured.err and '"service.name": "gw"' in captured.err


# ------------------------------------------------------------------------------------------------ the real process


def _yaml(items: list[str]) -> str:
    return json.dumps(items)


def _spans_in(output: str) -> list[dict[str, Any]]:
    """The span objects the console exporter printed (indented JSON) among the JSON log lines."""
    decoder = json.JSONDecoder()
    found, index = [], 0
    while (start := output.find("{", index)) != -1:
        try:
            value, index = decoder.raw_decode(output, start)
        except json.JSONDecodeError:
            index = start + 1
            continue
        if isinstance(value, dict) and "context" in value and "name" in value:
            found.append(value)
    return found


def _stop(server: RunningServer) -> str:
    """SIGTERM the gateway, wait for its clean exit (spans flushed, ledger closed) and return its output."""
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=20)
    return server.output()


def _ledger_evidence(folder: Path) -> tuple[str, str]:
    """The ledger's files as text (the database and any WAL left), and ``gateway audit query --json`` on it."""
    files = b"".join(path.read_bytes() for path in folder.glob("audit.db*"))
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "audit", "-c", str(folder / "federation.yaml"), "query", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return files.decode("utf-8", "replace"), done.stdout


@pytest.fixture(scope="module")
def echo_http(downstream: Downstreams) -> Downstream:
    return downstream("echo", "streamable_http", "--name", "remote")


async def test_no_planted_secret_reaches_the_log_the_ledger_status_or_metrics(
    tmp_path: Path, echo_http: Downstream
) -> None:
    secrets = {
        "token": "planted-bearer-token-0b1c",
        "stdio_env": "planted-stdio-env-9d2e",
        "header": "planted-header-value-77aa",
        "custom_header": "planted-custom-header-31f0",
        "adapter_env": "planted-adapter-password-c4d5",
    }
    config = f"""
gateway:
  name: secrets
  audit: {{path: audit.db}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {_yaml(echo_argv()[1:])}
    env: {{ECHO_API_TOKEN: {secrets["stdio_env"]}}}
  broken:
    transport: stdio
    command: {PYTHON}
    args: ["-c", "import os, sys; print('refused key', os.environ['BROKEN_SETTING'], file=sys.stderr); sys.exit(3)"]
    env: {{BROKEN_SETTING: {secrets["stdio_env"]}-broken}}
    secret_env: [BROKEN_SETTING]
  remote:
    transport: streamable_http
    url: {echo_http.url()}
    headers: {{Authorization: "Bearer {secrets["header"]}", X-Tenant: {secrets["custom_header"]}}}
    secret_headers: [X-Tenant]
adapters:
  leaky:
    command: {PYTHON}
    env: {{SERVICE_PASSWORD: {secrets["adapter_env"]}}}
    tools:
      login:
        argv: ["-c", "import os, sys; sys.stderr.write('denied for ' + os.environ['SERVICE_PASSWORD']); sys.exit(2)"]
routes:
  login_or_echo:
    providers: [leaky/login, {{provider: e/echo, arguments: {{text: fallback}}}}]
"""
    token = secrets["token"]
    with run_gateway(config, tmp_path, tokens=f"alice={token}") as gateway:
        async with mcp_session(gateway.url(), token=token) as session:
            with anyio.fail_after(30):
                degraded = await session.call_tool("login_or_echo", {})
                echoed = await session.call_tool("echo", {"text": "hi"})  # remote's: e/echo serves the route
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}) as http:

            async def broken_reported() -> bool:
                doc = (await http.get(gateway.url("/status"))).json()
                return any(b["name"] == "broken" and b["state"] == "failed" for b in doc["backends"])

            await eventually(broken_reported, within=20)
            status = (await http.get(gateway.url("/status"))).text
            metrics = (await http.get(gateway.url("/metrics"))).text
        log = _stop(gateway)

    ledger, audit_json = await anyio.to_thread.run_sync(_ledger_evidence, tmp_path)
    for where, text in [
        ("log", log),
        ("ledger", ledger),
        ("status", status),
        ("metrics", metrics),
        ("audit query", audit_json),
    ]:
        leaked = [name for name, value in secrets.items() if value in text]
        assert leaked == [], f"{leaked} leaked into the {where}"
    # ... and the paths that carried them were exercised: the redacted reasons are there, masked.
    assert degraded.meta is not None and degraded.meta[META_KEY]["status"] == "degraded"
    assert echoed.content[0].text == "hi"  # type: ignore[union-attr]
    rows = open_reader(tmp_path / "audit.db").query()
    (login_row,) = [r for r in rows if r.tool == "login_or_echo"]
    assert login_row.chain[0].reason is not None and f"denied for {MASK}" in login_row.chain[0].reason
    assert login_row.caller == "alice"
    assert f"refused key {MASK}" in status
    assert f"refused key {MASK}" in log


@pytest.mark.spawns
async def test_the_real_gateway_exports_spans_and_hands_the_trace_to_the_downstream(tmp_path: Path) -> None:
    config = f"""
gateway:
  audit: {{enabled: false}}
  tracing: {{exporter: console, service_name: traced-gateway}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {_yaml(echo_argv()[1:])}
"""
    with run_gateway(config, tmp_path) as gateway:
        async with mcp_session(gateway.url()) as session:
            with anyio.fail_after(30):
                result = await session.call_tool("echo", {"text": "traced"})
        output = _stop(gateway)

    correlation_id = result.meta[META_KEY]["id"] if result.meta else None
    by_name = {span["name"]: span for span in _spans_in(output)}
    call, step = by_name["tools/call echo"], by_name["step e/echo"]
    assert call["attributes"]["mcp_gateway.correlation_id"] == correlation_id
    assert call["resource"]["attributes"]["service.name"] == "traced-gateway"
    assert step["parent_id"] == call["context"]["span_id"]
    # The SDK's client span for the downstream request nests under the step: the trace reached the downstream.
    send = by_name["MCP send tools/call echo"]
    assert send["parent_id"] == step["context"]["span_id"]
    assert send["context"]["trace_id"] == call["context"]["trace_id"]
