"""Shared test setup: the anyio backend, a clean environment, a garbage collection after each test, the project's
locally installed tools on PATH, the ``spawns`` mark (tests/fixtures/spawning.py), the session's factories of
processes (``downstream``: the fixture servers; ``gateway_process``: ``gateway serve`` on loopback) and the
``pidfile`` of the fixture program that leaves a grandchild behind."""

from __future__ import annotations

import gc
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.engines import own_postgres, pg_url, postgres_server, redis_server  # noqa: F401  # real engines on loopback
from tests.fixtures.downstreams import Downstreams
from tests.fixtures.gateway_proc import GatewayProcesses
from tests.fixtures.procs import kill_pids

pytest_plugins = ["tests.fixtures.spawning", "pytester"]  # the ``spawns`` mark and ``--fast``; tests/test_spawning.py

ROOT = Path(__file__).resolve().parent.parent
TOOLS_BIN = ROOT / ".tools" / "bin"

# scripts/install puts Node 22, the npm test servers, qmd, graphify and the PyPI servers' launchers here.
if TOOLS_BIN.is_dir():
    os.environ["PATH"] = f"{TOOLS_BIN}{os.pathsep}{os.environ.get('PATH', '')}"


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(autouse=True)
def clean_environ() -> Iterator[None]:
    """Each test starts from the same environment and cannot leak variables into the next."""
    saved = dict(os.environ)
    yield
    os.environ.clear()
    os.environ.update(saved)


def pytest_collection_finish() -> None:
    """What is alive once every test module is imported (the gateway, the SDK, the test modules: some 180,000
    objects) lives for the session: frozen, it is left out of every later collection, so ``collect_garbage`` walks
    what the tests made since, not 0.4 s of imports after each of a thousand tests."""
    gc.collect()
    gc.freeze()


@pytest.fixture(autouse=True)
def collect_garbage() -> Iterator[None]:
    """A collection after every test, so a stream or a socket a test (or the code it runs) left unclosed is reported
    in *that* test: the warnings are errors here, and a collection at a random later moment blamed whichever test was
    running then (how an unclosed stream of the era bridge once failed a session test)."""
    yield
    gc.collect()


@pytest.fixture
def pidfile(tmp_path: Path) -> Iterator[Path]:
    """Where ``tests/fixtures/fake_cli.py`` writes "<leader> <grandchild>" (``read_pids``); whatever a failing test
    left alive is killed after."""
    path = tmp_path / "pids"
    yield path
    kill_pids(path)


@pytest.fixture(scope="session")
def downstream() -> Iterator[Downstreams]:
    """``downstream(kind, transport, *args)``: a fixture server, served once per session for the same arguments
    (tests/fixtures/downstreams.py)."""
    with Downstreams() as downstreams:
        yield downstreams


@pytest.fixture(scope="session")
def gateway_process(tmp_path_factory: pytest.TempPathFactory) -> Iterator[GatewayProcesses]:
    """``gateway_process(config, tokens=...)``: ``gateway serve`` on loopback, started once per session for the same
    arguments (tests/fixtures/gateway_proc.py)."""
    with GatewayProcesses(lambda: tmp_path_factory.mktemp("gateway")) as processes:
        yield processes
