"""Credentials in flight, over a real stdio echo server and the wiki: planted in arguments and answers, they are
recorded, redacted or blocked per the backend's ``secrets`` policy, and never reach the ledger or the log."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from gateway.front.http.status import status_document
from gateway.ledger.engines import open_reader
from gateway.ledger.records import AuditRecord
from gateway.testing import InProcess, in_process_gateway
from tests.fixtures.gateway_proc import PYTHON, echo_argv

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

TOKEN = "ghp_" + "a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8"  # a GitHub token's shape, built so no scanner flags this file
KEY = "AKIA" + "IOSFODNN7EXAMPLE"


def _config(tmp_path: Path, default: str, echo: str | None = None) -> str:
    (tmp_path / "wiki").mkdir(exist_ok=True)
    (tmp_path / "wiki" / "keys.md").write_text(f"# Keys\n\nThe deploy key is {KEY}, keep it.\n")
    own = f"\n    secrets: {echo}" if echo is not None else ""
    return f"""
gateway:
  secrets: {default}
  audit: {{path: {json.dumps(str(tmp_path / "audit.db"))}}}
wiki: {{root: {json.dumps(str(tmp_path / "wiki"))}, tools: [files_read]}}
servers:
  s:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv("--stdio")[1:])}{own}
routes:
  say: {{providers: [s/echo], audit: {{text: 200}}}}
"""


@pytest.fixture
def gateway_of(tmp_path: Path):  # type: ignore[no-untyped-def]
    def start(default: str, echo: str | None = None) -> AsyncIterator[InProcess]:
        return in_process_gateway(_config(tmp_path, default, echo))  # type: ignore[return-value]

    return start


def _text(result: types.CallToolResult) -> str:
    return "\n".join(b.text for b in result.content if isinstance(b, types.TextContent))


def _rows(in_process: InProcess) -> list[AuditRecord]:
    assert in_process.gateway.ledger is not None and in_process.gateway.ledger.target is not None
    return sorted(open_reader(in_process.gateway.ledger.target).query(), key=lambda row: row.ts)


def _nowhere(tmp_path: Path, capsys: pytest.CaptureFixture[str], *values: str) -> None:
    """Neither the ledger file nor anything logged holds any of ``values``."""
    stored = b"".join(p.read_bytes() for p in tmp_path.glob("audit.db*"))
    printed = "".join(capsys.readouterr())
    for value in values:
        assert value.encode() not in stored and value not in printed


async def test_record_passes_both_ways_and_the_row_names_kind_and_place(
    gateway_of, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with gateway_of("record") as connected:
        with anyio.fail_after(20):
            said = await connected.client.call_tool("say", {"text": f"use {TOKEN} please"})
            read = await connected.client.call_tool("files_read", {"path": "keys.md"})
        assert TOKEN in _text(said) and KEY in _text(read)  # recorded only: the answers are untouched
        say, files = _rows(connected)[-2:]
    assert say.status == "ok" and ("github_token", "arguments.text", "recorded") in say.secrets
    assert ("github_token", "result.content[0].text", "recorded") in say.secrets
    assert say.arg_preview == {"text": "use [redacted github_token] please"}  # the preview never holds it
    assert files.secrets == (("aws_access_key", "result.content[0].text", "recorded"),)
    _nowhere(tmp_path, capsys, TOKEN, KEY)


async def test_redact_replaces_them_before_they_leave_in_either_direction(
    gateway_of, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with gateway_of("redact") as connected:
        with anyio.fail_after(20):
            said = await connected.client.call_tool("say", {"text": f"use {TOKEN} please"})
            read = await connected.client.call_tool("files_read", {"path": "keys.md"})
        # The echo server answers what it received: the redacted text, so nothing left to find in its answer.
        assert _text(said) == "use [redacted github_token] please"
        assert said.structured_content is not None
        assert said.structured_content["text"] == "use [redacted github_token] please"
        assert "The deploy key is [redacted aws_access_key], keep it." in _text(read) and KEY not in _text(read)
        say, files = _rows(connected)[-2:]
    assert say.secrets == (("github_token", "arguments.text", "redacted"),)
    assert files.secrets == (("aws_access_key", "result.content[0].text", "redacted"),)
    _nowhere(tmp_path, capsys, TOKEN, KEY)


async def test_block_refuses_the_arguments_unsent_and_withholds_the_answer(
    gateway_of, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    async with gateway_of("block") as connected:
        with anyio.fail_after(20):
            said = await connected.client.call_tool("say", {"text": f"use {TOKEN} please"})
            read = await connected.client.call_tool("files_read", {"path": "keys.md"})
            fine = await connected.client.call_tool("say", {"text": "nothing to see"})
        assert said.is_error and "argument 'text'" in _text(said) and "github_token" in _text(said)
        assert read.is_error and "withheld" in _text(read) and "aws_access_key at result.content[0].text" in _text(read)
        assert _text(fine) == "nothing to see"
        say, files, _ = _rows(connected)[-3:]
    assert say.status == "refused" and [s.outcome for s in say.chain] == ["refused"]  # never sent
    assert say.secrets == (("github_token", "arguments.text", "blocked"),)
    assert files.secrets == (("aws_access_key", "result.content[0].text", "blocked"),)
    _nowhere(tmp_path, capsys, TOKEN, KEY)


async def test_a_servers_own_policy_wins_over_the_default(gateway_of) -> None:
    async with gateway_of("block", echo="off") as connected:
        with anyio.fail_after(20):
            said = await connected.client.call_tool("say", {"text": f"use {TOKEN} please"})
        assert TOKEN in _text(said)
        assert _rows(connected)[-1].secrets == ()


async def test_a_credential_a_failing_server_prints_stays_out_of_status(tmp_path: Path) -> None:
    """The reason quotes the server's stderr; /status and `gateway check` show it with the credential redacted."""
    leak = f"import sys; print('auth failed for token {TOKEN}', file=sys.stderr); sys.exit(3)"
    config = f"""
gateway: {{audit: {{path: {json.dumps(str(tmp_path / "audit.db"))}}}}}
servers:
  broken: {{transport: stdio, command: {json.dumps(PYTHON)}, args: ["-c", {json.dumps(leak)}]}}
"""
    with anyio.fail_after(20):
        async with in_process_gateway(config) as connected:
            doc = status_document(connected.gateway)
    [backend] = doc["backends"]
    assert "[redacted github_token]" in backend["reason"], backend
    assert TOKEN not in json.dumps(doc)
