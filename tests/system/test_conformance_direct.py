"""The official MCP conformance suite passes against our fixture server directly, over streamable HTTP.

This pins the fixture itself: when the suite later runs through the gateway fronting this server, any failure is
the gateway's, not the fixture's. The suite is the npm package `@modelcontextprotocol/conformance`, whose launchers
scripts/install puts in `.tools/bin` (tests/conftest.py adds that to PATH): `conformance`, the stable release, and
`conformance-next`, the 0.2 pre-release that adds the stateless 2026-07-28 era, run held to each era.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.procs import conformance_server_argv, free_port, start_http_server

pytestmark = pytest.mark.node

# The whole suite takes a few seconds on loopback; this bounds a hung scenario.
SUITE_TIMEOUT = 300.0

# Scenarios that must show SUCCESS and no WARNING (not merely "no FAILURE"): the round trips and the security check
# that shape-only checks could otherwise pass on an error result.
MUST_SUCCEED = (
    "tools-call-simple-text",
    "tools-call-error",
    "tools-call-with-logging",
    "tools-call-with-progress",
    "tools-call-sampling",
    "tools-call-elicitation",
    "elicitation-sep1034-defaults",
    "elicitation-sep1330-enums",
    "json-schema-2020-12",
    "resources-templates-read",
    "resources-subscribe",
    "prompts-get-with-args",
    "dns-rebinding-protection",
)


INPUT_REQUIRED_SCENARIOS = (
    "basic-elicitation",
    "basic-sampling",
    "basic-list-roots",
    "request-state",
    "multiple-input-requests",
    "multi-round",
    "missing-input-response",
    "non-tool-request",
    "result-type",
    "unsupported-methods",
    "tampered-state",
    "capability-check",
    "ignore-extra-params",
    "validate-input",
)
"""The suite's SEP-2322 (input-required result) server scenarios, 0.2.0-alpha.12: 37 checks."""

# The 2026-07-28 scenarios whose every check must show SUCCESS (their SHOULDs are WARNINGs otherwise).
MUST_SUCCEED_2026 = (
    "server-stateless",
    "sep-2164-resource-not-found",
    "json-schema-2020-12",
    "http-header-validation",
    "http-custom-header-server-validation",
    *(f"input-required-result-{name}" for name in INPUT_REQUIRED_SCENARIOS),
)

NEXT_LAUNCHER_ENV = "GATEWAY_CONFORMANCE_NEXT"
"""Names another 0.2.x launcher for the `next-*` rows (default: `conformance-next`, pinned by scripts/install)."""

# The suite's runs: `stable` is the pinned release (--suite all); `next-*`, the 0.2 pre-release held to one era.
SUITES: dict[str, tuple[str, ...]] = {
    "stable": (),
    "next-2025-11-25": ("--spec-version", "2025-11-25"),
    "next-2026-07-28": ("--spec-version", "2026-07-28"),
}


def _conformance_launcher(suite: str = "stable") -> str:
    if suite == "stable":
        launcher = shutil.which("conformance")
        if launcher is None:
            pytest.skip(
                "the `conformance` launcher (npm @modelcontextprotocol/conformance) is not on PATH; run scripts/install"
            )
        return launcher
    launcher = os.environ.get(NEXT_LAUNCHER_ENV) or shutil.which("conformance-next")
    if not launcher:
        pytest.skip(
            f"the `conformance-next` launcher (the 0.2 pre-release) is not on PATH; run scripts/install, or set "
            f"{NEXT_LAUNCHER_ENV} to a 0.2.x `conformance` launcher"
        )
    return launcher


def suite_args(suite: str, launcher: str) -> list[str]:
    """The suite's arguments for one row: `stable` as `_suite_args` holds it, `next-*` held to that row's era."""
    return _suite_args(launcher) if suite == "stable" else ["--suite", "all", *SUITES[suite]]


def _suite_args(launcher: str) -> list[str]:
    """`--suite all`, held to the 2025-11-25 wire when the harness is a 0.2 pre-release.

    0.2.x adds the 2026-07-28 era and extension scenarios (tasks, input-required results) that need further
    diagnostic tools; 0.1.x's "all" is exactly the 2025-era scenario set.
    """
    version = subprocess.run([launcher, "--version"], capture_output=True, text=True, timeout=60, check=True)
    match = re.match(r"(\d+)\.(\d+)", version.stdout.strip())
    args = ["--suite", "all"]
    if match and (int(match[1]), int(match[2])) >= (0, 2):
        args += ["--spec-version", "2025-11-25"]
    return args


def _load_checks(output_dir: Path) -> dict[str, list[dict[str, Any]]]:
    """Checks by scenario, from the `server-<scenario>-<timestamp>/checks.json` files the suite writes."""
    by_scenario: dict[str, list[dict[str, Any]]] = {}
    for path in sorted(output_dir.glob("server-*/checks.json")):
        scenario = re.sub(r"^server-|-\d{4}-\d{2}-\d{2}T[\d-]+Z$", "", path.parent.name)
        by_scenario.setdefault(scenario, []).extend(json.loads(path.read_text()))
    return by_scenario


@pytest.mark.parametrize("suite", list(SUITES))
def test_conformance_suite_passes_against_the_fixture_server(suite: str, tmp_path: Path) -> None:
    launcher = _conformance_launcher(suite)
    output_dir = tmp_path / "results"
    port = free_port()
    with start_http_server(conformance_server_argv(port), port) as server:
        completed = subprocess.run(
            [launcher, "server", "--url", server.url("/mcp"), *suite_args(suite, launcher), "-o", str(output_dir)],
            capture_output=True,
            text=True,
            timeout=SUITE_TIMEOUT,
        )
        server_output = server.output()
    report = f"{completed.stdout[-6000:]}\n{completed.stderr[-2000:]}\nserver output:\n{server_output[-3000:]}"

    assert completed.returncode == 0, report
    by_scenario = _load_checks(output_dir)
    checks = [check for scenario_checks in by_scenario.values() for check in scenario_checks]
    failed = [f"{check['id']}: {check.get('errorMessage')}" for check in checks if check["status"] == "FAILURE"]
    passed = sum(check["status"] == "SUCCESS" for check in checks)
    assert failed == [], report
    assert passed > 0, report
    totals = re.search(r"^Total: (\d+) passed, (\d+) failed", completed.stdout, re.MULTILINE)
    assert totals is not None and (int(totals[1]), int(totals[2])) == (passed, 0), report
    if suite == "next-2026-07-28":
        for scenario in MUST_SUCCEED_2026:
            statuses = [check["status"] for check in by_scenario.get(scenario, [])]
            assert statuses and set(statuses) == {"SUCCESS"}, f"{scenario}: {statuses}\n{report}"
        # The multi-round tool really carried its progress through the sealed requestState to the last round.
        assert any(
            "favorite color" in json.dumps(check.get("details"))
            for check in by_scenario["input-required-result-multi-round"]
        ), report
        return
    for scenario in MUST_SUCCEED:
        statuses = [check["status"] for check in by_scenario.get(scenario, [])]
        assert "SUCCESS" in statuses and set(statuses) <= {"SUCCESS", "INFO", "SKIPPED"}, (
            f"{scenario}: {statuses}\n{report}"
        )
    # The round trips really happened and their answers came back into the tool results.
    assert _first_text(by_scenario, "tools-call-sampling") == "LLM response: This is a test response from the client"
    assert _first_text(by_scenario, "tools-call-elicitation").startswith("User response: action=accept")


def _first_text(by_scenario: dict[str, list[dict[str, Any]]], scenario: str) -> str:
    """The first text block of the tool result the suite recorded for `scenario`."""
    for check in by_scenario[scenario]:
        result = (check.get("details") or {}).get("result")
        if isinstance(result, dict) and result.get("content"):
            return str(result["content"][0].get("text"))
    raise AssertionError(f"{scenario} recorded no tool result")
