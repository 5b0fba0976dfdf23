"""The command-line adapter's own overhead: the same tiny command spawned bare and through ``CliBackend.call_tool``.

Usage: ``python bench/bench_cli.py [-n 200] [--command echo]``

The command is ``echo`` (resolved on PATH) with a short argv, so the program's own run time is close to nothing and
what remains is spawn cost plus the adapter's work: schema validation, argv expansion, the concurrency slot, reading
both pipes, reaping, the group sweep and building the result. Four ways, each measured sequentially N times after a
warm-up, reported as p50 / p90 in milliseconds:

  subprocess.run        the plain blocking call (a floor for any Python spawn)
  anyio.run_process     the plain async call
  anyio.open_process    the async call with the adapter's spawn flags (new session, stdin from /dev/null)
  CliBackend.call_tool  the adapter
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import anyio

from gateway.backends.cli.backend import CliBackend
from gateway.config import Adapter

WARMUP = 20


def _percentiles(samples: list[float]) -> tuple[float, float]:
    ordered = sorted(samples)
    return statistics.median(ordered), ordered[int(len(ordered) * 0.9) - 1]


async def _measure(n: int, once: Callable[[], Awaitable[object]]) -> list[float]:
    for _ in range(WARMUP):
        await once()
    samples = []
    for _ in range(n):
        started = time.perf_counter()
        await once()
        samples.append((time.perf_counter() - started) * 1000)
    return samples


async def main(n: int, command: str) -> None:
    argv = [command, "hello", "world"]

    async def sync_run() -> object:
        return subprocess.run(argv, capture_output=True, check=True)  # noqa: ASYNC221

    async def anyio_run() -> object:
        return await anyio.run_process(argv)

    async def anyio_open() -> object:
        async with await anyio.open_process(
            argv, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True
        ) as process:
            assert process.stdout is not None
            async for _ in process.stdout:
                pass
            return await process.wait()

    config = Adapter.model_validate(
        {
            "command": command,
            "tools": {
                "echo": {
                    "input_schema": {"type": "object", "properties": {"word": {"type": "string", "default": "hello"}}},
                    "argv": ["{word}", "world"],
                    "output": "text",
                }
            },
        }
    )
    backend = CliBackend("bench", config)
    await backend.check()

    async def adapter_call() -> object:
        return await backend.call_tool("echo", {})

    rows = [
        ("subprocess.run", await _measure(n, sync_run)),
        ("anyio.run_process", await _measure(n, anyio_run)),
        ("anyio.open_process (adapter flags)", await _measure(n, anyio_open)),
        ("CliBackend.call_tool", await _measure(n, adapter_call)),
    ]
    base_p50 = _percentiles(rows[1][1])[0]
    print(f"{' '.join(argv)}  x {n} sequential (after {WARMUP} warm-up), Python {sys.version.split()[0]}")
    print(f"| {'way':36} | p50 ms | p90 ms | p50 vs anyio.run_process |")
    print(f"|{'-' * 38}|--------|--------|--------------------------|")
    for name, samples in rows:
        p50, p90 = _percentiles(samples)
        print(f"| {name:36} | {p50:6.2f} | {p90:6.2f} | {p50 - base_p50:+21.2f} ms |")
    print(f"adapter overhead (p50, call_tool - anyio.run_process): {_percentiles(rows[3][1])[0] - base_p50:.2f} ms")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-n", type=int, default=200)
    parser.add_argument("--command", default=shutil.which("echo") or "/bin/echo")
    options = parser.parse_args()
    anyio.run(main, options.n, options.command)
