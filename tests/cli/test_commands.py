"""The ``gateway`` command as a user meets it first: commands that serve nothing start without the server stack, and
commands that need no federation.yaml do not ask for one. (How long they take is measured in docs/benchmarks.md,
"The command line's start"; here what they load.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from gateway.ledger.sqlite import Ledger
from tests.fixtures import FIXTURES
from tests.fixtures.ledger_writer import make_record

SERVER_STACK = (
    "mcp",
    "mcp_types",
    "starlette",
    "uvicorn",
    "httpx2",
    "gateway.core",
    "gateway.front",
    "gateway.backends",
)
"""What only serving needs: the SDK, the HTTP stack, and the gateway's routing, front and backends."""

_LOADED = """
import json, sys
from gateway.cli.main import main
try:
    main(sys.argv[1:])
except SystemExit:
    pass
print(json.dumps(sorted(sys.modules)), file=sys.stderr)
"""


def _loaded(*argv: str, cwd: Path) -> tuple[list[str], str]:
    """The modules a ``gateway ARGV`` run loaded (the last line of its stderr), and its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", _LOADED, *argv], capture_output=True, text=True, timeout=60, cwd=cwd, env=os.environ
    )
    modules: list[str] = json.loads(done.stderr.splitlines()[-1])
    return modules, done.stdout


def _stack(modules: list[str]) -> list[str]:
    return [m for m in modules if any(m == s or m.startswith(f"{s}.") for s in SERVER_STACK)]


@pytest.mark.spawns
def test_gateway_version_loads_nothing_of_the_server_stack(tmp_path: Path) -> None:
    modules, out = _loaded("--version", cwd=tmp_path)
    assert out.startswith("gateway ")
    assert _stack(modules) == []
    assert "pydantic" not in modules and "structlog" not in modules


@pytest.mark.spawns
def test_gateway_import_loads_nothing_of_the_server_stack(tmp_path: Path) -> None:
    modules, out = _loaded("import", str(FIXTURES / "client_configs" / "claude_desktop_config.json"), cwd=tmp_path)
    assert out.startswith("# Imported by `gateway import`")
    assert _stack(modules) == []


@pytest.mark.spawns
def test_gateway_audit_loads_nothing_of_the_server_stack_and_with_db_no_configuration(tmp_path: Path) -> None:
    ledger = tmp_path / "audit.db"
    _ledger_with_one_call(ledger)
    modules, out = _loaded("audit", "stats", "--db", str(ledger), "--json", cwd=tmp_path)
    assert [row["tool"] for row in json.loads(out)] == ["search"]
    assert _stack(modules) == []
    assert "gateway.config" not in modules and "pydantic" not in modules  # --db: no federation.yaml is read
    # Reading federation.yaml (for the ledger it names) teaches the redactor its secrets, and loads no more.
    (tmp_path / "federation.yaml").write_text(f"gateway:\n  audit: {{path: {json.dumps(str(ledger))}}}\n")
    modules, out = _loaded("audit", "stats", "--json", cwd=tmp_path)
    assert [row["tool"] for row in json.loads(out)] == ["search"]
    assert "gateway.config" in modules
    assert _stack(modules) == []


def _ledger_with_one_call(path: Path) -> None:
    async def write() -> None:
        async with Ledger(path) as ledger:
            await ledger.record(make_record("c1"))

    anyio.run(write)


def _gateway(*argv: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    """``gateway ARGV`` run as a user runs it (its own process: the command configures logging for itself)."""
    command = [sys.executable, "-m", "gateway", *argv]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=cwd, env=os.environ)


@pytest.mark.spawns
def test_audit_stats_with_db_reads_that_ledger_without_a_federation_yaml(tmp_path: Path) -> None:
    ledger = tmp_path / "elsewhere" / "audit.db"
    ledger.parent.mkdir()
    _ledger_with_one_call(ledger)
    done = _gateway("audit", "stats", "--db", str(ledger), "--json", cwd=tmp_path)  # no federation.yaml here
    assert done.returncode == 0, done.stderr
    assert [(row["tool"], row["calls"]) for row in json.loads(done.stdout)] == [("search", 1)]
    assert "federation.yaml" not in done.stderr


@pytest.mark.spawns
def test_audit_without_db_and_without_a_federation_yaml_says_to_pass_db(tmp_path: Path) -> None:
    done = _gateway("audit", "stats", cwd=tmp_path)
    assert done.returncode == 2
    assert "federation.yaml: file not found" in done.stderr
    assert "pass --db FILE instead" in done.stderr


@pytest.mark.spawns
def test_check_strict_exits_1_when_a_backend_failed_and_0_when_every_one_is_ready_or_declared_off(
    tmp_path: Path,
) -> None:
    ready = "adapters:\n  t: {command: sh, tools: {x: {argv: [-c, 'echo ok']}}}\n"
    off = "  off: {transport: stdio, command: x, enabled: false}\n"
    failing = "  gone: {transport: stdio, command: definitely-not-a-command-xyz}\n"
    path = tmp_path / "federation.yaml"

    def check(text: str, *options: str) -> subprocess.CompletedProcess[str]:
        path.write_text(text)
        argv = [sys.executable, "-m", "gateway", "check", "-c", str(path), *options]
        return subprocess.run(argv, capture_output=True, text=True, timeout=90, env=os.environ)

    assert check(ready + "servers:\n" + off, "--strict").returncode == 0
    assert check(ready + "servers:\n" + off + failing).returncode == 0  # without --strict: reported, not fatal
    strict = check(ready + "servers:\n" + off + failing, "--strict")
    assert strict.returncode == 1
    assert strict.stderr.splitlines() == [
        "gateway check --strict: backend 'gone' is failed: command not found: definitely-not-a-command-xyz"
    ]
    assert "gone" in strict.stdout  # the table is printed as ever


@pytest.mark.spawns
def test_a_reader_that_stops_reading_ends_the_command_without_a_traceback(tmp_path: Path) -> None:
    ledger = tmp_path / "audit.db"

    async def write() -> None:
        async with Ledger(ledger) as opened:
            for n in range(600):  # about 300 KB of JSON: more than a pipe holds
                await opened.record(make_record(f"c{n}"))

    anyio.run(write)
    command = [sys.executable, "-m", "gateway", "audit", "query", "--db", str(ledger), "--limit", "0", "--json"]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=tmp_path, env=os.environ) as run:
        assert run.stdout is not None and run.stderr is not None
        run.stdout.read(100)  # as `| head -c 100` does, then the reader goes
        run.stdout.close()
        err = run.stderr.read().decode()
        code = run.wait(timeout=60)
    assert code == 1
    assert "Traceback" not in err and "BrokenPipe" not in err, err
