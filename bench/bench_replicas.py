"""Through a real HAProxy (round robin, no affinity): p50, p99 and throughput of ``tools/call echo`` with 1 and 3
gateway replicas sharing a real PostgreSQL ledger and a real Redis (the per-caller rate counted there), and how long
a session-era client goes without an answer when the replica serving it is SIGKILLed (tests/replicas.py starts all
of it on loopback; the engines are Debian's postgresql, redis-server and haproxy).

Run ``python -m bench.bench_replicas [--seconds S] [--clients N] [--rounds R] [--kept]`` from the project root.
``--clients`` session-era clients and as many stateless (2026-07-28) ones call in a closed loop (each waits for its
answer). ``--kept`` measures instead 3 replicas with the deployed settings (a fresh connection to a replica per
request, ``option http-server-close``) against the same with HAProxy's default, connections to replicas kept and
reused, in the same rounds. Prints one JSON line per measurement.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio

from tests.engines import PostgresServer, RedisServer, find_binary, postgres_bindir, started
from tests.replicas import Load, Outcome, deployment, kill_replica


def _percentile(ordered: list[float], pct: int) -> float:
    return ordered[max(1, (pct * len(ordered) + 99) // 100) - 1]


def _interruptions(outcomes: list[Outcome], at: float) -> list[float]:
    """Per session-era client: from its last answer before ``at`` to its first answer after."""
    gaps = []
    for client in sorted({o.client for o in outcomes if o.kind == "session"}):
        mine = [o for o in outcomes if o.kind == "session" and o.client == client and o.ok]
        before = max((o.ended for o in mine if o.ended <= at), default=None)
        after = min((o.ended for o in mine if o.ended > at), default=None)
        if before is not None and after is not None:
            gaps.append(after - before)
    return gaps


async def measure(url: str, clients: int, seconds: float, kill: Any = None) -> dict[str, Any]:
    load = Load(url)
    killed_at = None
    async with anyio.create_task_group() as tg:
        for index in range(clients):
            tg.start_soon(load.session_client, index)
            tg.start_soon(load.stateless_client, index)
        await load.wait_answered(50)  # warmed up: every client has its connection (and session)
        start = len(load.outcomes)
        began = time.monotonic()
        if kill is not None:
            await anyio.sleep(seconds / 2)  # paced: the kill falls in the middle of the window
            killed_at = time.monotonic()
            await anyio.to_thread.run_sync(kill)
            await anyio.sleep(seconds / 2)
        else:
            await anyio.sleep(seconds)  # the measurement window
        window = load.outcomes[start:]
        elapsed = time.monotonic() - began
        load.stop.set()
    ok = sorted((o.ended - o.started) * 1000 for o in window if o.ok)
    result: dict[str, Any] = {
        "calls_per_s": round(len(ok) / elapsed, 1),
        "p50_ms": round(_percentile(ok, 50), 2),
        "p99_ms": round(_percentile(ok, 99), 2),
        "failed": sum(1 for o in window if not o.ok),
        "initializes": load.initializes,
    }
    if killed_at is not None:
        gaps = sorted(_interruptions(load.outcomes, killed_at))
        result["interruption_ms"] = {"max": round(gaps[-1] * 1000), "median": round(_percentile(gaps, 50) * 1000)}
    return result


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--kept", action="store_true", help="3 replicas: fresh connections against kept ones")
    args = parser.parse_args()
    bindir = postgres_bindir()
    redis_binary = find_binary("redis-server", folders=[Path("/usr/bin")])
    assert bindir is not None and redis_binary is not None, "needs the Debian packages postgresql and redis-server"
    with started(PostgresServer(bindir, durable=True)) as postgres, started(RedisServer(redis_binary)) as redis:
        for round_ in range(args.rounds):
            if args.kept:
                for kept in (False, True):
                    pg_url = postgres.create_database(f"bench_{round_}_{kept}")
                    balance = "balance roundrobin" + ("\n    no option http-server-close" if kept else "")
                    with (
                        tempfile.TemporaryDirectory() as root,
                        deployment(Path(root), 3, pg_url=pg_url, redis_url=redis.url, balance=balance) as (_, balancer),
                    ):
                        figures = await measure(balancer.url(), args.clients, args.seconds)
                        print(json.dumps({"round": round_, "replicas": 3, "kept": kept, **figures}), flush=True)
                continue
            for replicas in (1, 3):
                pg_url = postgres.create_database(f"bench_{round_}_{replicas}")
                with (
                    tempfile.TemporaryDirectory() as root,
                    deployment(Path(root), replicas, pg_url=pg_url, redis_url=redis.url) as (servers, balancer),
                ):
                    figures = await measure(balancer.url(), args.clients, args.seconds)
                    print(json.dumps({"round": round_, "replicas": replicas, "clients": 2 * args.clients, **figures}))
                    if replicas == 3:
                        killed = await measure(
                            balancer.url(), args.clients, args.seconds, kill=lambda: kill_replica(servers[0])
                        )
                        print(json.dumps({"round": round_, "replicas": 3, "kill": "r0", **killed}), flush=True)


if __name__ == "__main__":
    anyio.run(main)
