"""Shutdown and processes, over a real ``gateway serve`` process and real programs (tests/fixtures/fake_cli.py).

What is proved: a command-line call's grandchild that left the process group (``setsid``) is gone after the answer
and after a timeout; SIGTERM drains in-flight calls for ``gateway.drain_s``, then cancels them with an answer that
says the gateway is shutting down and a ``cancelled`` ledger row; a second SIGTERM cancels at once and still writes
the rows and kills the children; and after SIGKILL no process the gateway started, nor any of theirs, is left.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import sys
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from gateway.core.router import META_KEY
from gateway.ledger.engines import open_reader
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer, read_pids
from tests.fixtures.waiting import eventually

if sys.platform != "linux":  # pragma: no cover
    pytest.skip("the process guarantees are Linux ones (/proc, prctl)", allow_module_level=True)

pytestmark = pytest.mark.anyio

FAKE_CLI = str(FIXTURES / "fake_cli.py")
SHUTTING_DOWN = "the gateway is shutting down"


def federation(*, drain_s: float | None = None, timeout_s: float = 60) -> str:
    drain = f"\n  drain_s: {drain_s}" if drain_s is not None else ""
    return f"""
version: 1
gateway:
  audit: {{path: audit.db}}{drain}
adapters:
  fake:
    command: {PYTHON}
    tools:
      escape:
        argv: [{FAKE_CLI}, escape, "{{pidfile}}", "{{then}}"]
        input_schema: {{type: object, required: [pidfile, then], properties: {{pidfile: {{type: string}},
                        then: {{enum: [answer, hang]}}}}}}
        output: json_array
        timeout_s: {timeout_s}
      sleep:
        argv: [{FAKE_CLI}, sleep]
        input_schema: {{type: object}}
        timeout_s: {timeout_s}
"""


def alive(pid: int) -> bool:
    """True while the process exists and is not a zombie (a zombie holds nothing but its pid)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rsplit(")", 1)[1].split()[0] not in ("Z", "X")


def descendants(pid: int) -> set[int]:
    """Live descendants of ``pid`` (by parent pid, over the whole process table)."""
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] not in ("Z", "X"):
                parents[int(entry.name)] = int(fields[1])
    found: set[int] = set()
    frontier = [pid]
    while frontier:
        current = frontier.pop()
        for child, parent in parents.items():
            if parent == current and child not in found:
                found.add(child)
                frontier.append(child)
    return found


def worker(server: RunningServer) -> int:
    """The gateway proper: the one child of the supervisor that ``gateway serve`` starts as (its pid is the one
    everybody sees and signals)."""
    [pid] = descendants(server.process.pid) - descendants_of_children(server.process.pid)
    return pid


def descendants_of_children(pid: int) -> set[int]:
    return {grandchild for child in descendants(pid) for grandchild in descendants(child)}


def text_of(result: types.CallToolResult) -> str:
    [content] = result.content
    assert isinstance(content, types.TextContent)
    return content.text


# --------------------------------------------------------------------------------------------------- grandchildren


async def test_a_grandchild_that_left_the_group_is_gone_after_the_answer(tmp_path: Path, pidfile: Path) -> None:
    with run_gateway(federation(), tmp_path) as gateway:
        async with mcp_session(gateway.url()) as session:
            with anyio.fail_after(20):
                result = await session.call_tool("escape", {"pidfile": str(pidfile), "then": "answer"})
            assert result.structured_content == {"results": []}
            leader, grandchild = read_pids(pidfile)
            await eventually(lambda: not alive(grandchild), within=5)
            assert not alive(leader)
            assert descendants(worker(gateway)) == set()


async def test_a_grandchild_that_left_the_group_is_gone_after_a_timeout(tmp_path: Path, pidfile: Path) -> None:
    with run_gateway(federation(timeout_s=2), tmp_path) as gateway:
        async with mcp_session(gateway.url()) as session:
            with anyio.fail_after(20):
                result = await session.call_tool("escape", {"pidfile": str(pidfile), "then": "hang"})
            assert result.is_error
            assert "timed out after 2 s; process group killed" in text_of(result)
            leader, grandchild = read_pids(pidfile)
            await eventually(lambda: not alive(grandchild), within=5)
            assert not alive(leader)
            assert descendants(worker(gateway)) == set()


# --------------------------------------------------------------------------------------------------- signals


Answers = list[types.CallToolResult | BaseException]


async def call_in_flight(server: RunningServer, pidfile: Path, answers: Answers) -> None:
    """Call ``escape`` (a program that hangs with a setsid grandchild) and keep its answer, or what ended it."""
    try:
        async with mcp_session(server.url()) as session:
            answers.append(await session.call_tool("escape", {"pidfile": str(pidfile), "then": "hang"}))
    except Exception as exc:  # the connection died with the gateway (SIGKILL)
        answers.append(exc)


@dataclass
class InFlight:
    """A call to ``escape`` hanging in its program: the pids the program wrote, and, once the call has ended, its
    answer (or what ended it)."""

    leader: int
    grandchild: int
    answers: Answers


@contextlib.asynccontextmanager
async def a_call_in_flight(server: RunningServer, pidfile: Path) -> AsyncIterator[InFlight]:
    """The body runs while a call to ``escape`` hangs (its program has written its pids); the block is left once the
    call has ended."""
    answers: Answers = []
    async with anyio.create_task_group() as tg:
        tg.start_soon(call_in_flight, server, pidfile, answers)
        await eventually(pidfile.exists)
        leader, grandchild = read_pids(pidfile)
        yield InFlight(leader, grandchild, answers)


def rows(folder: Path) -> list[tuple[str, str]]:
    return [(row.correlation_id, row.status) for row in open_reader(folder / "audit.db").query(limit=None)]


def answer_of(answers: Answers) -> tuple[str, str]:
    """The answer's correlation id and text; it must be the shutdown's isError answer."""
    [answer] = answers
    assert isinstance(answer, types.CallToolResult), answer
    assert answer.is_error
    assert answer.meta is not None
    return answer.meta[META_KEY]["id"], text_of(answer)


async def sigterm_with_a_call_in_flight(
    folder: Path, pidfile: Path, *, drain_s: float, twice: bool
) -> tuple[InFlight, float, float]:
    """SIGTERM (``twice``: a second one once the gateway says it is stopping) while a call is in flight; the call,
    and the seconds from the (first) signal to the call's end and to the gateway's exit. The gateway must exit with
    0 and leave no process behind."""
    with run_gateway(federation(drain_s=drain_s), folder) as gateway:
        with anyio.fail_after(30):
            async with a_call_in_flight(gateway, pidfile) as call:
                signalled = time.monotonic()
                gateway.process.send_signal(signal.SIGTERM)
                if twice:
                    await eventually(lambda: "gateway.stopping" in gateway.output())
                    gateway.process.send_signal(signal.SIGTERM)
            answered = time.monotonic() - signalled
            await eventually(lambda: gateway.process.poll() is not None, within=10)
        exited = time.monotonic() - signalled
        assert gateway.process.returncode == 0, gateway.output()
        assert descendants(gateway.process.pid) == set()  # the gateway, and everything it started, is gone
    return call, answered, exited


async def test_sigterm_lets_calls_drain_then_cancels_them_with_an_answer_and_a_row(
    tmp_path: Path, pidfile: Path
) -> None:
    call, answered, exited = await sigterm_with_a_call_in_flight(tmp_path, pidfile, drain_s=1.5, twice=False)
    correlation_id, text = answer_of(call.answers)
    assert f"{SHUTTING_DOWN} (the calls in progress had 1.5 s to finish)" in text
    assert 1.5 <= answered < 4.0
    assert exited < 6.0
    assert rows(tmp_path) == [(correlation_id, "cancelled")]
    assert not alive(call.leader) and not alive(call.grandchild)


async def test_a_second_sigterm_cancels_at_once_and_still_writes_the_rows_and_kills_the_children(
    tmp_path: Path, pidfile: Path
) -> None:
    call, answered, exited = await sigterm_with_a_call_in_flight(tmp_path, pidfile, drain_s=60, twice=True)
    correlation_id, text = answer_of(call.answers)
    assert f"{SHUTTING_DOWN} (stopped at once by a second signal)" in text
    assert answered < 3.0
    assert exited < 5.0
    assert rows(tmp_path) == [(correlation_id, "cancelled")]
    assert not alive(call.leader) and not alive(call.grandchild)


async def test_sigkill_of_the_gateways_pid_still_answers_writes_the_rows_and_leaves_no_process(
    tmp_path: Path, pidfile: Path
) -> None:
    with run_gateway(federation(drain_s=1), tmp_path) as gateway:
        with anyio.fail_after(30):
            async with a_call_in_flight(gateway, pidfile) as call:
                gateway_proper = worker(gateway)
                gateway.process.send_signal(signal.SIGKILL)  # the supervisor: the gateway gets SIGTERM
            await anyio.to_thread.run_sync(gateway.process.wait, 10)
            await eventually(lambda: not alive(gateway_proper), within=10)
    assert gateway.process.returncode == -signal.SIGKILL
    correlation_id, text = answer_of(call.answers)
    assert SHUTTING_DOWN in text
    assert rows(tmp_path) == [(correlation_id, "cancelled")]
    assert not alive(call.leader) and not alive(call.grandchild)


async def test_sigkill_of_the_gateway_proper_leaves_no_process(tmp_path: Path, pidfile: Path) -> None:
    with run_gateway(federation(), tmp_path) as gateway:
        with anyio.fail_after(30):
            async with a_call_in_flight(gateway, pidfile) as call:
                os.kill(worker(gateway), signal.SIGKILL)  # what an OOM kill does: no shutdown code runs
            await anyio.to_thread.run_sync(gateway.process.wait, 10)
        assert gateway.process.returncode == 128 + signal.SIGKILL, gateway.output()
        assert "supervisor.orphans_killed" in gateway.output()
    [answer] = call.answers
    assert isinstance(answer, Exception)  # nobody was left to answer
    assert rows(tmp_path) == []
    assert not alive(call.leader) and not alive(call.grandchild)


async def test_sighup_to_the_gateways_pid_reloads_and_does_not_stop_it(tmp_path: Path, pidfile: Path) -> None:
    with run_gateway(federation(), tmp_path) as gateway:
        gateway.process.send_signal(signal.SIGHUP)  # the supervisor forwards it to the gateway
        await eventually(lambda: "reload.applied" in gateway.output())
        async with mcp_session(gateway.url()) as session:
            with anyio.fail_after(20):
                result = await session.call_tool("escape", {"pidfile": str(pidfile), "then": "answer"})
        assert result.structured_content == {"results": []}
        assert gateway.process.poll() is None


async def test_an_orphan_that_may_belong_to_a_running_call_is_killed_once_that_call_ends(
    tmp_path: Path, pidfile: Path
) -> None:
    answers: Answers = []
    with run_gateway(federation(timeout_s=3), tmp_path) as gateway:
        async with mcp_session(gateway.url()) as session:

            async def long_call() -> None:
                answers.append(await session.call_tool("sleep", {}))

            with anyio.fail_after(20):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(long_call)  # running when the orphan starts: the orphan could be its helper
                    await eventually(lambda: "fake_cli.py sleep" in " ".join(cmdlines(worker(gateway))))
                    result = await session.call_tool("escape", {"pidfile": str(pidfile), "then": "answer"})
                    assert result.structured_content == {"results": []}
                    _, grandchild = read_pids(pidfile)
                    assert alive(grandchild)  # deferred while the sleep call runs
                await eventually(lambda: not alive(grandchild), within=8)  # that call timed out: now it goes
            [timed_out] = answers
            assert isinstance(timed_out, types.CallToolResult) and "timed out after 3 s" in text_of(timed_out)
            assert descendants(worker(gateway)) == set()


def cmdlines(pid: int) -> list[str]:
    out = []
    for child in descendants(pid):
        with contextlib.suppress(OSError):
            out.append(Path(f"/proc/{child}/cmdline").read_bytes().replace(b"\0", b" ").decode())
    return out


async def test_sigterm_over_stdio_drains_then_answers_the_call_in_flight(tmp_path: Path, pidfile: Path) -> None:
    config = tmp_path / "federation.yaml"
    config.write_text(federation(drain_s=1))
    process = await anyio.open_process(
        [PYTHON, "-m", "gateway", "serve", "--stdio", "-c", str(config)], cwd=tmp_path, start_new_session=True
    )
    assert process.stdin is not None and process.stdout is not None
    init = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
    call = {"name": "escape", "arguments": {"pidfile": str(pidfile), "then": "hang"}}
    messages = [
        {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init},
        {"jsonrpc": "2.0", "method": "notifications/initialized"},
        {"jsonrpc": "2.0", "id": 2, "method": "tools/call", "params": call},
    ]
    try:
        with anyio.fail_after(30):
            await process.stdin.send(b"".join(json.dumps(m).encode() + b"\n" for m in messages))
            await eventually(pidfile.exists)
            leader, grandchild = read_pids(pidfile)
            process.send_signal(signal.SIGTERM)
            output = b""
            async for chunk in process.stdout:  # the answer comes while stdin is still open
                output += chunk
                if b'"id":2' in output and output.endswith(b"\n"):
                    break
            await process.stdin.aclose()  # the stdio transport reads stdin in a thread: it ends at EOF
            code = await process.wait()
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
    [answer] = [m for m in map(json.loads, output.splitlines()) if m.get("id") == 2]
    assert answer["result"]["isError"] is True
    assert f"{SHUTTING_DOWN} (the calls in progress had 1 s to finish)" in answer["result"]["content"][0]["text"]
    assert code == 0
    assert [status for _, status in rows(tmp_path)] == ["cancelled"]
    assert not alive(leader) and not alive(grandchild)
