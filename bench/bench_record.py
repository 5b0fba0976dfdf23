"""Where one ``Ledger.record()`` goes, and two designs measured against it (docs/benchmarks.md, "Audit ledger cost").

    .venv/bin/python -m bench.bench_record [--dir DIR] [--rows N]

Prints, in-process on asyncio (CPU time, ``time.process_time``; wall where it matters):

  parts        one sequential ``record()``; the same without the commit (the group commit's machinery); the commit
               alone, split into ``BEGIN IMMEDIATE`` / ``INSERT`` / ``COMMIT``; the row's encoding; WAL bytes a commit
  writer       a dedicated writer thread with a bounded queue and group commit (the loop puts the row, the thread
               commits what is queued and wakes each caller's future), sequential and in a burst, against the ledger,
               in alternating rounds
  pages        4 KiB (SQLite's default) against 1 KiB pages: the commit, WAL bytes, and what the read side pays on
               100,000 rows (``audit stats``' grouping, the tail, a caller's rows, a scan)

Put ``--dir`` on the disk the ledger lives on: a tmpfs hides the WAL writes.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import queue
import random
import sqlite3
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from gateway.ledger.records import encode_row
from gateway.ledger.sqlite import INSERT, Ledger, migrate
from tests.fixtures.ledger_writer import make_record


def _us(seconds: float, n: int) -> str:
    return f"{seconds / n * 1e6:.1f} µs"


def _split_commit(conn: sqlite3.Connection, wal: str, rows: list[tuple[Any, ...]]) -> str:
    """One commit a row, its three statements timed apart, and the WAL bytes each commit appends."""
    n, before, split = len(rows), os.path.getsize(wal), [0.0, 0.0, 0.0]
    for row in rows:
        t0 = time.process_time()
        conn.execute("BEGIN IMMEDIATE")
        t1 = time.process_time()
        conn.executemany(INSERT, [row])
        t2 = time.process_time()
        conn.execute("COMMIT")
        split = [split[0] + t1 - t0, split[1] + t2 - t1, split[2] + time.process_time() - t2]
    return (
        f"the commit: BEGIN {_us(split[0], n)}, INSERT {_us(split[1], n)}, COMMIT {_us(split[2], n)}; "
        f"{(os.path.getsize(wal) - before) / n / 1024:.1f} KiB of WAL a commit"
    )


async def parts(folder: str, n: int) -> None:
    records = [make_record(f"c{i}") for i in range(2 * n + 200)]
    async with Ledger(os.path.join(folder, "parts.db")) as ledger:
        for rec in records[:200]:
            await ledger.record(rec)
        t = time.process_time()
        for rec in records[200 : 200 + n]:
            await ledger.record(rec)
        print(f"record(), sequential: {_us(time.process_time() - t, n)} CPU")
        rows = [encode_row(rec) for rec in records[200 + n :]]
        conn = ledger._conn  # the engine's own connection: its statements timed
        assert conn is not None and ledger.target is not None
        print(_split_commit(conn, f"{ledger.target}-wal", rows))

        async def no_commit(rows: list[tuple[Any, ...]]) -> str | None:
            return None

        ledger._commit_batch = no_commit  # type: ignore[method-assign]  # the machinery alone
        t = time.process_time()
        for rec in records[200 : 200 + n]:
            await ledger.record(rec)
        print(f"record() without the commit (the group commit's machinery): {_us(time.process_time() - t, n)}")
    t = time.process_time()
    for rec in records[:n]:
        encode_row(rec)
    print(f"encode_row: {_us(time.process_time() - t, n)}")


class _WriterThread:
    """The prototype: a bounded queue, a thread that commits whatever is queued in one transaction."""

    def __init__(self, path: str) -> None:
        self.queue: queue.Queue[Any] = queue.Queue(maxsize=4096)
        self.conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
        self.conn.execute("PRAGMA journal_mode=WAL")
        self.conn.execute("PRAGMA synchronous=NORMAL")
        migrate(self.conn, Path(path))
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while (item := self.queue.get()) is not None:
            batch = [item]
            while not self.queue.empty():
                batch.append(self.queue.get_nowait())
            self.conn.execute("BEGIN IMMEDIATE")
            self.conn.executemany(INSERT, [row for row, _, _ in batch])
            self.conn.execute("COMMIT")
            for _, loop, future in batch:
                loop.call_soon_threadsafe(future.set_result, None)

    async def record(self, rec: Any) -> None:
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self.queue.put_nowait((encode_row(rec), loop, future))
        await future


async def writer(folder: str, n: int, rounds: int = 10) -> None:
    """The prototype against the ledger in alternating rounds (the machine's noise falls on both): medians."""
    records = [make_record(f"c{i}") for i in range(n)]
    thread = _WriterThread(os.path.join(folder, "thread.db"))
    per_round = n // rounds
    async with Ledger(os.path.join(folder, "loop.db")) as ledger:
        targets = {"writer thread": thread.record, "Ledger (commit on the loop)": ledger.record}
        seen: dict[str, list[tuple[float, float, float]]] = {name: [] for name in targets}
        for record in targets.values():  # warm-up
            for rec in records[:200]:
                await record(rec)
        for r in range(rounds):
            for name, record in targets.items() if r % 2 == 0 else reversed(targets.items()):
                chunk = records[r * per_round : (r + 1) * per_round]
                t, w = time.process_time(), time.perf_counter()
                for rec in chunk:
                    await record(rec)
                cpu, wall = time.process_time() - t, time.perf_counter() - w
                t = time.process_time()
                await asyncio.gather(*(record(rec) for rec in chunk))
                seen[name].append((cpu, wall, time.process_time() - t))
        for name, samples in seen.items():
            cpu, wall, burst = (statistics.median(sample[i] for sample in samples) for i in range(3))
            print(
                f"{name}: sequential {_us(cpu, per_round)} CPU, {_us(wall, per_round)} wall; "
                f"a burst of {per_round}: {_us(burst, per_round)} CPU a row (medians of {rounds} rounds)"
            )
    thread.queue.put(None)


def pages(folder: str, n: int) -> None:
    base = make_record("x")
    rng = random.Random(24)
    rows = [
        encode_row(
            dataclasses.replace(
                base,
                correlation_id=f"c{i}",
                tool=rng.choice(["search", "read", "files_search", "memory_recall"]),
                caller=rng.choice(["a", "b", "c"]),
                arg_preview={"query": "q" * rng.randint(10, 300)},
                ts=time.time() - i,
            )
        )
        for i in range(100_000)
    ]
    reads = {
        "stats": "SELECT tool, count(*), avg(duration_ms) FROM calls GROUP BY tool",
        "tail": "SELECT * FROM calls ORDER BY ts DESC LIMIT 50",
        "a caller's": "SELECT * FROM calls WHERE caller = 'a' ORDER BY ts DESC LIMIT 200",
        "scan": "SELECT count(*) FROM calls WHERE arg_preview LIKE '%zz%'",
    }
    for size in (4096, 1024):
        path = os.path.join(folder, f"pages-{size}.db")
        conn = sqlite3.connect(path, isolation_level=None)
        conn.execute(f"PRAGMA page_size={size}")
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute("PRAGMA synchronous=NORMAL")
        conn.execute("PRAGMA wal_autocheckpoint=0")  # as the ledger's own connection: checkpoints are elsewhere
        migrate(conn, Path(path))
        wal = Path(f"{path}-wal")
        before, t = wal.stat().st_size, time.process_time()
        for row in rows[:n]:
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(INSERT, [row])
            conn.execute("COMMIT")
        commit = f"a commit {_us(time.process_time() - t, n)}, {(wal.stat().st_size - before) / n / 1024:.1f} KiB WAL"
        for start in range(n, len(rows), 500):
            conn.execute("BEGIN")
            conn.executemany(INSERT, rows[start : start + 500])
            conn.execute("COMMIT")
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        conn.close()
        reader = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
        timings = []
        for name, sql in reads.items():
            best = float("inf")
            for _ in range(5):
                t = time.perf_counter()
                reader.execute(sql).fetchall()
                best = min(best, time.perf_counter() - t)
            timings.append(f"{name} {best * 1000:.2f} ms")
        reader.close()
        print(f"page_size {size}: {commit}; file {os.path.getsize(path) // 1024} KiB; reads: {', '.join(timings)}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dir", default=None, help="where the ledgers go (default: the system temp dir)")
    parser.add_argument("--rows", type=int, default=2000, help="rows per measurement")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as folder:
        asyncio.run(parts(folder, args.rows))
        asyncio.run(writer(folder, args.rows))
        pages(folder, args.rows)


if __name__ == "__main__":
    main()
