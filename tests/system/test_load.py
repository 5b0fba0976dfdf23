"""Every call accounted for under load, through the real gateway process: N sessions x M calls with a known mix of
successes, ``isError`` answers, timeouts, fallbacks past a dead server and past a timeout, and refusals. Afterwards the
ledger holds exactly N x M rows, each with the status and chain its call was planned to have, the caller's name, the
session id and the client's name and version; the log holds one ``tool.call`` line per call; ``/metrics`` counted each
call once; and ``gateway audit stats`` prints per-tool percentiles. A second test SIGKILLs the gateway mid-load: every
call whose answer a client received has its row.

CI runs 8 sessions x 60 calls (``GATEWAY_LOAD_CALLS`` sets the calls per session; ``bench/bench_ledger.py --verify``
runs the full 8 x 1,000 with the same workload and checks).

Workload (``plan``): call ``i`` of session ``s`` carries the unique tag ``s{s}-{i}`` (so its ``args_hash`` finds its
row) and is, by ``i % 10``:
  ok        ``e__t0``      -> ok,       [e/t0:ok]
  error     ``e__fail``    -> error,    [e/fail:is_error]               (the downstream's isError answer)
  timeout   ``t__sleep``   -> timeout,  [t/sleep:timeout]               (t's timeout_s is 0.25 s)
  down      ``via_down``   -> degraded, [down/echo:unavailable, e/echo:ok]
  slow      ``via_slow``   -> degraded, [t/slow:timeout, e/echo:ok]
  refused   ``cli__say``   -> refused,  [gateway:refused]               (fails the adapter's published input schema)
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.core.router import META_KEY
from gateway.ledger.engines import open_reader
from gateway.ledger.records import AuditRecord, args_hash
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, echo_argv, mcp_session, run_gateway

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SESSIONS = 8
CALLS_PER_SESSION = int(os.environ.get("GATEWAY_LOAD_CALLS", "60"))
TOKEN = "load-test-token-5e6f"
CALLER = "loadtester"
TIMEOUT_S = 0.25
"""The timeout of server ``t``, whose calls are planned to time out; every other server has ``RELIABLE_TIMEOUT_S``."""
RELIABLE_TIMEOUT_S = 30.0
PREVIEW_CHARS = 4
LOAD_LIMIT_S = 600.0

MIX = ("ok", "error", "ok", "timeout", "down", "ok", "slow", "refused", "ok", "error")


def federation(audit_enabled: bool = True) -> str:
    """The load test's federation.yaml (also used by bench/bench_ledger.py)."""
    echo = json.dumps(echo_argv("--tools", "1")[1:])
    fake_cli = str(FIXTURES / "fake_cli.py")
    return f"""
version: 1
gateway:
  name: load
  audit: {{enabled: {str(audit_enabled).lower()}, path: audit.db}}
  naming: {{mode: always}}
  # Every planned timeout must reach its provider: a breaker opening mid-load would turn planned timeouts into
  # circuit_open steps (tests/test_reload.py covers the breaker itself).
  circuit_breaker: {{failure_threshold: 1000000}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {echo}
    timeout_s: {RELIABLE_TIMEOUT_S}
  t:
    transport: stdio
    command: {PYTHON}
    args: {echo}
    timeout_s: {TIMEOUT_S}
  down:
    transport: stdio
    command: definitely-not-a-command-xyz
adapters:
  cli:
    command: {PYTHON}
    tools:
      say:
        argv: [{json.dumps(fake_cli)}, echo, "{{text}}"]
        input_schema: {{type: object, required: [text], properties: {{text: {{type: string, minLength: 1}}}}}}
routes:
  via_down:
    providers: [down/echo, {{provider: e/echo, arguments: {{text: "{{tag}}"}}}}]
    schema_from: t/slow    # a schema without required arguments: the gateway holds each call to the one published
    audit: {{tag: {PREVIEW_CHARS}}}
  via_slow:
    providers:
      - {{provider: t/slow, arguments: {{seconds: 30, steps: 1}}}}
      - {{provider: e/echo, arguments: {{text: "{{tag}}"}}}}
    audit: {{tag: {PREVIEW_CHARS}}}
"""


@dataclass(frozen=True, slots=True)
class Planned:
    session: int
    index: int
    tool: str
    arguments: Mapping[str, Any]
    status: str
    chain: tuple[tuple[str, str], ...]


def plan(session: int, index: int) -> Planned:
    """What call ``index`` of ``session`` sends and how the ledger must record it."""
    tag = f"s{session}-{index}"
    kind = MIX[index % len(MIX)]
    if kind == "ok":
        return Planned(session, index, "e__t0", {"text": tag}, "ok", (("e/t0", "ok"),))
    if kind == "error":
        return Planned(session, index, "e__fail", {"message": tag}, "error", (("e/fail", "is_error"),))
    if kind == "timeout":
        return Planned(session, index, "t__sleep", {"seconds": 30, "tag": tag}, "timeout", (("t/sleep", "timeout"),))
    if kind == "down":
        chain = (("down/echo", "unavailable"), ("e/echo", "ok"))
        return Planned(session, index, "via_down", {"tag": tag}, "degraded", chain)
    if kind == "slow":
        return Planned(session, index, "via_slow", {"tag": tag}, "degraded", (("t/slow", "timeout"), ("e/echo", "ok")))
    return Planned(session, index, "cli__say", {"tag": tag}, "refused", (("gateway", "refused"),))


@dataclass(slots=True)
class Received:
    """What one client session saw: the correlation id and status of every answer, by the call's args hash."""

    session: int
    answers: dict[str, tuple[str, str]] = field(default_factory=dict)
    latencies_s: list[float] = field(default_factory=list)


def client_info(session: int) -> types.Implementation:
    return types.Implementation(name=f"load-client-{session}", version=f"1.{session}")


async def run_session(url: str, session: int, calls: int) -> Received:
    """One client session making ``calls`` planned calls in order."""
    received = Received(session)
    async with mcp_session(url, token=TOKEN, client_info=client_info(session)) as client:
        for index in range(calls):
            planned = plan(session, index)
            started = anyio.current_time()
            result = await client.call_tool(planned.tool, dict(planned.arguments))
            received.latencies_s.append(anyio.current_time() - started)
            assert isinstance(result, types.CallToolResult) and result.meta is not None
            entry = result.meta[META_KEY]
            received.answers[args_hash(planned.arguments)] = (entry["id"], entry["status"])
    return received


async def run_load(url: str, sessions: int, calls: int) -> list[Received]:
    results: list[Received] = []

    async def one(session: int) -> None:
        results.append(await run_session(url, session, calls))

    with anyio.fail_after(LOAD_LIMIT_S):
        async with anyio.create_task_group() as tg:
            for session in range(sessions):
                tg.start_soon(one, session)
    return sorted(results, key=lambda r: r.session)


def check_ledger(rows: Sequence[AuditRecord], received: Sequence[Received], calls: int) -> None:
    """Exactly one row per planned call, each as planned; one session id per client session."""
    assert len(rows) == len(received) * calls
    by_hash = {row.args_hash: row for row in rows}
    assert len(by_hash) == len(rows), "two rows for one call"
    sessions: dict[int, set[str | None]] = {}
    for client in received:
        assert len(client.answers) == calls
        for index in range(calls):
            planned = plan(client.session, index)
            key = args_hash(planned.arguments)
            row = by_hash[key]
            got = (row.tool, row.status, tuple((s.provider, s.outcome) for s in row.chain))
            assert got == (planned.tool, planned.status, planned.chain), f"call {client.session}/{index}"
            assert client.answers[key] == (row.correlation_id, planned.status)
            assert (row.caller, row.client_name, row.client_version) == (
                CALLER,
                client_info(client.session).name,
                client_info(client.session).version,
            )
            if planned.tool.startswith("via_"):
                tag = str(planned.arguments["tag"])
                assert dict(row.arg_preview) == {"tag": tag[:PREVIEW_CHARS] + ("…" if len(tag) > PREVIEW_CHARS else "")}
            else:
                assert dict(row.arg_preview) == {}
            sessions.setdefault(client.session, set()).add(row.session_id)
    session_ids = [ids.pop() for ids in sessions.values() if len(ids) == 1 and None not in ids]
    assert len(set(session_ids)) == len(received), "each client session has one session id of its own"


def expected_counts(sessions: int, calls: int) -> Counter[tuple[str, str]]:
    return Counter((p.tool, p.status) for s in range(sessions) for p in (plan(s, i) for i in range(calls)))


def metric_counts(text: str) -> Counter[tuple[str, str]]:
    counts: Counter[tuple[str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mcp_gateway_tool_calls_total":
                counts[(sample.labels["tool"], sample.labels["status"])] += int(sample.value)
    return counts


def canonical_lines(output: str) -> dict[str, list[dict[str, Any]]]:
    """The gateway's ``tool.call`` log lines, by correlation id."""
    lines: dict[str, list[dict[str, Any]]] = {}
    for line in output.splitlines():
        if not line.startswith("{"):
            continue
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if event.get("event") == "tool.call":
            lines.setdefault(event["correlation_id"], []).append(event)
    return lines


def audit_stats_table(folder: Path) -> str:
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "audit", "stats", "--db", str(folder / "audit.db")],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=folder,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def stop(process: subprocess.Popen[bytes], signum: signal.Signals = signal.SIGTERM) -> None:
    process.send_signal(signum)
    process.wait(timeout=30)


# ------------------------------------------------------------------------------------------------ the tests


async def test_every_call_of_a_mixed_load_has_exactly_one_row_with_its_planned_status_and_chain(
    tmp_path: Path,
) -> None:
    with run_gateway(federation(), tmp_path, tokens=f"{CALLER}={TOKEN}") as gateway:
        received = await run_load(gateway.url(), SESSIONS, CALLS_PER_SESSION)
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
            metrics = (await http.get(gateway.url("/metrics"))).text
        await anyio.to_thread.run_sync(stop, gateway.process)
        output = gateway.output()

    rows = await anyio.to_thread.run_sync(lambda: open_reader(tmp_path / "audit.db").query(limit=None))
    check_ledger(rows, received, CALLS_PER_SESSION)

    lines = canonical_lines(output)
    assert len(lines) == len(rows)
    for row in rows:
        (line,) = lines[row.correlation_id]
        assert (line["tool"], line["status"], line["caller"]) == (row.tool, row.status, CALLER)

    assert metric_counts(metrics) == expected_counts(SESSIONS, CALLS_PER_SESSION)

    table = await anyio.to_thread.run_sync(audit_stats_table, tmp_path)
    header, *body = table.splitlines()
    assert header.split() == [
        "TOOL", "CALLS", "REFUSED", "ERROR%", "DEGRADED%", "P50", "MS", "P95", "MS", "P99", "MS", "TOKENS", "IN",
        "TOKENS", "OUT",
    ]  # fmt: skip
    per_tool = {line.split()[0]: line.split()[1:] for line in body}
    for (tool, _), count in expected_counts(SESSIONS, CALLS_PER_SESSION).items():
        assert int(per_tool[tool][0]) == count
    assert float(per_tool["t__sleep"][4]) >= TIMEOUT_S * 1000  # its p50 is the timeout


async def test_after_a_sigkill_mid_load_every_answer_a_client_received_has_its_row(tmp_path: Path) -> None:
    target = 200
    received: list[str] = []
    enough = anyio.Event()

    async def client(session: int, url: str) -> None:
        async with mcp_session(url, token=TOKEN, client_info=client_info(session)) as client:
            index = 0
            while True:
                result = await client.call_tool("e__t0", {"text": f"k{session}-{index}"})
                assert result.meta is not None
                received.append(result.meta[META_KEY]["id"])  # the answer arrived: its row must exist
                if len(received) >= target:
                    enough.set()
                index += 1

    with run_gateway(federation(), tmp_path, tokens=f"{CALLER}={TOKEN}") as gateway:
        with anyio.fail_after(120):
            async with anyio.create_task_group() as tg:
                for session in range(4):
                    tg.start_soon(client, session, gateway.url())
                await enough.wait()
                gateway.process.send_signal(signal.SIGKILL)  # calls are in flight on all four sessions
                tg.cancel_scope.cancel()
        await anyio.to_thread.run_sync(gateway.process.wait, 30)
        assert gateway.process.returncode == -signal.SIGKILL

    rows = await anyio.to_thread.run_sync(lambda: open_reader(tmp_path / "audit.db").query(limit=None))
    recorded = {row.correlation_id for row in rows}
    assert len(received) >= target
    missing = [cid for cid in received if cid not in recorded]
    assert missing == []
