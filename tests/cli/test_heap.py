"""What ``gateway serve`` does with the objects start-up made: out of the cyclic collector's sight (``settle_heap``),
so a full collection walks only what serving made since, while serving's own garbage is still collected; and how
often it collects what serving makes."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

PROBE = """
import gc, json, weakref
import gateway.front.http.app, gateway.front.stdio, uvicorn  # what serve imports before it settles the heap
from gateway.cli.serving import YOUNG_OBJECTS, settle_heap

before = len(gc.get_objects())
settle_heap()
walked = len(gc.get_objects())

class Node:
    pass

def young_collections():
    return gc.get_stats()[0]["collections"]

started = young_collections()
in_flight = [[] for _ in range(5_000)]  # what a burst of calls holds while it is served
during_burst = young_collections() - started

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made while serving: only the collector frees it
gone = weakref.ref(a)
del a, b
more = [[] for _ in range(2 * YOUNG_OBJECTS)]  # serving goes on, and never asks for a collection
freed_by_itself = gone() is None
gc.collect()
print(json.dumps({
    "before": before,
    "frozen": gc.get_freeze_count(),
    "walked": walked,
    "during_burst": during_burst,
    "freed_by_itself": freed_by_itself,
    "cycle_freed": gone() is None,
}))
"""


@pytest.fixture(scope="module")
def heap() -> dict[str, Any]:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    return dict(json.loads(done.stdout))


@pytest.mark.spawns
def test_a_full_collection_walks_only_what_serving_made_and_still_frees_its_cycles(heap: dict[str, Any]) -> None:
    assert heap["frozen"] > 50_000, heap  # the modules, classes and schemas of start-up
    assert heap["walked"] < heap["before"] // 10, heap
    assert heap["cycle_freed"], heap


@pytest.mark.spawns
def test_a_burst_of_objects_in_flight_is_not_collected_young_but_cycles_are_still_freed_unasked(
    heap: dict[str, Any],
) -> None:
    # CPython's default collects the young generation every 700 objects: 7 collections for these 5,000, each promoting
    # what is still in flight towards the full collection every call then waits out.
    assert heap["during_burst"] == 0, heap
    assert heap["freed_by_itself"], heap
