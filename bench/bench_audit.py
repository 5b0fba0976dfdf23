"""What ``Ledger.record()`` costs: ledger off vs ``synchronous=NORMAL`` vs ``FULL`` (and, with ``--postgresql URL``,
the PostgreSQL ledger, and the same ledger spooling because its server cannot be reached).

For each mode it measures (1) the latency of one awaited ``record()`` with nothing else running (p50 and p99 over
``--rows`` sequential calls) and (2) the throughput of ``--writers`` tasks recording concurrently, where group commit
shares each transaction between the callers that were ready when the batch's leader yielded (NORMAL) or that arrived
while the previous commit ran in its thread (FULL).

Run ``python -m bench.bench_audit [--dir DIR]`` from the project root. Put ``--dir`` on the disk the gateway's ledger
will live on: a tmpfs makes every fsync free and hides the difference FULL makes. ``--postgresql`` takes the URL of
an existing, empty database (its ``calls`` table is written to); ``pg-spooling`` points the same ledger at a closed
port on 127.0.0.1, so every row goes to the local spool.
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time
from pathlib import Path
from typing import Any, Literal

import anyio

from gateway.ledger.engines import AuditLedger
from gateway.ledger.records import AuditRecord, AuditStep, arg_previews, args_hash
from gateway.ledger.sqlite import Ledger

ARGUMENTS = {"query": "how does the fallback ladder pick a cheaper mode " * 3, "mode": "full", "limit": 10}


def make_record(n: int) -> AuditRecord:
    return AuditRecord(
        ts=time.time(),
        correlation_id=f"bench-{n}",
        session_id="session-1",
        client_name="bench",
        client_version="1.0",
        caller="token:bench",
        tool="search",
        chain=(
            AuditStep("primary", "full", "timeout", "timed out after 15 s", 15.0),
            AuditStep("b", None, "ok", None, 3.0),
        ),
        status="degraded",
        duration_ms=18.0,
        result_bytes=2048,
        arg_preview=arg_previews(ARGUMENTS, {"query": 100, "mode": 0}),
        args_hash=args_hash(ARGUMENTS),
    )


def _percentile(ordered: list[float], pct: int) -> float:
    return ordered[max(1, (pct * len(ordered) + 99) // 100) - 1]


def _ledger(directory: Path, mode: str, url: str | None) -> Any:
    if mode in ("postgresql", "pg-spooling"):
        from gateway.ledger.postgres import PgLedger
        from tests.engines import free_port

        assert url is not None
        target = url if mode == "postgresql" else f"postgresql://bench@127.0.0.1:{free_port()}/none"
        return PgLedger(target, spool_path=directory / f"spool-{mode}.db")
    path = None if mode == "off" else directory / f"audit-{mode.lower()}.db"
    synchronous: Literal["NORMAL", "FULL"] = "FULL" if mode == "FULL" else "NORMAL"
    return Ledger(path, synchronous=synchronous)


async def bench_mode(
    directory: Path, mode: str, rows: int, writers: int, per_writer: int, url: str | None = None
) -> dict[str, Any]:
    latencies: list[float] = []
    ledger: AuditLedger
    async with _ledger(directory, mode, url) as ledger:
        for n in range(50):  # warm up: the file, the page cache, the thread
            await ledger.record(make_record(n))
        for n in range(rows):
            rec = make_record(n)
            start = time.perf_counter()
            await ledger.record(rec)
            latencies.append((time.perf_counter() - start) * 1e6)
        before = ledger.statistics()

        async def writer(w: int) -> None:
            for n in range(per_writer):
                await ledger.record(make_record(w * per_writer + n))

        start = time.perf_counter()
        async with anyio.create_task_group() as tg:
            for w in range(writers):
                tg.start_soon(writer, w)
        elapsed = time.perf_counter() - start
        after = ledger.statistics()
    latencies.sort()
    commits = after.commits - before.commits
    return {
        "mode": mode,
        "p50_us": round(_percentile(latencies, 50), 1),
        "p99_us": round(_percentile(latencies, 99), 1),
        "concurrent_rows_per_s": round(writers * per_writer / elapsed),
        "rows_per_commit": round(writers * per_writer / commits, 1) if commits else None,
        "largest_commit": after.largest_commit,
    }


async def main(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(dir=args.dir, prefix="bench-audit-") as directory:
        modes = ["off", "NORMAL", "FULL"] + (["postgresql", "pg-spooling"] if args.postgresql else [])
        results = [
            await bench_mode(Path(directory), mode, args.rows, args.writers, args.per_writer, args.postgresql)
            for mode in modes
        ]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"{args.rows} sequential records; {args.writers} writers x {args.per_writer} concurrent records")
    print(f"{'mode':<12}{'p50 us':>10}{'p99 us':>10}{f'rows/s ({args.writers}w)':>15}{'rows/commit':>13}")
    for r in results:
        per_commit = "-" if r["rows_per_commit"] is None else f"{r['rows_per_commit']:.1f}"
        print(
            f"{r['mode']:<12}{r['p50_us']:>10.1f}{r['p99_us']:>10.1f}{r['concurrent_rows_per_s']:>15}{per_commit:>13}"
        )


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dir", default=None, help="where to create the ledgers (default: the system temp dir)")
    parser.add_argument("--rows", type=int, default=2000, help="sequential records per mode")
    parser.add_argument("--writers", type=int, default=8)
    parser.add_argument("--per-writer", type=int, default=2000)
    parser.add_argument("--postgresql", metavar="URL", help="also measure the PostgreSQL ledger on this database")
    parser.add_argument("--json", action="store_true")
    anyio.run(main, parser.parse_args())
