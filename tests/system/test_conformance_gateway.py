"""The official MCP conformance suite, through the gateway: every check that passes directly passes through it.

The suite (`conformance server --suite all`, npm `@modelcontextprotocol/conformance`, the pinned stable release)
runs against one target, tests/fixtures/conformance_server.py over streamable HTTP: directly, through the gateway
fronting it alone (setup a), and through the gateway fronting it beside two third-party servers over stdio,
`mcp-server-time` and `server-everything`, with conditional naming (setup b). The gateway gets its own loopback
configuration without tokens (the suite sends no auth header) and no audit ledger, so nothing is written outside the
test's tmp folder. The same comparison also runs with the pinned 0.2 pre-release (`conformance-next`, which covers
the stateless 2026-07-28 era; `GATEWAY_CONFORMANCE_NEXT` may name another 0.2.x launcher), held to each era.

The suite's client mode (`conformance client`) then checks the gateway's downstream side: for each scenario that
applies to it, tests/fixtures/gateway_as_client.py serves a gateway whose only backend is the scenario's test server
and drives it through the gateway. The figures are recorded in docs/conformance.md.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, run_gateway
from tests.system.test_conformance_direct import (
    MUST_SUCCEED,
    SUITE_TIMEOUT,
    SUITES,
    _conformance_launcher,
    _first_text,
    _load_checks,
    suite_args,
)

pytestmark = pytest.mark.node


@dataclass
class SuiteRun:
    returncode: int
    report: str
    by_scenario: dict[str, list[dict[str, Any]]]

    def statuses(self, status: str) -> set[str]:
        """`scenario/check-id` of every check with this status."""
        return {
            f"{scenario}/{check['id']}"
            for scenario, checks in self.by_scenario.items()
            for check in checks
            if check["status"] == status
        }

    @property
    def passed(self) -> int:
        return sum(check["status"] == "SUCCESS" for checks in self.by_scenario.values() for check in checks)

    @property
    def totals(self) -> tuple[int, int] | None:
        found = re.search(r"^Total: (\d+) passed, (\d+) failed", self.report, re.MULTILINE)
        return (int(found[1]), int(found[2])) if found else None


_JSON_STREAMS = (
    "the scenario's three concurrent tools/list are each answered with one JSON body (nothing is sent for them before "
    "their response), which the suite accepts ('each may return SSE or JSON', 'SSE streams optional')"
)
_JSON_POLLING = (
    "test_reconnection, served by a 2026-07-28 downstream, which never closes a call's stream, is answered before "
    "anything else is sent for it: one JSON body, and the suite says its priming-event tests are not applicable"
)
ANSWERED_AS_JSON: dict[str, tuple[str, str]] = {
    "server-sse-multiple-streams/server-sse-streams-functional": (
        "server-sse-multiple-streams/server-sse-streams-functional",
        _JSON_STREAMS,
    ),
    "server-sse-polling/server-sse-priming-event": ("server-sse-polling/server-sse-content-type", _JSON_POLLING),
    "server-sse-polling/server-sse-retry-field": ("server-sse-polling/server-sse-content-type", _JSON_POLLING),
}
"""The checks that judge an answer's event stream, and so judge nothing through the gateway when it answers a request
that needs no stream with one JSON body (front/http/transport.py) where the SDK's server streams every answer: each
with the INFO check in which the suite says it got JSON, and why the answer needed no stream."""


def answered_as_json(direct_checks: dict[str, str], run: SuiteRun) -> set[str]:
    """The checks of ``ANSWERED_AS_JSON`` judged directly and not through the gateway, where the suite says (INFO) it
    got a JSON answer instead of a stream."""
    info, judged = run.statuses("INFO"), _by_check(run)
    return {
        check
        for check, (shown_by, _) in ANSWERED_AS_JSON.items()
        if check in direct_checks and check not in judged and shown_by in info
    }


THROUGH_GATEWAY_GAPS: dict[str, str] = {}
"""The 2026-07-28 row's checks that pass directly but not yet through the gateway, each with what it waits for
(docs/conformance.md). Only these may differ from the direct run, and only in that row. None is left: the two listen
checks pass through the gateway since it holds a subscriptions/listen stream to a 2026-era downstream."""


def _launcher(suite: str = "stable") -> str:
    return _conformance_launcher(suite)


def _run_suite(suite: str, url: str, output_dir: Path) -> SuiteRun:
    launcher = _launcher(suite)
    args = suite_args(suite, launcher)
    completed = subprocess.run(
        [launcher, "server", "--url", url, *args, "-o", str(output_dir)],
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
    )
    report = f"{completed.stdout[-6000:]}\n{completed.stderr[-2000:]}"
    return SuiteRun(completed.returncode, report, _load_checks(output_dir))


@pytest.fixture(scope="module")
def target(downstream: Downstreams) -> Downstream:
    return downstream("conformance", "streamable_http", own=True)  # no other test's requests between the suite's


@pytest.fixture(scope="module")
def direct(target: Downstream, tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], SuiteRun]:
    """The suite's run against the target itself, once per suite row."""
    runs: dict[str, SuiteRun] = {}

    def run(suite: str) -> SuiteRun:
        if suite not in runs:
            runs[suite] = _run_suite(suite, target.url(), tmp_path_factory.mktemp(f"direct-{suite}"))
            assert runs[suite].passed > 0, runs[suite].report
        return runs[suite]

    return run


def _config(target: Downstream, setup: str, suite: str) -> str:
    # No `protocol:`: the gateway learns that the target speaks both eras and serves each row's client in its own
    # (the 2026-07-28 one over stateless requests, server/discover and per-request capabilities).
    config = f"""
gateway:
  name: conformance-gateway
  audit: {{enabled: false}}
  naming: {{mode: conditional}}
servers:
  conformance:
    transport: streamable_http
    url: {target.url()}
"""
    if setup == "b":
        time_server, everything = shutil.which("mcp-server-time"), shutil.which("mcp-server-everything")
        if time_server is None or everything is None:
            pytest.skip("mcp-server-time / mcp-server-everything are not on PATH; run scripts/install")
        config += f"""
  time:
    transport: stdio
    command: {time_server}
    args: ["--local-timezone", "UTC"]
  everything:
    transport: stdio
    command: {everything}
    args: ["stdio"]
"""
    return config


@pytest.mark.parametrize("suite", list(SUITES))
@pytest.mark.parametrize("setup", ["a", "b"], ids=["alone", "beside-time-and-everything"])
def test_every_check_that_passes_directly_passes_through_the_gateway(
    setup: str, suite: str, target: Downstream, direct: Callable[[str], SuiteRun], tmp_path: Path
) -> None:
    _launcher(suite)
    baseline = direct(suite)
    with run_gateway(_config(target, setup, suite), tmp_path, tokens="") as gateway:
        run = _run_suite(suite, gateway.url(), tmp_path / "results")
        gateway_log = gateway.output()
    report = f"{run.report}\ngateway output:\n{gateway_log[-4000:]}"

    # Check by check, the gateway's statuses are the direct run's (warnings and skips included), except for the
    # known gaps of the 2026-07-28 row; nothing is merely hidden: every check the direct run has, it has too.
    gaps = THROUGH_GATEWAY_GAPS if suite == "next-2026-07-28" else {}
    direct_checks, through = _by_check(baseline), _by_check(run)
    differing = {
        check for check in direct_checks.keys() | through.keys() if direct_checks.get(check) != through.get(check)
    }
    as_json = answered_as_json(direct_checks, run)
    unexplained = sorted(differing - gaps.keys() - as_json)
    assert unexplained == [], (
        "checks whose status differs through the gateway: "
        + ", ".join(
            f"{check} (direct {direct_checks.get(check)}, through {through.get(check)})" for check in unexplained
        )
        + f"\n{report}"
    )
    assert run.statuses("FAILURE") - baseline.statuses("FAILURE") <= gaps.keys(), report
    if suite == "next-2026-07-28":
        # The header rules (SEP-2243) and the stateless rules (SEP-2575) hold at the gateway's own edge.
        for scenario in ("http-header-validation", "http-custom-header-server-validation", "server-stateless"):
            statuses = {
                s for c in through if c.startswith(f"{scenario}/") and c not in gaps for s in through[c].split(",")
            }
            assert statuses == {"SUCCESS"}, f"{scenario}: {statuses}\n{report}"
        return  # the stateless era has no sampling or elicitation round trips to look into
    streamed = sum(direct_checks[check].split(",").count("SUCCESS") for check in as_json)
    assert run.passed == baseline.passed - streamed, report
    assert baseline.totals is not None and run.totals == (baseline.totals[0] - streamed, baseline.totals[1]), report
    assert run.returncode == 0, report
    for scenario in MUST_SUCCEED:
        statuses = [check["status"] for check in run.by_scenario.get(scenario, [])]
        assert "SUCCESS" in statuses and set(statuses) <= {"SUCCESS", "INFO", "SKIPPED"}, f"{scenario}: {statuses}"
    # The back-channel really carried the round trips: the fixture's tool saw the suite client's own answers.
    sampled = _first_text(run.by_scenario, "tools-call-sampling")
    assert sampled == "LLM response: This is a test response from the client"
    assert _first_text(run.by_scenario, "tools-call-elicitation").startswith("User response: action=accept")


MODERN_DOWNSTREAM_GAPS: dict[str, str] = {
    "server-sse-polling/server-sse-disconnect-resume": "SUCCESS directly, not run through: the scenario's check "
    "follows the server closing the call's stream mid-call (SEP-1699 polling), and a 2026-07-28 server never does "
    "(that era has no such close); the gateway's own streams stay resumable (the scenario's priming-event and retry "
    "checks pass)",
}
"""The 2025-11-25 row's checks whose status through the gateway to a 2026-only downstream differs from the same row
against a 2025 (dual-era) target directly, each with why (issue 25, item 2). Exactly these differ."""


@pytest.mark.parametrize("suite", ["stable", "next-2025-11-25"])
def test_a_2025_client_sees_a_2026_only_server_through_the_gateway_as_a_2025_server_directly(
    suite: str, downstream: Downstreams, direct: Callable[[str], SuiteRun], tmp_path: Path
) -> None:
    # The bridge from the handshake era to the stateless one: the suite's handshake-era client through a gateway with
    # no `protocol:` to the fixture speaking 2026-07-28 alone (it refuses `initialize`), compared check by check with
    # the same row run directly against the fixture in both eras (the `direct` fixture's target).
    _launcher(suite)
    baseline = direct(suite)
    modern = downstream("conformance", "streamable_http", "--era", "2026-07-28", own=True)
    config = f"""
gateway:
  name: conformance-gateway
  audit: {{enabled: false}}
servers:
  conformance:
    transport: streamable_http
    url: {modern.url()}
"""
    with run_gateway(config, tmp_path, tokens="") as gateway:
        run = _run_suite(suite, gateway.url(), tmp_path / "results")
        gateway_log = gateway.output()
    report = f"{run.report}\ngateway output:\n{gateway_log[-4000:]}"
    direct_checks, through = _by_check(baseline), _by_check(run)
    differing = {
        check for check in direct_checks.keys() | through.keys() if direct_checks.get(check) != through.get(check)
    }
    differing -= answered_as_json(direct_checks, run)
    described = ", ".join(
        f"{check} (direct {direct_checks.get(check)}, through {through.get(check)})" for check in sorted(differing)
    )
    gaps = MODERN_DOWNSTREAM_GAPS if suite == "next-2025-11-25" else {}
    assert differing == gaps.keys(), f"checks that differ: {described}\n{report}"
    assert run.statuses("FAILURE") == set(), report
    # The round trips really happened: each input-required result was asked of the suite's client on its call's
    # stream, and its answer reached the 2026-era tool through the retry.
    sampled = _first_text(run.by_scenario, "tools-call-sampling")
    assert sampled == "LLM response: This is a test response from the client", report
    assert _first_text(run.by_scenario, "tools-call-elicitation").startswith("User response: action=accept"), report


# The client scenarios that concern the gateway's downstream side, with the checks each must pass. The auth/* ones run
# the gateway with auth.oauth and sign in through its page (gateway_as_client.py); not yet passing, and so not here:
# 2025-03-26-oauth-metadata-backcompat. The counts leave out valid-bearer-token, one
# per request that carried the token: how many depends on the sessions the gateway opens (the shared one, each signed-in
# caller's own, server/discover before each handshake), not on the scenario. scope-retry-limit's server refuses every
# operation 403 (the driver's wait for the tools times out, which the scenario allows); it checks the gateway signs in
# at most 3 times. scope-step-up's server wants more scope for tools/call than for listing: the call is answered with
# the sign-in link, the driver opens it (the second authorization request asks for the union of scopes) and calls again.
# client-credentials-jwt: the scenario's EC key reaches the gateway as ${VAR}; its assertion is verified against the
# scenario's public key. basic-cimd checks for one fixed client id, configured as client_metadata_url (the gateway's own
# document needs an https connect_url: tests/backends/mcp/test_client_document.py). cross-app-access-complete-flow
# (SEP-990): per: gateway with cross_app, the scenario's ID token reaching the gateway as ${VAR}; the IdP's token
# exchange gives an ID-JAG, presented to the authorization server with the jwt-bearer grant.
CLIENT_SCENARIOS = {
    "initialize": 1,
    "tools_call": 1,
    "sse-retry": 3,
    "elicitation-sep1034-client-defaults": 5,
    "auth/metadata-default": 9,
    "auth/metadata-var1": 9,
    "auth/metadata-var2": 9,
    "auth/metadata-var3": 9,
    "auth/scope-from-www-authenticate": 10,
    "auth/scope-from-scopes-supported": 10,
    "auth/scope-omitted-when-undefined": 10,
    "auth/token-endpoint-auth-basic": 14,
    "auth/token-endpoint-auth-post": 14,
    "auth/token-endpoint-auth-none": 14,
    "auth/pre-registration": 9,
    "auth/2025-03-26-oauth-endpoint-fallback": 3,
    "auth/resource-mismatch": 2,
    "auth/offline-access-scope": 11,
    "auth/offline-access-not-supported": 10,
    "auth/client-credentials-basic": 4,
    "auth/scope-retry-limit": 10,
    "auth/scope-step-up": 19,
    "auth/client-credentials-jwt": 4,
    "auth/basic-cimd": 9,
    "auth/cross-app-access-complete-flow": 5,
}


REFUSED = {"auth/resource-mismatch", "auth/scope-retry-limit"}
"""The auth scenarios whose server is never called with a token the gateway holds (refused, or every call 403)."""

NEXT_CLIENT_SCENARIOS = {
    "json-schema-2020-12-preservation": 9,
    "auth/authorization-server-migration": 23,
    "auth/enterprise-managed-authorization": 5,  # SEP-990 under its 0.2 name: cross_app, as cross-app-access-*
    "auth/wif-jwt-bearer": 4,  # SEP-1933: per: gateway with workload_token_file, a public client's jwt-bearer grant
}
"""Client scenarios only the 0.2.x pre-release has."""

CLIENT_SCENARIOS_2026 = {
    "tools_call": 2,
    "sep-2322-client-request-state": 5,
    "http-invalid-tool-headers": 12,
    "json-schema-ref-no-deref": 1,
    "json-schema-2020-12-preservation": 9,
    "request-metadata": 8,
    "http-standard-headers": 10,
    "http-custom-headers": 18,
    **{f"auth/{name}": 15 for name in ("metadata-default", "metadata-var1", "metadata-var2", "metadata-var3")},
    **{
        f"auth/{name}": 11
        for name in (
            "scope-from-www-authenticate",
            "scope-from-scopes-supported",
            "scope-omitted-when-undefined",
            "offline-access-not-supported",
            "iss-supported",
            "iss-not-advertised",
        )
    },
    **{f"auth/token-endpoint-auth-{how}": 16 for how in ("basic", "post", "none")},
    "auth/pre-registration": 9,
    "auth/resource-mismatch": 2,
    "auth/offline-access-scope": 12,
    "auth/basic-cimd": 9,
    **{f"auth/iss-{name}": 8 for name in ("supported-missing", "wrong-issuer", "unexpected", "normalized")},
    "auth/metadata-issuer-mismatch": 3,
    "auth/scope-retry-limit": 11,
    "auth/scope-step-up": 21,
    "auth/authorization-server-migration": 23,
}
"""The 0.2.x pre-release's client scenarios held to 2026-07-28 (`--spec-version 2026-07-28`): their servers speak
that era alone, so the gateway's downstream session is a stateless one."""

REFUSED_2026 = {
    "auth/resource-mismatch",
    "auth/scope-retry-limit",
    "auth/metadata-issuer-mismatch",
    *(f"auth/iss-{name}" for name in ("supported-missing", "wrong-issuer", "unexpected", "normalized")),
}
"""The 2026 auth scenarios whose server is never called with a token the gateway holds (they count no
valid-bearer-token check)."""


@pytest.mark.parametrize(
    ("suite", "scenario"),
    [("stable", s) for s in CLIENT_SCENARIOS]
    + [("next-2025-11-25", s) for s in NEXT_CLIENT_SCENARIOS]
    + [("next-2026-07-28", s) for s in CLIENT_SCENARIOS_2026],
)
def test_the_gateway_as_a_client_passes_the_client_scenarios(suite: str, scenario: str, tmp_path: Path) -> None:
    launcher = _launcher(suite)
    command = f"{PYTHON} {FIXTURES / 'gateway_as_client.py'}"
    assert " " not in PYTHON and " " not in str(FIXTURES), "the suite splits --command on spaces"
    era = ["--spec-version", "2026-07-28"] if suite == "next-2026-07-28" else []
    completed = subprocess.run(
        [launcher, "client", "--command", command, "--scenario", scenario, *era, "-o", str(tmp_path)],
        env=os.environ,
        capture_output=True,
        text=True,
        timeout=SUITE_TIMEOUT,
    )
    checks = [check for path in tmp_path.glob(f"{scenario}-*/checks.json") for check in _read(path)]
    logs = "".join(path.read_text() for path in tmp_path.glob(f"{scenario}-*/std*.txt"))
    report = f"{completed.stdout[-4000:]}\n{completed.stderr[-2000:]}\n{logs[-4000:]}"
    assert completed.returncode == 0, report
    statuses = [check["status"] for check in checks]
    assert "FAILURE" not in statuses and "WARNING" not in statuses, report
    passed = [check["id"] for check in checks if check["status"] == "SUCCESS"]
    # Every request that carried a token counts a valid-bearer-token check: how many depends on the sessions the
    # gateway opens (the shared one, and each signed-in caller's own, which lists their tools), not on the scenario.
    judged = [check for check in passed if check != "valid-bearer-token"]
    expected = CLIENT_SCENARIOS_2026 if suite == "next-2026-07-28" else {**CLIENT_SCENARIOS, **NEXT_CLIENT_SCENARIOS}
    assert len(judged) == expected[scenario], f"{len(judged)}: {report}"
    if scenario.startswith("auth/") and scenario not in (REFUSED_2026 if suite == "next-2026-07-28" else REFUSED):
        assert "valid-bearer-token" in passed, report


def _by_check(run: SuiteRun) -> dict[str, str]:
    """`scenario/check-id` -> its verdicts, in order (a check may be reported more than once).

    INFO entries are left out: they log the exchange (e.g. one `incoming-sse-event` per SSE event received, whose
    number depends on timing and framing), they judge nothing.
    """
    statuses: dict[str, list[str]] = {}
    for scenario, checks in run.by_scenario.items():
        for check in checks:
            if check["status"] != "INFO":
                statuses.setdefault(f"{scenario}/{check['id']}", []).append(check["status"])
    return {check: ",".join(found) for check, found in statuses.items()}


def _read(path: Path) -> list[dict[str, Any]]:
    return list(json.loads(path.read_text()))
