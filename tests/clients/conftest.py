"""The client matrix's world: one federation (an echo server over stdio and the built-in wiki) served three ways:
over HTTP with a static bearer token, over HTTP as an OAuth resource server of the tests' real OpenID provider
(tests/fixtures/identity.py), and over stdio, spawned by the client; and ``matrix``, which runs each client against
each target once per module (its gateways stop with it). With ``GATEWAY_CLIENTS_REPORT=FILE`` every cell's outcome
is written to FILE as JSON at the end, for ``python -m tests.clients.table`` (docs/clients.md)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.clients.matrix import BY_KEY, ROOT, SCRIPT, TOOLS, Client, Run, Scenario
from tests.fixtures.gateway_proc import PYTHON, echo_argv, run_gateway
from tests.fixtures.identity import IdentityProvider, start_identity_provider
from tests.fixtures.procs import RunningServer, free_port

TOKEN = "matrix-token-0123456789abcdef"
WRONG_TOKEN = "not-the-matrix-token-0123456789"


def federation(wiki: Path, auth: str = "") -> str:
    return f"""
gateway:
  name: client-matrix
  audit: {{enabled: false}}
{auth}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
    tools: {{include: [echo, add]}}
wiki:
  root: {wiki}
  tools: [wiki_search]
"""


def oauth_section(issuer: str, resource: str) -> str:
    return f"""  auth:
    oauth:
      resource: {resource}
      required_scopes: [mcp:tools]
      issuers:
        matrix-idp: {{issuer: "{issuer}"}}"""


@dataclass
class Matrix:
    """Runs a client against a target the first time a cell asks, and keeps the run for the module."""

    folder: Path
    bearer: RunningServer
    oauth: RunningServer
    idp: IdentityProvider
    stdio_config: Path
    runs: dict[tuple[str, str, str], Run] = field(default_factory=dict)

    def target(self, transport: str, auth: str) -> dict[str, Any]:
        if transport == "stdio":
            return {
                "command": PYTHON,
                "args": ["-m", "gateway", "serve", "--stdio", "-c", str(self.stdio_config)],
                # the client passes only this (and its own few defaults): the gateway's tree and Node 22's tools
                "env": {"PYTHONPATH": str(ROOT), "PATH": f"{TOOLS / 'bin'}{os.pathsep}{os.environ['PATH']}"},
            }
        server = self.oauth if auth == "oauth" else self.bearer
        if auth == "oauth":  # a fresh one for each run: the provider's tokens live 5 minutes, the matrix longer
            token: str | None = anyio.run(self.idp.client_credentials)
        else:
            token = {"bearer": TOKEN, "wrong": WRONG_TOKEN}.get(auth)
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        return {"url": server.url(), "headers": headers}

    def run(self, client: Client, transport: str, auth: str) -> Run:
        key = (client.key, transport, auth)
        if key not in self.runs:
            folder = self.folder / "-".join(key)
            folder.mkdir()
            script = SCRIPT if auth in ("bearer", "oauth", "stdio") else []
            scenario = Scenario(transport, auth, self.target(transport, auth), script, folder)
            self.runs[key] = client.runner(client.version(), scenario)
        return self.runs[key]


@pytest.fixture(scope="module")
def matrix(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Matrix]:
    folder = tmp_path_factory.mktemp("clients")
    wiki = folder / "wiki"
    wiki.mkdir()
    (wiki / "matrix.md").write_text("# The client matrix\n\nEvery real client against one gateway.\n")
    stdio_config = folder / "stdio" / "federation.yaml"
    stdio_config.parent.mkdir()
    stdio_config.write_text(federation(wiki))
    for name in ("bearer", "oauth", "runs"):
        (folder / name).mkdir()
    port = free_port()
    resource = f"http://127.0.0.1:{port}/mcp"
    with (
        run_gateway(federation(wiki), folder.joinpath("bearer"), tokens=f"matrix={TOKEN}") as bearer,
        start_identity_provider(resource) as idp,
        run_gateway(
            federation(wiki, oauth_section(idp.issuer, resource)), folder.joinpath("oauth"), port=port
        ) as oauth,
    ):
        yield Matrix(folder / "runs", bearer, oauth, idp, stdio_config)


# --------------------------------------------------------------------------------------- the report


_OUTCOMES: list[dict[str, Any]] = []


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Each matrix cell carries its coordinates and its client's version, for the report."""
    for item in items:
        params = getattr(getattr(item, "callspec", None), "params", {})
        if "check_key" in params:
            client = BY_KEY[params["client_key"]]
            cell = {"client": client.key, "transport": params["transport"], "check": params["check_key"]}
            item.user_properties.append(("cell", {**cell, "version": client.version()}))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Iterator[None]:
    outcome = yield
    report: pytest.TestReport = outcome.get_result()
    cell = dict(item.user_properties).get("cell")
    if cell is None or report.when not in ("setup", "call"):
        return
    if report.when == "setup" and report.passed:
        return
    state = "xfailed" if hasattr(report, "wasxfail") else report.outcome
    _OUTCOMES.append({**cell, "outcome": state, "detail": getattr(report, "wasxfail", "") or ""})


def pytest_sessionfinish(session: pytest.Session) -> None:
    target = os.environ.get("GATEWAY_CLIENTS_REPORT")
    if target and _OUTCOMES:
        Path(target).parent.mkdir(parents=True, exist_ok=True)
        Path(target).write_text(json.dumps({"python": sys.version.split()[0], "cells": _OUTCOMES}, indent=1) + "\n")
