"""Loaded by a gateway that bench_tail.py starts (this folder first on its PYTHONPATH): every full (generation 2)
collection's pause, one stderr line each, ``GC_PAUSE <ms>``. Nothing else in the process changes."""

import gc
import sys
import time

_started = 0.0


def _timed(phase: str, info: dict[str, int]) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
    elif info["generation"] == 2:
        sys.stderr.write(f"GC_PAUSE {(time.perf_counter() - _started) * 1000:.2f}\n")


gc.callbacks.append(_timed)
