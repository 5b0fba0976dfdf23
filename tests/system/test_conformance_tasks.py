"""The conformance suite's ``tasks-*`` scenarios (the tasks extension, SEP-2663) against our tasks fixture, directly
and through the gateway.

tests/fixtures/tasks_server.py implements the extension; the suite (the 0.2 pre-release, ``--spec-version
2026-07-28``; extension scenarios run only with ``--force``) passes against it directly, which pins the fixture, so
that any difference through the gateway is the gateway's. Through a gateway with a default configuration (no
``protocol:``: it learns the fixture speaks both eras) every check has the direct run's status.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.fixtures.gateway_proc import FIXTURES, run_gateway
from tests.fixtures.procs import RunningServer, free_port, start_http_server
from tests.system.test_conformance_direct import _conformance_launcher

pytestmark = pytest.mark.node

MODERN = "2026-07-28"
TASKS_SCENARIOS = (
    "lifecycle",
    "capability-negotiation",
    "wire-fields",
    "request-state-removal",
    "mrtr-input",
    "request-headers",
    "dispatch-and-envelope",
    "status-notifications",
    "required-task-error",
    "mrtr-composition",
)
"""The suite's tasks-extension server scenarios, 0.2.0-alpha.12: 45 checks (``status-notifications`` is SKIPPED by
the suite itself, pending its harness rewrite)."""


Checks = dict[str, list[tuple[str, str]]]


def tasks_checks(launcher: str, url: str, folder: Path) -> Checks:
    """Each ``tasks-*`` scenario's checks against ``url``: (id, status), in the suite's order."""
    found: Checks = {}
    for scenario in TASKS_SCENARIOS:
        name = f"tasks-{scenario}"
        argv = [launcher, "server", "--url", url, "--scenario", name, "--spec-version", MODERN, "--force"]
        subprocess.run([*argv, "-o", str(folder)], capture_output=True, timeout=120, check=False)
        found[scenario] = [
            (check["id"], check["status"])
            for path in sorted(folder.glob(f"server-{name}-*/checks.json"))
            for check in json.loads(path.read_text())
        ]
    return found


def tasks_server_argv(port: int, *extra: str) -> list[str]:
    return [sys.executable, str(FIXTURES / "tasks_server.py"), "--port", str(port), *extra]


@pytest.fixture(scope="module")
def target(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[RunningServer, Checks]]:
    """The tasks fixture, running, and the suite's checks against it directly."""
    launcher = _conformance_launcher("next-2026-07-28")
    port = free_port()
    with start_http_server(tasks_server_argv(port), port) as server:
        yield server, tasks_checks(launcher, server.url(), tmp_path_factory.mktemp("direct"))


def test_the_suites_tasks_scenarios_pass_against_the_fixture(target: tuple[RunningServer, Checks]) -> None:
    direct = target[1]
    statuses = [status for checks in direct.values() for _, status in checks]
    assert len(statuses) == 45, direct
    assert direct["status-notifications"] == [("tasks-status-notifications", "SKIPPED")]
    assert statuses.count("SUCCESS") == 44, direct


@pytest.mark.parametrize("protocol", ["", "2026-07-28"], ids=["learnt", "declared"])
def test_the_suites_tasks_scenarios_pass_through_the_gateway_as_directly(
    target: tuple[RunningServer, Checks], tmp_path: Path, protocol: str
) -> None:
    """With no ``protocol:`` the gateway learns that the fixture speaks both eras and serves the suite's 2026-07-28
    requests (a task's among them) on its stateless lane; declared ``2026-07-28``, on its one session. Either way it
    advertises the extension the fixture offers and hands out task ids of its own."""
    server, direct = target
    declared = f'\n    protocol: "{protocol}"' if protocol else ""
    config = f"""
gateway:
  audit: {{enabled: false}}
servers:
  target:
    transport: streamable_http
    url: {server.url()}{declared}
"""
    launcher = _conformance_launcher("next-2026-07-28")
    with run_gateway(config, tmp_path, env={"GATEWAY_STATE_KEY": "k" * 16 + "0123456789abcdef" * 2}) as gateway:
        through = tasks_checks(launcher, gateway.url(), tmp_path / "gateway")
    assert through == direct
