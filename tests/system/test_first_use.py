"""What a new user sees while trying the gateway, on the real process: a refused edit of the file is a banner on
``/ui`` (not only a log line and a /status field), refusals are counted apart from a tool's errors and latency in
``gateway audit stats`` and on ``/ui``, and the "Last error" cell shows the error."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import anyio
import httpx2
import pytest
from mcp.shared.exceptions import MCPError

from tests.fixtures.gateway_proc import PYTHON, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

SLOW_S = 0.3  # what the tool takes: the latency a refusal must not drag down

CONFIG = f"""
gateway:
  name: first-use
  audit: {{path: audit.db}}
adapters:
  cli:
    command: {sys.executable}
    tools:
      slow:
        input_schema: {{type: object, properties: {{text: {{type: string}}}}, additionalProperties: false}}
        argv: [-c, "import time; time.sleep({SLOW_S}); print('done')"]
servers:
  gone:
    transport: stdio
    command: definitely-not-a-command-xyz
"""


async def _status(server: RunningServer) -> dict[str, object]:
    async with httpx2.AsyncClient() as http:
        doc: dict[str, object] = (await http.get(server.url("/status"))).json()
    return doc


async def _page(server: RunningServer) -> str:
    async with httpx2.AsyncClient() as http:
        return (await http.get(server.url("/ui/"))).text


async def _audit_stats(folder: Path, *options: str) -> str:
    """``gateway audit stats --db`` of the gateway's ledger, run as a user runs it, from another folder."""
    argv = [PYTHON, "-m", "gateway", "audit", "stats", "--db", str(folder / "audit.db"), *options]
    done = await anyio.run_process(argv, cwd=folder.parent, check=False)
    assert done.returncode == 0, done.stderr.decode()
    return done.stdout.decode()


async def test_a_refused_edit_of_the_file_is_a_banner_on_the_status_page_until_an_edit_applies(tmp_path: Path) -> None:
    with run_gateway(CONFIG, tmp_path) as server:
        assert 'id="reload-refused"' not in await _page(server)
        path = tmp_path / "federation.yaml"
        path.write_text(CONFIG + "  extra: {transport: stdoi, command: x}\n")

        async def refused() -> bool:
            config = (await _status(server))["config"]
            return isinstance(config, dict) and bool(config["reload_error"])

        await eventually(refused, within=20)
        page = await _page(server)
        banner = page.split('<section class="banner" id="reload-refused" role="alert">', 1)[1].split("</section>")[0]
        line = len(CONFIG.splitlines()) + 1
        assert f"An edit of <code>{path}</code> was refused" in banner and "keeps serving" in banner
        assert f"{path}:{line}: servers.extra.transport: unknown transport" in banner
        assert "did you mean `stdio`?" in banner
        path.write_text(CONFIG)

        async def applied() -> bool:
            config = (await _status(server))["config"]
            return isinstance(config, dict) and config["reload_error"] is None

        await eventually(applied, within=20)
        assert 'id="reload-refused"' not in await _page(server)


async def test_refusals_are_counted_apart_from_a_tools_errors_and_latency_in_audit_stats_and_on_the_page(
    tmp_path: Path,
) -> None:
    with run_gateway(CONFIG, tmp_path) as server:
        async with mcp_session(server.url()) as session:
            for _ in range(2):
                assert not (await session.call_tool("slow", {})).is_error
            for _ in range(3):  # refused by the tool's schema: no process started, answered at once
                assert (await session.call_tool("slow", {"bogus": 1})).is_error
            with pytest.raises(MCPError):
                await session.call_tool("no_such_tool", {})
        stats = {row["tool"]: row for row in json.loads(await _audit_stats(tmp_path, "--json"))}
        slow = stats["slow"]
        assert (slow["calls"], slow["refused"], slow["by_status"]) == (5, 3, {"ok": 2, "refused": 3})
        assert slow["error_rate"] == 0.0 and slow["p50_ms"] >= SLOW_S * 1000  # the tool's latency, not the gate's
        unknown = stats["no_such_tool"]
        assert (unknown["calls"], unknown["refused"], unknown["p50_ms"]) == (1, 1, None)
        table = (await _audit_stats(tmp_path)).splitlines()
        assert table[0].split()[:3] == ["TOOL", "CALLS", "REFUSED"]
        assert [line.split()[1:5] for line in table if "no_such_tool" in line] == [["1", "1", "-", "-"]]
        page = await _page(server)
        figures = page.split('<table id="stats">', 1)[1].split("</table>", 1)[0]
        row = figures.split("<code>slow</code>", 1)[1].split("</tr>")[0]
        cells = [cell.split(">", 1)[1] for cell in row.split("</td>")[1:-1]]
        assert cells[:2] == ["5", "3"] and float(cells[2].removesuffix(" ms")) >= SLOW_S * 1000  # p50


async def test_the_last_error_cell_shows_the_error_not_a_placeholder(tmp_path: Path) -> None:
    with run_gateway(CONFIG, tmp_path) as server:

        async def failed() -> bool:
            backends = (await _status(server))["backends"]
            return isinstance(backends, list) and any(b["name"] == "gone" and b["state"] == "failed" for b in backends)

        await eventually(failed, within=20)
        page = await _page(server)
    row = page.split('<tr id="backend-gone">', 1)[1].split("</tr>", 1)[0]
    cells = row.split('<td class="text">')
    assert len(cells) == 3  # the reason's cell, and the last error's
    assert "command not found: definitely-not-a-command-xyz" in cells[2]
    assert "the reason" not in row
