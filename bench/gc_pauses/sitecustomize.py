"""Loaded by a gateway that bench_tail.py or soak_hostile.py starts (this folder first on its PYTHONPATH): the pause of
every collection of generation 1 or 2, and of a young one (0) that took 1 ms or more, one stderr line each,
``GC_PAUSE <generation> <ms>`` (the many short young ones are left out: writing them would cost more than they do).
Nothing else in the process changes."""

import gc
import sys
import time

_started = 0.0


def _timed(phase: str, info: dict[str, int]) -> None:
    global _started
    if phase == "start":
        _started = time.perf_counter()
    else:
        ms = (time.perf_counter() - _started) * 1000
        if info["generation"] or ms >= 1.0:
            sys.stderr.write(f"GC_PAUSE {info['generation']} {ms:.2f}\n")


gc.callbacks.append(_timed)
