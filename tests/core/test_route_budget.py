"""A variant that cannot run is found out before the call, and every call has one deadline shared by its rungs.

Real gateway processes over loopback HTTP; the adapter is this Python, so each variant is a real spawned program:
one hangs (as offline `qmd query` does), one answers at once, one is gated by a probe whose output says its model is
missing (as `qmd doctor` does), one by a probe that finds everything in place.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.fixtures.gateway_proc import GatewayProcesses, mcp_session
from tests.fixtures.procs import RunningServer

pytestmark = pytest.mark.anyio

TOKEN = "budget-token"
PY = sys.executable
HANG = "import time; time.sleep(60)"
FAST = "import json; print(json.dumps([{'file': 'x.md', 'title': 'X', 'score': 0.5, 'snippet': 's'}]))"
MISSING = "print('Models'); print('  model cache: missing 1/1: reranking: hf:some/model.gguf')"
PRESENT = "print('  model cache: 1/1 present')"


def _config(total_s: float = 3, floor_s: float = 1) -> str:
    return f"""
gateway:
  call_budget: {{total_s: {total_s}, floor_s: {floor_s}}}
adapters:
  cli:
    command: {PY}
    tools:
      search:
        input_schema:
          type: object
          properties: {{mode: {{enum: [hang, gated, probed, fast], default: fast}}}}
        switch: mode
        variants:
          hang: {{argv: [-c, "{HANG}"], timeout_s: 60}}
          gated:
            argv: [-c, "{HANG}"]
            timeout_s: 60
            probe: {{argv: [-c, "{MISSING}"], unready_when: ["model cache: missing"]}}
          probed:
            argv: [-c, "{FAST}"]
            probe: {{argv: [-c, "{PRESENT}"], unready_when: ["model cache: missing"]}}
          fast: {{argv: [-c, "{FAST}"]}}
        ladder: {{hang: fast, gated: fast, probed: fast}}
        output: json_array
"""


@pytest.fixture(scope="module")
def gateway(gateway_process: GatewayProcesses) -> RunningServer:
    return gateway_process(_config(), tokens=TOKEN)


async def _call(server: RunningServer, mode: str) -> tuple[Any, float]:
    async with mcp_session(server.url(), token=TOKEN) as session:
        started = time.perf_counter()
        with anyio.fail_after(10):
            result = await session.call_tool("search", {"mode": mode})
        return result, time.perf_counter() - started


def _steps(result: Any) -> list[tuple[str, str, str | None]]:
    meta = result.meta["mcp-gateway/call"]
    return [(s["variant"], s["outcome"], s["reason"]) for s in meta["steps"]]


async def test_a_hanging_rung_is_cut_so_the_floor_answers_within_the_calls_budget(gateway: RunningServer) -> None:
    result, elapsed = await _call(gateway, "hang")
    assert not result.is_error
    assert _steps(result) == [
        ("hang", "timeout", "cut after 2.0 s by the call's budget of 3 s (1 s kept for the rungs after it)"),
        ("fast", "ok", None),
    ]
    assert json.loads(result.content[0].text)[0]["file"] == "x.md"
    assert 2.0 <= elapsed < 3.0  # its own timeout is 60 s: the budget cut it, and the floor kept its second


async def test_a_variant_its_probe_found_unable_to_run_is_skipped_at_once_with_the_line(
    gateway: RunningServer,
) -> None:
    result, elapsed = await _call(gateway, "gated")
    steps = result.meta["mcp-gateway/call"]["steps"]
    reason = (
        "variant gated is not ready: model cache: missing 1/1: reranking: hf:some/model.gguf "
        f"(detected by `{Path(PY).name} -c {MISSING}`)"
    )
    assert _steps(result) == [("gated", "not_ready", reason), ("fast", "ok", None)]
    assert steps[0]["ms"] < 50  # nothing spawned: the hanging program would take a minute
    assert elapsed < 2.0


async def test_a_variant_whose_probe_finds_it_ready_is_tried(gateway: RunningServer) -> None:
    result, _ = await _call(gateway, "probed")
    meta = result.meta["mcp-gateway/call"]
    assert (meta["status"], meta["variant"]) == ("ok", "probed")


async def test_status_and_check_show_the_detected_reason_on_the_variant(gateway: RunningServer, tmp_path: Path) -> None:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        with anyio.fail_after(10):
            status = (await http.get(gateway.url("/status"))).json()
    [cli] = [b for b in status["backends"] if b["name"] == "cli"]
    detail = f"model cache: missing 1/1: reranking: hf:some/model.gguf (detected by `{Path(PY).name} -c {MISSING}`)"
    assert (cli["state"], cli["variants_not_ready"]) == (
        "ready",
        [{"variant": "search[gated]", "reason": detail, "detected": True}],
    )
    (tmp_path / "federation.yaml").write_text(_config())
    with anyio.fail_after(60):
        done = await anyio.run_process(
            [PY, "-m", "gateway", "check", "-c", str(tmp_path / "federation.yaml")], check=False
        )
    assert done.returncode == 0, done.stderr.decode()
    assert f"(detected) variant search[gated] not ready: {detail}" in done.stdout.decode()
    assert (done.stdout + done.stderr).decode().count(detail) == 1, done.stderr.decode()  # the table's row only
