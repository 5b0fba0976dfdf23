"""Failures at startup, run as the real ``gateway`` command: one sentence naming the thing and the cause, exit code 2.

A failure the gateway raises on purpose (a ``GatewayError``) while it starts, inside its task groups, must not end
the command with an ExceptionGroup traceback: the operator gets one line on stderr, as for an invalid file. And that
line never shows a value taken from the environment: a misplaced ``${DS_TOKEN}`` reads as written.
"""

from __future__ import annotations

import os
import socket
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.fixtures.gateway_proc import PYTHON
from tests.fixtures.procs import free_port

pytestmark = pytest.mark.spawns

RUN_TIMEOUT_S = 60


def _not_a_database(folder: Path) -> Path:
    path = folder / "audit.db"
    path.write_bytes(b"this is not an SQLite database\n" * 64)
    return path


def _folder_is_a_file(folder: Path) -> Path:
    (folder / "ledgers").write_text("a file where the ledger's folder should be\n")
    return folder / "ledgers" / "audit.db"


def _path_is_a_folder(folder: Path) -> Path:
    path = folder / "audit.db"
    path.mkdir()
    return path


@pytest.mark.parametrize(
    ("make", "cause"),
    [
        (_not_a_database, "file is not a database"),
        (_folder_is_a_file, "its folder cannot be created (a file of that name is in the way)"),
        (_path_is_a_folder, "unable to open database file"),
    ],
    ids=["not-a-database", "folder-is-a-file", "path-is-a-folder"],
)
@pytest.mark.parametrize("transport", ["http", "stdio"])
def test_an_audit_ledger_that_cannot_be_opened_ends_serve_with_one_line_and_exit_2(
    tmp_path: Path, make: Callable[[Path], Path], cause: str, transport: str
) -> None:
    ledger = make(tmp_path)
    config = tmp_path / "federation.yaml"
    config.write_text(f"gateway:\n  audit:\n    path: {ledger}\nservers: {{}}\n")
    argv = [PYTHON, "-m", "gateway", "serve", "-c", str(config)]
    argv += ["--stdio"] if transport == "stdio" else ["--port", str(free_port())]
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        cwd=tmp_path,
        env={**os.environ, "GATEWAY_TOKENS": "startup-token"},  # no warning about serving without one
        stdin=subprocess.DEVNULL,
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"gateway: Cannot open the audit ledger at {ledger}: ")
    assert cause in lines[0]
    assert "Traceback" not in done.stderr and "ExceptionGroup" not in done.stderr
    assert done.stdout == ""


def test_a_port_already_in_use_ends_serve_with_one_line_naming_the_address_and_exit_2(tmp_path: Path) -> None:
    # uvicorn's own answer was its log line, then sys.exit(3) inside the gateway's task group: an ExceptionGroup
    # traceback and exit 1, after every backend had been started for nothing.
    config = tmp_path / "federation.yaml"
    config.write_text(f"gateway:\n  audit: {{path: {tmp_path / 'audit.db'}}}\nservers: {{}}\n")
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = subprocess.run(
            [PYTHON, "-m", "gateway", "serve", "-c", str(config), "--port", str(port)],
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT_S,
            cwd=tmp_path,
            env={**os.environ, "GATEWAY_TOKENS": "startup-token"},
            stdin=subprocess.DEVNULL,
        )
    lines = done.stderr.splitlines()
    assert done.returncode == 2, done.stderr
    assert lines == [
        f"gateway: Cannot listen on 127.0.0.1:{port}: the address is already in use (another gateway or program "
        "listens there; pass --port or change gateway.listen)"
    ], done.stderr
    assert done.stdout == ""


DS_TOKEN = "ds-7f3a9c2e-4b1d-SECRET"


@pytest.mark.parametrize(
    ("key", "shown"),
    [
        ("timeout_s: ${DS_TOKEN}", "servers.a.timeout_s: must be a number (got '${DS_TOKEN}')"),
        ("transport: ${DS_TOKEN}", "servers.a.transport: unknown transport: use one of stdio, streamable_http, sse"),
        ("session: '${DS_TOKEN}'", "servers.a.session: must be one of shared, per_client (got '${DS_TOKEN}')"),
    ],
    ids=["number", "transport", "enum"],
)
def test_check_shows_a_misplaced_secret_as_the_variable_not_its_value(tmp_path: Path, key: str, shown: str) -> None:
    config = tmp_path / "federation.yaml"
    lines = ["servers:", "  a:", "    transport: stdio", "    command: echo"]
    field = key.split(":")[0]
    lines = [line for line in lines if not line.strip().startswith(f"{field}:")] + [f"    {key}"]
    config.write_text("\n".join(lines) + "\n")
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "check", "-c", str(config)],
        capture_output=True,
        text=True,
        timeout=RUN_TIMEOUT_S,
        env={**os.environ, "DS_TOKEN": DS_TOKEN},
    )
    assert done.returncode == 2, done.stderr
    assert DS_TOKEN not in done.stderr + done.stdout
    assert done.stderr.splitlines() == [done.stderr.strip()]
    assert done.stderr.startswith(f"gateway: invalid configuration: {config}:{len(lines)}: {shown}"), done.stderr
