"""Every real client against a served gateway, as its users drive it: one test per cell of the matrix (client,
transport, check). HTTP cells: connects, lists the tools, calls one (the model reads its answer), a wrong argument
(the model reads an error naming it), a token from the real OpenID provider, no token and a wrong token (the client
gives up at once and tells its user why). Stdio cells: the client spawns ``gateway serve --stdio`` and does the
first four. A cell known to fail is an xfail: strict when it names the issue-23 item that fixes it (it flips when the
fix lands), not strict when it is the client's limit. Run alone with ``scripts/test -m clients``; docs/clients.md is
generated from a run (``scripts/clients-matrix``)."""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest

from tests.clients.conftest import Matrix
from tests.clients.matrix import BY_KEY, CHECKS, CLIENTS_UNDER_TEST, EXPECTED, STDIO_CHECKS

pytestmark = [pytest.mark.clients, pytest.mark.spawns, pytest.mark.node]

CHECK = {check.key: check for check in CHECKS}


def cells() -> Iterator[Any]:
    for client in CLIENTS_UNDER_TEST:
        for transport in client.transports:
            for check in CHECKS:
                if transport == "stdio" and check.key not in STDIO_CHECKS:
                    continue
                marks = []
                expected = EXPECTED.get((client.key, transport, check.key))
                if expected is not None:
                    why = f"item {expected.item}: {expected.why}" if expected.item else f"client: {expected.why}"
                    # A gateway defect's cell is strict (its fix makes it fail, so the page is regenerated); a client's
                    # limit is not: what the client prints is the client's, and Gemini CLI's varies from run to run.
                    marks.append(pytest.mark.xfail(strict=expected.item is not None, reason=why))
                yield pytest.param(
                    client.key, transport, check.key, id=f"{client.key}-{transport}-{check.key}", marks=marks
                )


@pytest.mark.parametrize(("client_key", "transport", "check_key"), list(cells()))
def test_a_real_client_sees_the_gateway_as_its_users_expect(
    matrix: Matrix, client_key: str, transport: str, check_key: str
) -> None:
    client, check = BY_KEY[client_key], CHECK[check_key]
    if not client.installed():
        if os.environ.get("GATEWAY_REQUIRE_CLIENTS") == "1":
            pytest.fail(f"{client.name} is not installed: run scripts/install-clients")
        pytest.skip(f"{client.name} is not installed: run scripts/install-clients")
    run = matrix.run(client, transport, "stdio" if transport == "stdio" else check.auth)
    problem = check.judge(client, run)
    assert problem is None, f"{client.name} over {transport}, {check.title}: {problem}\n{run.describe()}"


@pytest.mark.parametrize("client_key", [client.key for client in CLIENTS_UNDER_TEST])
def test_each_client_runs_at_the_version_pinned_in_tools(client_key: str) -> None:
    """A stale tree would test another version than docs/clients.md names: scripts/install-clients rebuilds it."""
    client = BY_KEY[client_key]
    if not client.installed() and os.environ.get("GATEWAY_REQUIRE_CLIENTS") != "1":
        pytest.skip(f"{client.name} is not installed: run scripts/install-clients")
    assert client.version() == client.pinned()
