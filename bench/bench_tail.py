"""Tail latency through the gateway: many echo calls over several sessions at once, each call's time, and every full
garbage collection's pause in the serving process.

A real ``gateway serve`` (audit ledger on) in front of tests/fixtures/faults_server.py over streamable HTTP; each
session POSTs ``tools/call`` of ``echo`` one after another on its own kept-alive connection (httpx2, raw JSON-RPC, no
SDK client); with ``--client sdk`` each session is the MCP SDK's client instead, which hands an answer over as soon as
its event arrives and drops the connection of a response it did not read to its end (a reset, every few calls).
``--baseline DIR`` serves another checkout's gateway in alternating rounds with this one, so the machine's load falls
on both alike. Reported per gateway: p50, p99, p99.9 and the slowest call, the serving process's CPU per call (/proc),
its generation-2 collections (count, each pause) and the longest pause of any collection, from bench/gc_pauses/,
which the gateway loads as its ``sitecustomize``. Markdown to stdout, progress to stderr.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.procs import GC_PROBE, LOOPBACK, Procs, cpu_s, free_port, gc_pauses, say  # noqa: E402
from bench.run_env import environment, load_average  # noqa: E402
from bench.soak_hostile import (  # noqa: E402
    FAULTS,
    PY,
    STATE_KEY,
    TOKENS,
    _headers,
    _messages,
    _open_session,
    _tool_call,
    _wait_ready,
)


def _cpu_ms(pid: int) -> float:
    return cpu_s(pid) * 1000


async def one_round(tree: Path, calls: int, sessions: int, workdir: Path, client: str = "raw") -> dict[str, Any]:
    """``calls`` echo calls over ``sessions`` sessions through the gateway of the checkout ``tree``."""
    procs = Procs(workdir)
    try:
        h_port, g_port = free_port(), free_port()
        procs.start("h", [PY, str(FAULTS), "--http", str(h_port)], h_port)
        config = workdir / "federation.yaml"
        config.write_text(
            f"gateway: {{audit: {{path: {json.dumps(str(workdir / 'audit.db'))}}}}}\n"
            f'servers:\n  h: {{transport: streamable_http, url: "http://{LOOPBACK}:{h_port}/mcp"}}\n'
        )
        env = {
            **os.environ,
            "PYTHONPATH": f"{GC_PROBE}{os.pathsep}{tree}",
            "GATEWAY_TOKENS": TOKENS,
            "GATEWAY_STATE_KEY": STATE_KEY,
        }
        gateway = procs.start(
            "gateway", [PY, "-m", "gateway", "serve", "-c", str(config), "--port", str(g_port)], g_port, env=env
        )
        log = workdir / "gateway.log"
        latencies: list[float] = []
        async with httpx2.AsyncClient(timeout=30) as http:
            await _wait_ready(http, g_port, gateway)
            url = f"http://{LOOPBACK}:{g_port}/mcp"
            ids = [await _open_session(http, url, "tok-bob") for _ in range(sessions)] if client == "raw" else []
            pid, mark = gateway.serving_pid, len(log.read_bytes())
            cpu = _cpu_ms(pid)

            async def session(sid: str) -> None:
                for n in range(calls // sessions):
                    started = time.perf_counter()
                    response = await http.post(
                        url, json=_tool_call(10 + n, "echo", {"text": "x"}), headers=_headers("tok-bob", sid)
                    )
                    if response.status_code != 200 or "result" not in _messages(response)[-1]:
                        raise RuntimeError(f"a call failed: {response.status_code} {response.text[:200]}")
                    latencies.append(time.perf_counter() - started)

            async def sdk_session() -> None:
                from mcp.client.session import ClientSession
                from mcp.client.streamable_http import streamable_http_client

                own = httpx2.AsyncClient(headers={"Authorization": "Bearer tok-bob"}, timeout=30)
                async with own, streamable_http_client(url, http_client=own) as (read, write, *_):
                    async with ClientSession(read, write) as mcp:
                        await mcp.initialize()
                        for _ in range(calls // sessions):
                            started = time.perf_counter()
                            result = await mcp.call_tool("echo", {"text": "x"})
                            if result.is_error:
                                raise RuntimeError(f"a call failed: {result}")
                            latencies.append(time.perf_counter() - started)

            async with anyio.create_task_group() as tg:
                for sid in ids:
                    tg.start_soon(session, sid)
                for _ in range(sessions if client == "sdk" else 0):
                    tg.start_soon(sdk_session)
            cpu = _cpu_ms(pid) - cpu
            collections = gc_pauses(log.read_bytes()[mark:])
        return {
            "latencies_ms": [x * 1000 for x in latencies],
            "cpu_ms_per_call": cpu / len(latencies),
            "gc_pauses_ms": [ms for generation, ms in collections if generation == 2],
            "gc_longest_ms": max((ms for _, ms in collections), default=0.0),
        }
    finally:
        procs.stop_all(grace_s=3.0)


def _pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def report(results: dict[str, list[dict[str, Any]]], args: argparse.Namespace, env: dict[str, Any]) -> str:
    lines = [
        "## Tail latency: echo calls over several sessions, and the gateway's full collections",
        "",
        f"Gateway {env['gateway']}, {env['cpus']} CPUs, Python {env['python']}, load {env['load_before']} before and "
        f"{load_average()} after; {args.calls} calls over {args.sessions} sessions a round, {args.rounds} rounds each; "
        f"client: {args.client}.",
        "",
        "| gateway | round | p50 ms | p99 ms | p99.9 ms | slowest ms | CPU ms/call | full collections: count, "
        "pause ms (median / max) | longest pause of any collection, ms |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, rounds in results.items():
        for n, r in enumerate(rounds, 1):
            lat, pauses = r["latencies_ms"], r["gc_pauses_ms"]
            gc_text = f"{len(pauses)}, {statistics.median(pauses):.1f} / {max(pauses):.1f}" if pauses else "0"
            lines.append(
                f"| {name} | {n} | {_pct(lat, 0.5):.1f} | {_pct(lat, 0.99):.1f} | {_pct(lat, 0.999):.1f} | "
                f"{max(lat):.1f} | {r['cpu_ms_per_call']:.2f} | {gc_text} | {r.get('gc_longest_ms', 0.0):.1f} |"
            )
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-n", "--calls", type=int, default=4000, help="calls a round (default 4000)")
    parser.add_argument("--sessions", type=int, default=8)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument(
        "--client", choices=("raw", "sdk"), default="raw", help="raw JSON-RPC on kept-alive connections, or the SDK's"
    )
    parser.add_argument("--baseline", type=Path, help="another checkout, served in alternating rounds")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    trees = {"this": ROOT} | ({"baseline": args.baseline.resolve()} if args.baseline else {})
    env = environment()
    results: dict[str, list[dict[str, Any]]] = {name: [] for name in trees}
    for n in range(args.rounds):
        for name, tree in trees.items():
            say(f"round {n + 1}: {name}")
            with tempfile.TemporaryDirectory(prefix="bench-tail-") as folder:
                results[name].append(anyio.run(one_round, tree, args.calls, args.sessions, Path(folder), args.client))
    print(report(results, args, env))
    if args.json is not None:
        args.json.write_text(json.dumps({"environment": env, "results": results}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
