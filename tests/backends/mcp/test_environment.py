"""What a stdio server's process is given of the gateway's environment, run as a user runs it (``gateway check``
over a real child): the proxy and certificate variables a program that fetches needs pass by default, others by
``pass_env``, and a handshake that times out says what the server printed and what to check."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures import FIXTURES
from tests.fixtures.fetching_server import BANNER, STDERR_LINE
from tests.fixtures.gateway_proc import PYTHON

pytestmark = pytest.mark.spawns

SERVER = str(FIXTURES / "fetching_server.py")
PROXIED = {"HTTPS_PROXY": "http://proxy.corp.invalid:3128", "NODE_EXTRA_CA_CERTS": "/etc/corp/ca.pem"}


def check(tmp_path: Path, entry: str, env: dict[str, str]) -> dict[str, Any]:
    """``gateway check --json`` of one server ``entry`` (YAML flow mapping) in a gateway whose environment is the
    test's less the proxy variables, plus ``env``; that server's row of the status document."""
    path = tmp_path / "federation.yaml"
    path.write_text(f"gateway: {{audit: {{enabled: false}}}}\nservers:\n  fetched: {entry}\n")
    base = {k: v for k, v in os.environ.items() if not k.upper().endswith("_PROXY") and "CA_CERT" not in k}
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "check", "-c", str(path), "--json"],
        capture_output=True, text=True, timeout=90, env=base | env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [row] = json.loads(done.stdout)["backends"]
    return dict(row)


def test_a_server_behind_a_proxy_gets_the_proxy_and_ca_variables_by_default(tmp_path: Path) -> None:
    row = check(tmp_path, f"{{transport: stdio, command: {PYTHON}, args: [{SERVER}], connect_timeout_s: 30}}", PROXIED)
    assert (row["state"], row["reason"]) == ("ready", None)


def test_other_variables_pass_when_pass_env_names_them_or_their_prefix(tmp_path: Path) -> None:
    entry = (
        f"{{transport: stdio, command: {PYTHON}, args: [{SERVER}, --needs, CORP_REGISTRY], connect_timeout_s: %s%s}}"
    )
    env = {"CORP_REGISTRY": "https://npm.corp.invalid"}
    assert check(tmp_path, entry % (2, ""), env)["state"] == "failed"  # not passed by default
    assert check(tmp_path, entry % (30, ", pass_env: [PATH, CORP_*]"), env)["state"] == "ready"


def test_a_handshake_that_times_out_says_what_the_server_printed_and_what_to_check(tmp_path: Path) -> None:
    row = check(
        tmp_path, f"{{transport: stdio, command: {PYTHON}, args: [{SERVER}, --banner], connect_timeout_s: 2}}", {}
    )
    reason = row["reason"]
    assert row["state"] == "failed"
    assert reason.startswith("handshake timed out after 2 s (the server did not answer initialize); ")
    assert f"its stderr: {STDERR_LINE}" in reason
    assert f"on stdout, not JSON-RPC: {BANNER}" in reason
    assert "Check: that `" in reason and "pass_env" in reason


def test_a_package_runner_that_times_out_is_told_to_fill_its_cache_or_wait_longer(tmp_path: Path) -> None:
    runner = tmp_path / "bin" / "npx"  # an `npx` that behaves as the real one does behind a TLS-inspecting proxy
    runner.parent.mkdir()
    runner.write_text(f'#!/bin/sh\nexec {PYTHON} {SERVER} "$@"\n')
    runner.chmod(0o755)
    row = check(tmp_path, f"{{transport: stdio, command: {runner}, args: [-y, some-server], connect_timeout_s: 2}}", {})
    assert row["state"] == "failed"
    assert f"its stderr: {STDERR_LINE}" in row["reason"]
    assert (
        f"Check: npx fetches the server when it is not cached yet: run `{runner} -y some-server` once" in row["reason"]
    )
    assert "NODE_EXTRA_CA_CERTS" in row["reason"]
