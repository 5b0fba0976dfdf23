"""What ``gateway serve`` does with the objects start-up made: out of the cyclic collector's sight (``settle_heap``),
so a full collection walks only what serving made since, while serving's own garbage is still collected."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

PROBE = """
import gc, json, weakref
import gateway.front.http.app, gateway.front.stdio, uvicorn  # what serve imports before it settles the heap
from gateway.cli.serving import settle_heap

before = len(gc.get_objects())
settle_heap()
walked = len(gc.get_objects())

class Node:
    pass

a, b = Node(), Node()
a.other, b.other = b, a  # a cycle made while serving: only the collector frees it
gone = weakref.ref(a)
del a, b
gc.collect()
print(json.dumps({"before": before, "frozen": gc.get_freeze_count(), "walked": walked, "cycle_freed": gone() is None}))
"""


@pytest.mark.spawns
def test_a_full_collection_walks_only_what_serving_made_and_still_frees_its_cycles() -> None:
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=60, check=True)
    heap = json.loads(done.stdout)
    assert heap["frozen"] > 50_000, heap  # the modules, classes and schemas of start-up
    assert heap["walked"] < heap["before"] // 10, heap
    assert heap["cycle_freed"], heap
