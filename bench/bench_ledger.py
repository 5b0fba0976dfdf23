"""The audit ledger's cost on the call path: p50 latency and throughput with the ledger on vs off, and the full
8 x 1,000 load check.

    .venv/bin/python -m bench.bench_ledger [--rounds R] [--calls N] [--sessions S] [--per-session M]
                                            [--verify] [--only process|router] [--json OUT] [--dir DIR]

Sections:

  process   Two real gateways (``gateway serve``) in front of the same kind of stdio echo server, one with
            ``audit.enabled: false`` and one writing its ledger into ``--dir``. Both run at once and are measured in
            interleaved rounds (round r measures on then off, or off then on, alternating), so the machine's noise
            falls on both alike. Per round: one session x ``--calls`` sequential ``echo`` calls (p50, p99), then
            ``--sessions`` concurrent sessions x ``--per-session`` calls (calls/s). The client is the MCP SDK's, in
            this process; its CPU time is in every number, for both gateways alike.
  router    The same comparison without HTTP, the SDK or a downstream: ``Router.call`` against an in-memory backend
            that answers at once, with metrics and the canonical log line on (written to /dev/null) as in
            production, ``Ledger(path)`` vs no recorder. This is the ledger's cost undiluted: what it adds to the
            gateway's own work per call.
  verify    (``--verify``) tests/test_load.py's workload at full size: 8 sessions x 1,000 calls of successes,
            isError answers, timeouts, fallbacks and refusals through the real gateway, then every check of that test
            (exactly 8,000 rows, each with its planned status and chain, session, client and caller; one log line per
            call; /metrics counts; ``gateway audit stats``). Takes about a minute (1,600 calls wait out a 0.25 s
            timeout).

Put ``--dir`` on the disk the ledger will live on in production: a tmpfs hides the cost of the WAL writes.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import structlog

from gateway.config import parse_config
from gateway.core.catalog import Catalog
from gateway.core.router import Router
from gateway.ledger.sqlite import Ledger
from gateway.observe.logs import configure_logging
from gateway.observe.metrics import GatewayMetrics
from gateway.testing import FakeBackend
from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer, free_port, start_http_server

GATEWAY_CONFIG = """
version: 1
gateway:
  name: bench-ledger
  audit: {{enabled: {enabled}, path: audit.db}}
servers:
  e:
    transport: stdio
    command: {python}
    args: {args}
    timeout_s: 30
"""


@contextmanager
def _serve(config: str, folder: Path) -> Iterator[RunningServer]:
    """``gateway serve`` at the production log level (info: the canonical line per call is written)."""
    path = folder / "federation.yaml"
    path.write_text(config)
    port = free_port()
    argv = [PYTHON, "-m", "gateway", "--log-level", "info", "serve", "-c", str(path), "--port", str(port)]
    with start_http_server(argv, port, env={**os.environ, "GATEWAY_TOKENS": ""}, cwd=folder) as server:
        yield server


def _pct(values: list[float], pct: int) -> float:
    ordered = sorted(values)
    return ordered[max(1, (pct * len(ordered) + 99) // 100) - 1]


# ------------------------------------------------------------------------------------------------ process


async def _sequential(url: str, calls: int) -> list[float]:
    latencies = []
    async with mcp_session(url) as session:
        for n in range(5):  # warm up the session and the downstream
            await session.call_tool("echo", {"text": f"warm-{n}"})
        for n in range(calls):
            start = time.perf_counter()
            await session.call_tool("echo", {"text": f"seq-{n}"})
            latencies.append(time.perf_counter() - start)
    return latencies


async def _concurrent(url: str, sessions: int, per_session: int) -> float:
    """Calls per second over ``sessions`` sessions, timed from the first call to the last answer."""
    ready = anyio.Event()
    opened = 0

    async def one(s: int) -> None:
        nonlocal opened
        async with mcp_session(url) as session:
            await session.call_tool("echo", {"text": "warm"})
            opened += 1
            if opened == sessions:
                ready.set()
            await ready.wait()
            for n in range(per_session):
                await session.call_tool("echo", {"text": f"c{s}-{n}"})

    start = 0.0

    async def timer() -> None:
        nonlocal start
        await ready.wait()
        start = time.perf_counter()

    async with anyio.create_task_group() as tg:
        tg.start_soon(timer)
        for s in range(sessions):
            tg.start_soon(one, s)
    return sessions * per_session / (time.perf_counter() - start)


async def bench_process(directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    echo_args = json.dumps(echo_argv()[1:])
    latencies: dict[str, list[float]] = {"on": [], "off": []}
    throughput: dict[str, list[float]] = {"on": [], "off": []}
    with ExitStack() as stack:
        urls = {}
        for mode in ("on", "off"):
            folder = directory / f"gateway-{mode}"
            folder.mkdir()
            config = GATEWAY_CONFIG.format(enabled=str(mode == "on").lower(), python=PYTHON, args=echo_args)
            urls[mode] = stack.enter_context(_serve(config, folder)).url()
        for r in range(args.rounds):
            order = ("on", "off") if r % 2 == 0 else ("off", "on")
            for mode in order:
                latencies[mode] += await _sequential(urls[mode], args.calls)
            for mode in reversed(order):
                throughput[mode].append(await _concurrent(urls[mode], args.sessions, args.per_session))
            print(f"  process round {r + 1}/{args.rounds} done", file=sys.stderr)
    result: dict[str, Any] = {}
    for mode in ("on", "off"):
        result[mode] = {
            "p50_ms": round(_pct(latencies[mode], 50) * 1000, 3),
            "p99_ms": round(_pct(latencies[mode], 99) * 1000, 3),
            "calls_per_s": round(statistics.median(throughput[mode]), 1),
            "calls_per_s_rounds": [round(x, 1) for x in throughput[mode]],
        }
    result["p50_cost_pct"] = round((result["on"]["p50_ms"] / result["off"]["p50_ms"] - 1) * 100, 1)
    result["throughput_cost_pct"] = round((1 - result["on"]["calls_per_s"] / result["off"]["calls_per_s"]) * 100, 1)
    return result


# ------------------------------------------------------------------------------------------------ router


ROUTER_CONFIG = "servers:\n  a:\n    transport: stdio\n    command: x\n"


async def _router_round(router: Router, calls: int, tasks: int) -> tuple[list[float], float]:
    latencies = []
    for n in range(calls):
        start = time.perf_counter()
        await router.call("echo", {"text": f"seq-{n}"})
        latencies.append(time.perf_counter() - start)

    async def worker(w: int) -> None:
        for n in range(calls // tasks):
            await router.call("echo", {"text": f"c{w}-{n}"})

    start = time.perf_counter()
    async with anyio.create_task_group() as tg:
        for w in range(tasks):
            tg.start_soon(worker, w)
    return latencies, (calls // tasks) * tasks / (time.perf_counter() - start)


async def bench_router(directory: Path, args: argparse.Namespace) -> dict[str, Any]:
    configure_logging("info", json=True)
    # The canonical line is rendered as in production, then dropped. (Opening /dev/null never blocks.)
    devnull = open(os.devnull, "w")  # noqa: ASYNC230
    structlog.configure(logger_factory=structlog.PrintLoggerFactory(file=devnull))
    config = parse_config(ROUTER_CONFIG, file="federation.yaml", env={})
    backend = FakeBackend("a", ["echo"])
    backends = {"a": backend}
    catalog = Catalog.build(config, backends)  # type: ignore[arg-type]
    metrics = GatewayMetrics("bench", "0", process=False)
    latencies: dict[str, list[float]] = {"on": [], "off": []}
    throughput: dict[str, list[float]] = {"on": [], "off": []}
    try:
        async with Ledger(directory / "router-audit.db") as ledger:
            routers = {
                "on": Router(lambda: catalog, lambda: backends, ledger, metrics=metrics),  # type: ignore[arg-type]
                "off": Router(lambda: catalog, lambda: backends, None, metrics=metrics),  # type: ignore[arg-type]
            }
            for r in range(args.rounds):
                for mode in ("on", "off") if r % 2 == 0 else ("off", "on"):
                    lat, tput = await _router_round(routers[mode], args.router_calls, args.sessions)
                    latencies[mode] += lat
                    throughput[mode].append(tput)
    finally:
        devnull.close()
        structlog.reset_defaults()
    result: dict[str, Any] = {}
    for mode in ("on", "off"):
        result[mode] = {
            "p50_us": round(_pct(latencies[mode], 50) * 1e6, 1),
            "p99_us": round(_pct(latencies[mode], 99) * 1e6, 1),
            "calls_per_s": round(statistics.median(throughput[mode])),
        }
    result["p50_added_us"] = round(result["on"]["p50_us"] - result["off"]["p50_us"], 1)
    result["throughput_cost_pct"] = round((1 - result["on"]["calls_per_s"] / result["off"]["calls_per_s"]) * 100, 1)
    return result


# ------------------------------------------------------------------------------------------------ verify


async def verify(directory: Path) -> dict[str, Any]:
    from tests import test_load as load

    folder = directory / "verify"
    folder.mkdir()
    started = time.perf_counter()
    calls = 1000
    with run_gateway(load.federation(), folder, tokens=f"{load.CALLER}={load.TOKEN}") as gateway:
        received = await load.run_load(gateway.url(), load.SESSIONS, calls)
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {load.TOKEN}"}) as http:
            metrics = (await http.get(gateway.url("/metrics"))).text
        await anyio.to_thread.run_sync(load.stop, gateway.process)
        output = gateway.output()
    elapsed = time.perf_counter() - started
    rows = load.query(folder / "audit.db", limit=None)
    load.check_ledger(rows, received, calls)
    lines = load.canonical_lines(output)
    assert len(lines) == len(rows) and all(len(v) == 1 for v in lines.values())
    assert load.metric_counts(metrics) == load.expected_counts(load.SESSIONS, calls)
    table = load.audit_stats_table(folder)
    by_status: dict[str, int] = {}
    for row in rows:
        by_status[row.status] = by_status.get(row.status, 0) + 1
    return {
        "sessions": load.SESSIONS,
        "calls": calls,
        "rows": len(rows),
        "by_status": by_status,
        "seconds": round(elapsed, 1),
        "audit_stats": table,
    }


# ------------------------------------------------------------------------------------------------ main


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(), "system": platform.platform()},
        "settings": {k: v for k, v in vars(args).items() if k not in ("json", "dir")},
    }
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-ledger-") as tmp:
        directory = Path(tmp)
        steps: list[tuple[str, Callable[[], Awaitable[dict[str, Any]]]]] = []
        if args.only in (None, "router"):
            steps.append(("router", lambda: bench_router(directory, args)))
        if args.only in (None, "process"):
            steps.append(("process", lambda: bench_process(directory, args)))
        if args.verify:
            steps.append(("verify", lambda: verify(directory)))
        for name, step in steps:
            print(f"{name} ...", file=sys.stderr)
            results[name] = await step()
    return results


def _report(results: dict[str, Any]) -> None:
    if "router" in results:
        r = results["router"]
        print("router (in memory, instant backend; metrics and log line on):")
        print(
            f"  ledger off: p50 {r['off']['p50_us']} us, p99 {r['off']['p99_us']} us, {r['off']['calls_per_s']} calls/s"
        )
        print(f"  ledger on : p50 {r['on']['p50_us']} us, p99 {r['on']['p99_us']} us, {r['on']['calls_per_s']} calls/s")
        print(f"  ledger adds {r['p50_added_us']} us at p50; throughput -{r['throughput_cost_pct']}%")
    if "process" in results:
        p = results["process"]
        print("process (gateway serve over loopback HTTP, stdio echo downstream, SDK client):")
        print(
            f"  ledger off: p50 {p['off']['p50_ms']} ms, p99 {p['off']['p99_ms']} ms, {p['off']['calls_per_s']} calls/s"
        )
        print(f"  ledger on : p50 {p['on']['p50_ms']} ms, p99 {p['on']['p99_ms']} ms, {p['on']['calls_per_s']} calls/s")
        print(f"  p50 +{p['p50_cost_pct']}%; throughput -{p['throughput_cost_pct']}%")
    if "verify" in results:
        v = results["verify"]
        print(f"verify: {v['sessions']} x {v['calls']} calls -> {v['rows']} rows {v['by_status']} in {v['seconds']} s")
        print(v["audit_stats"])


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--calls", type=int, default=300, help="sequential calls per round and gateway")
    parser.add_argument("--sessions", type=int, default=8, help="concurrent sessions (router: tasks)")
    parser.add_argument("--per-session", type=int, default=100, help="calls per concurrent session per round")
    parser.add_argument("--router-calls", type=int, default=3000, help="router section: calls per round and mode")
    parser.add_argument("--only", choices=("process", "router"), default=None)
    parser.add_argument("--verify", action="store_true", help="also run the full 8 x 1,000 load check")
    parser.add_argument("--dir", default=None, help="where the ledgers go (default: the system temp dir)")
    parser.add_argument("--json", default=None, help="also write the results to this file")
    arguments = parser.parse_args()
    outcome = anyio.run(main, arguments)
    if arguments.json:
        Path(arguments.json).write_text(json.dumps(outcome, indent=2))
    _report(outcome)
