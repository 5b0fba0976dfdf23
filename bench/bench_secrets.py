"""What scanning for credentials costs per call: a 100 KB answer scanned and redacted (gateway/observe/credentials.py).

    .venv/bin/python bench/bench_secrets.py [--kb 100] [--rounds 50] [--call]

Three texts of the size asked: prose with no marker of any credential kind, prose full of URLs and ids (the markers
``://`` and ``eyJ``-free hex that make the regular expressions run), and the same with two credentials planted. Prints
the median milliseconds of ``find``, of ``redact``, and of scanning the answer as a JSON value (``scan_value`` over a
list of text blocks, as a result's content is). With ``--call``, also the call itself: a gateway in this process in
front of the stdio echo server, which answers the 100 KB text it is sent (so both directions are scanned), timed
with ``gateway.secrets: off`` and ``record``.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import string
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio

from gateway.observe.credentials import find, redact, scan_value

ECHO = [sys.executable, str(Path(__file__).resolve().parent.parent / "tests" / "fixtures" / "echo_server.py")]

WORDS = "the gateway routes each call to a backend and keeps one row per call in its ledger of answers".split()


def _text(kb: int, urls: bool, planted: bool) -> str:
    rng = random.Random(7)
    lines: list[str] = []
    while sum(len(line) + 1 for line in lines) < kb * 1024:
        line = " ".join(rng.choice(WORDS) for _ in range(12))
        if urls:
            line += f" https://example.com/{rng.choice(WORDS)}?id=" + "".join(rng.choices(string.hexdigits, k=32))
        lines.append(line)
    if planted:
        lines[len(lines) // 2] += " AKIA" + "IOSFODNN7EXAMPLE and postgresql://app:" + "pw-123@db/prod"
    return "\n".join(lines)


def _median_ms(fn: Callable[[], Any], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1000)
    return statistics.median(times)


async def _calls(text: str, rounds: int) -> None:
    from gateway.testing import in_process_gateway

    for mode in ("off", "record", "redact"):
        config = (
            f"gateway: {{secrets: {mode}, audit: {{enabled: false}}}}\nservers:\n  s:\n    transport: stdio\n"
            f"    command: {json.dumps(ECHO[0])}\n    args: {json.dumps([ECHO[1], '--stdio'])}\n"
        )
        async with in_process_gateway(config) as (client, _):
            await client.call_tool("echo", {"text": text})
            times = []
            for _ in range(rounds):
                start = time.perf_counter()
                await client.call_tool("echo", {"text": text})
                times.append((time.perf_counter() - start) * 1000)
        print(
            f"call echo({len(text) // 1024} KB) through the gateway, secrets: {mode:<6}",
            f"{statistics.median(times):.2f} ms",
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--kb", type=int, default=100)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--call", action="store_true", help="also time a 100 KB echo call through a gateway")
    args = parser.parse_args()
    print(f"{'text':<28} {'find ms':>8} {'redact ms':>10} {'scan_value ms':>14}  found")
    for label, urls, planted in (("prose", False, False), ("prose + URLs + ids", True, False), ("planted", True, True)):
        text = _text(args.kb, urls, planted)
        blocks = [{"type": "text", "text": chunk} for chunk in text.split("\n\n")] or [{"type": "text", "text": text}]
        f = _median_ms(lambda t=text: find(t), args.rounds)
        r = _median_ms(lambda t=text: redact(t), args.rounds)
        s = _median_ms(lambda b=blocks: scan_value(b, "content"), args.rounds)
        print(f"{label + f' ({len(text) // 1024} KB)':<28} {f:>8.2f} {r:>10.2f} {s:>14.2f}  {find(text)}")
    if args.call:
        anyio.run(_calls, _text(args.kb, True, False), args.rounds)


if __name__ == "__main__":
    main()
