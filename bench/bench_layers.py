"""What each layer of a call costs the gateway's process, measured in that process (a benchmark, not a test).

    .venv/bin/python bench/bench_layers.py [-n 2000] [--rounds 5] [--json OUT]

One gateway runs in this process (the core, no front: ``Gateway(config).running()``, ledger off, logging at warning)
in front of the stdio echo server (tests/fixtures/echo_server.py), as ``gateway serve --stdio`` runs it. In
interleaved rounds, ``-n`` sequential ``echo`` calls each:

  pipe      a tools/call written as one line to a second echo server and its answer line read back (no parsing):
            what the downstream half of any relay over stdio costs the relaying process
  lane      ``backend.call_tool``: the gateway's downstream lane alone (the request built and written, the answer
            read, matched, validated)
  router    ``gateway.router.call``: the lane and the router's work around it (the call's record, policy, arguments
            checked against the published schema, deadline, drain, leak guard, token counts, metrics)

CPU per call is this process's (``time.process_time``: every thread) over the round; the echo servers' CPU is not
in it. What ``gateway serve --stdio`` adds on top of ``router`` (the client-facing stdio edge, the SDK's dispatcher
and runner, the face) is its front CPU in ``bench_gateway.py`` minus ``router`` here.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

ECHO = ROOT / "tests" / "fixtures" / "echo_server.py"
ARGS = {"text": "hello"}


async def pipe_caller() -> tuple[Callable[[], Awaitable[Any]], Callable[[], Awaitable[None]]]:
    """A second echo server, initialized by hand; each call one line written and one line read."""
    child = await asyncio.create_subprocess_exec(
        sys.executable, str(ECHO), "--stdio", stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE
    )
    assert child.stdin is not None and child.stdout is not None
    stdin, stdout = child.stdin, child.stdout
    hello = {
        "jsonrpc": "2.0",
        "id": 0,
        "method": "initialize",
        "params": {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "b", "version": "0"}},
    }
    stdin.write(json.dumps(hello).encode() + b"\n")
    await stdout.readline()
    stdin.write(b'{"jsonrpc":"2.0","method":"notifications/initialized"}\n')
    ids = iter(range(1, 1 << 62))

    async def call() -> bytes:
        request = {
            "jsonrpc": "2.0",
            "id": next(ids),
            "method": "tools/call",
            "params": {"name": "echo", "arguments": ARGS},
        }
        stdin.write(json.dumps(request, separators=(",", ":")).encode() + b"\n")
        return await stdout.readline()

    async def close() -> None:
        stdin.close()
        await child.wait()

    return call, close


async def run(n: int, rounds: int) -> dict[str, Any]:
    from gateway.config import parse_config
    from gateway.core.runtime import Gateway
    from gateway.observe.logs import configure_logging

    configure_logging("warning")
    servers = {"echo": {"transport": "stdio", "command": sys.executable, "args": [str(ECHO), "--stdio"]}}
    doc = {"version": 1, "gateway": {"name": "bench-layers", "audit": {"enabled": False}}, "servers": servers}
    with tempfile.TemporaryDirectory() as tmp:
        config = parse_config(json.dumps(doc), file=str(Path(tmp) / "federation.yaml"), env={})
        pipe, close_pipe = await pipe_caller()
        async with Gateway(config).running() as gateway:
            await gateway.wait_started()
            backend = gateway.backends["echo"]
            layers: dict[str, Callable[[], Awaitable[Any]]] = {
                "pipe": pipe,
                "lane": lambda: backend.call_tool("echo", dict(ARGS)),
                "router": lambda: gateway.router.call("echo", dict(ARGS)),
            }
            for call in layers.values():  # warm up
                for _ in range(200):
                    await call()
            cpu: dict[str, list[float]] = {name: [] for name in layers}
            wall: dict[str, list[float]] = {name: [] for name in layers}
            for r in range(rounds):
                order = list(layers) if r % 2 == 0 else list(reversed(layers))
                for name in order:
                    call = layers[name]
                    c0, t0 = time.process_time(), time.perf_counter()
                    for _ in range(n):
                        await call()
                    cpu[name].append((time.process_time() - c0) / n * 1e6)
                    wall[name].append((time.perf_counter() - t0) / n * 1e6)
        await close_pipe()
    return {
        name: {
            "cpu_us_per_call": round(statistics.median(cpu[name]), 1),
            "cpu_us_rounds": [round(x, 1) for x in cpu[name]],
            "wall_us_per_call": round(statistics.median(wall[name]), 1),
        }
        for name in cpu
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("-n", type=int, default=2000, help="calls per layer and round")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--json", metavar="OUT", help="write the figures as JSON")
    args = parser.parse_args()
    result = asyncio.run(run(args.n, args.rounds))
    print("| layer | CPU us per call (median of rounds) | rounds | wall us per call |\n|---|---|---|---|")
    for name, r in result.items():
        rounds = ", ".join(f"{x:g}" for x in r["cpu_us_rounds"])
        print(f"| {name} | {r['cpu_us_per_call']:g} | {rounds} | {r['wall_us_per_call']:g} |")
    lane, router = result["lane"]["cpu_us_per_call"], result["router"]["cpu_us_per_call"]
    print(
        f"\nthe router's own work: {router - lane:.0f} us a call; the lane over a bare pipe: "
        f"{lane - result['pipe']['cpu_us_per_call']:.0f} us"
    )
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
