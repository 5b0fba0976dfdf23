"""Tasks (the tasks extension, SEP-2663) through a real ``gateway serve``, over real processes: the task id a client
gets is the gateway's own, bound to the caller who created it, routed by any replica holding the key, and the
ledger keeps the task's creation and its end. A ``tasks/*`` request meets what a call meets: the caller's policy
as it is now, the backend's circuit breaker, the wait for a backend still starting.

The downstream is tests/fixtures/tasks_server.py (its ``GET /tasks`` says what it holds); the client speaks raw
JSON-RPC of the 2026-07-28 era over HTTP, as the conformance suite does.
"""

from __future__ import annotations

import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2
import pytest

from tests.fixtures.gateway_proc import run_gateway
from tests.fixtures.procs import RunningServer, free_port, start_http_server
from tests.system.test_conformance_tasks import tasks_server_argv

pytestmark = pytest.mark.spawns

TASKS = "io.modelcontextprotocol/tasks"
KEY = "k" * 16 + "0123456789abcdef0123456789abcdef"
TOKENS = "alice=tok-alice,bob=tok-bob"


@pytest.fixture(scope="module")
def target() -> Iterator[RunningServer]:
    port = free_port()
    with start_http_server(tasks_server_argv(port), port) as server:
        yield server


def _config(target: RunningServer) -> str:
    return f"""
gateway:
  audit: {{enabled: true, path: audit.db}}
servers:
  target:
    transport: streamable_http
    url: {target.url()}
"""


def rpc(url: str, token: str, method: str, params: dict[str, Any], *, declared: bool = True) -> dict[str, Any]:
    """One 2026-07-28 request (the extension declared unless ``declared`` is false): its result, or its error."""
    caps: dict[str, Any] = {"extensions": {TASKS: {}}} if declared else {}
    meta = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": caps,
        "io.modelcontextprotocol/clientInfo": {"name": "test", "version": "1"},
    }
    headers = {
        **({"Authorization": f"Bearer {token}"} if token else {}),
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": "2026-07-28",
        "Mcp-Method": method,
    }
    name = params.get("taskId") or params.get("name")
    if name is not None:
        headers["Mcp-Name"] = name
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    text = httpx2.post(url, json=body, headers=headers, timeout=20).text
    if not text.startswith("{"):  # an SSE body: its last data line is the answer
        text = [line[5:] for line in text.splitlines() if line.startswith("data:")][-1]
    answer: dict[str, Any] = json.loads(text)
    return answer.get("result") or {"error": answer["error"]}


def _held(target: RunningServer) -> dict[str, tuple[str, str]]:
    return {task: (tool, status) for task, tool, status in httpx2.get(target.url("/tasks")).json()}


def _rows(folder: Path) -> list[tuple[str, str, str, str]]:
    with sqlite3.connect(folder / "audit.db") as conn:
        return conn.execute("SELECT kind, tool, status, caller FROM calls ORDER BY id").fetchall()


def test_a_task_is_its_callers_alone(target: RunningServer, tmp_path: Path) -> None:
    with run_gateway(_config(target), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        url = gateway.url()
        created = rpc(url, "tok-alice", "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}})
        assert created["resultType"] == "task" and created["status"] == "working"
        task = created["taskId"]
        assert task not in _held(target)  # the gateway's own id: the downstream's never reaches the client
        made_up = rpc(url, "tok-bob", "tasks/get", {"taskId": "no-such-task"})["error"]
        for method, more in (("tasks/get", {}), ("tasks/update", {"inputResponses": {}}), ("tasks/cancel", {})):
            refused = rpc(url, "tok-bob", method, {"taskId": task, **more})["error"]
            assert refused == {**made_up, "message": f"Unknown task: {task[:120]}"}  # as if there were none
        assert made_up == {"code": -32602, "message": "Unknown task: no-such-task"}
        assert rpc(url, "tok-alice", "tasks/get", {"taskId": task})["status"] == "working"  # bob's cancel did nothing
        undeclared = rpc(url, "tok-alice", "tasks/get", {"taskId": task}, declared=False)["error"]
        assert undeclared["code"] == -32021
        assert undeclared["data"] == {"requiredCapabilities": {"extensions": {TASKS: {}}}}
        ack = rpc(url, "tok-alice", "tasks/cancel", {"taskId": task})
        assert {key: value for key, value in ack.items() if key != "_meta"} == {"resultType": "complete"}
        assert rpc(url, "tok-alice", "tasks/get", {"taskId": task})["status"] == "cancelled"


def test_any_replica_with_the_key_routes_a_task(target: RunningServer, tmp_path: Path) -> None:
    for folder in ("a", "b", "c"):
        (tmp_path / folder).mkdir()
    env = {"GATEWAY_STATE_KEY": KEY}
    other = {"GATEWAY_STATE_KEY": "z" * 16 + "0123456789abcdef0123456789abcdef"}
    with (
        run_gateway(_config(target), tmp_path / "a", tokens=TOKENS, env=env) as first,
        run_gateway(_config(target), tmp_path / "b", tokens=TOKENS, env=env) as second,
        run_gateway(_config(target), tmp_path / "c", tokens=TOKENS, env=other) as stranger,
    ):
        created = rpc(
            first.url(), "tok-alice", "tools/call", {"name": "confirm_delete", "arguments": {"filename": "f"}}
        )
        task = created["taskId"]
        asked = rpc(second.url(), "tok-alice", "tasks/get", {"taskId": task})
        assert asked["status"] == "input_required" and list(asked["inputRequests"]) == ["confirm"]
        answer = {"confirm": {"action": "accept", "content": {"confirm": True}}}
        rpc(second.url(), "tok-alice", "tasks/update", {"taskId": task, "inputResponses": answer})
        done = rpc(first.url(), "tok-alice", "tasks/get", {"taskId": task})
        assert done["status"] == "completed" and done["taskId"] == task
        assert done["result"]["content"] == [{"type": "text", "text": "Deleted f"}]
        assert rpc(stranger.url(), "tok-alice", "tasks/get", {"taskId": task})["error"]["code"] == -32602
    renamed = _config(target).replace("  target:", "  other:")
    with run_gateway(renamed, tmp_path / "a", tokens=TOKENS, env=env) as gone:  # the key, but not the backend
        assert rpc(gone.url(), "tok-alice", "tasks/get", {"taskId": task})["error"] == {
            "code": -32602,
            "message": f"Unknown task: {task[:120]}",
        }
        assert "the backend that runs it is no longer configured" in gone.output()


def test_the_ledger_keeps_a_tasks_creation_and_its_end(target: RunningServer, tmp_path: Path) -> None:
    with run_gateway(_config(target), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        url = gateway.url()
        quick = rpc(url, "tok-alice", "tools/call", {"name": "slow_compute", "arguments": {"seconds": 0}})["taskId"]
        for _ in range(3):  # polled three times after its end: one row for the end
            assert rpc(url, "tok-alice", "tasks/get", {"taskId": quick})["status"] == "completed"
        failing = rpc(url, "tok-alice", "tools/call", {"name": "protocol_error_job", "arguments": {}})["taskId"]
        slow = rpc(url, "tok-bob", "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}})["taskId"]
        assert rpc(url, "tok-bob", "tasks/get", {"taskId": slow})["status"] == "working"  # no row while it runs
        rpc(url, "tok-bob", "tasks/cancel", {"taskId": slow})
        assert rpc(url, "tok-bob", "tasks/get", {"taskId": slow})["status"] == "cancelled"
        deadline = time.monotonic() + 10  # the fixture fails it half a second after it was made: polled as clients do
        while rpc(url, "tok-alice", "tasks/get", {"taskId": failing})["status"] == "working":
            assert time.monotonic() < deadline
    assert _rows(tmp_path) == [
        ("tools/call", "slow_compute", "task", "alice"),
        ("tasks/get", "slow_compute", "ok", "alice"),
        ("tools/call", "protocol_error_job", "task", "alice"),
        ("tools/call", "slow_compute", "task", "bob"),
        ("tasks/cancel", "slow_compute", "ok", "bob"),
        ("tasks/get", "slow_compute", "cancelled", "bob"),
        ("tasks/get", "protocol_error_job", "error", "alice"),
    ]


def test_only_an_extension_the_gateway_relays_is_offered(tmp_path: Path) -> None:
    """A downstream offering skills (SEP-2640) besides tasks: the gateway offers tasks, which it relays, and not
    skills, whose ``skills/list`` and ``skills/get`` it does not serve (offering it would commit it to them)."""
    skills = "io.modelcontextprotocol/skills"
    port = free_port()
    with start_http_server(tasks_server_argv(port, "--offer", skills), port) as both:
        assert set(rpc(both.url(), "", "server/discover", {})["capabilities"]["extensions"]) == {TASKS, skills}
        with run_gateway(_config(both), tmp_path, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
            offered = rpc(gateway.url(), "", "server/discover", {})["capabilities"]["extensions"]
    assert offered == {TASKS: {}}


def test_a_task_made_through_the_call_tool_is_named_after_the_real_tool(target: RunningServer, tmp_path: Path) -> None:
    """A search-mode client calls the tool through ``call_tool``: its task's rows name the tool it reached."""
    config = _config(target).replace("servers:", "exposure:\n  mode: search\nservers:")
    with run_gateway(config, tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gateway:
        url = gateway.url()
        wrapped = {"name": "slow_compute", "arguments": {"seconds": 0}}
        task = rpc(url, "tok-alice", "tools/call", {"name": "call_tool", "arguments": wrapped})["taskId"]
        assert rpc(url, "tok-alice", "tasks/get", {"taskId": task})["status"] == "completed"
    assert _rows(tmp_path) == [
        ("tools/call", "slow_compute", "task", "alice"),
        ("tasks/get", "slow_compute", "ok", "alice"),
    ]


def _chains(folder: Path) -> list[tuple[str, str, list[str]]]:
    with sqlite3.connect(folder / "audit.db") as conn:
        found = conn.execute("SELECT kind, status, chain FROM calls ORDER BY id").fetchall()
    return [
        (kind, status, [f"{s['provider']}:{s['outcome']}" for s in json.loads(chain)]) for kind, status, chain in found
    ]


def test_a_task_whose_tool_the_callers_policy_now_hides_is_an_unknown_task(
    target: RunningServer, tmp_path: Path
) -> None:
    """The policy is read at every task request, not when the task was made: a reload that hides the tool from its
    caller makes the task unknown to that caller (and its cancel is not sent on)."""
    policy = "policies:\n  team:\n    callers: [alice]\n    tools: {exclude: [%s]}\n"
    with run_gateway(policy % "greet" + _config(target), tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gw:
        url = gw.url()
        task = rpc(url, "tok-alice", "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}})["taskId"]
        assert rpc(url, "tok-alice", "tasks/get", {"taskId": task})["status"] == "working"
        (tmp_path / "federation.yaml").write_text(policy % "slow_compute" + _config(target))
        deadline = time.monotonic() + 20  # the reload applies when the watcher sees the file: asked as a client would
        while "slow_compute" in {t["name"] for t in rpc(url, "tok-alice", "tools/list", {})["tools"]}:
            assert time.monotonic() < deadline
        unknown = {"code": -32602, "message": f"Unknown task: {task[:120]}"}
        for method, more in (("tasks/get", {}), ("tasks/update", {"inputResponses": {}}), ("tasks/cancel", {})):
            assert rpc(url, "tok-alice", method, {"taskId": task, **more})["error"] == unknown
    assert {status for _, status in _held(target).values()} >= {"working"}  # the cancel never reached it
    assert _chains(tmp_path)[-3:] == [
        (m, "refused", ["gateway:refused"]) for m in ("tasks/get", "tasks/update", "tasks/cancel")
    ]


def test_a_task_request_to_a_backend_whose_circuit_is_open_is_not_sent(target: RunningServer, tmp_path: Path) -> None:
    config = _config(target).replace("gateway:", "gateway:\n  circuit_breaker: {failure_threshold: 1, cooldown_s: 600}")
    with run_gateway(config + "    timeout_s: 1\n", tmp_path, tokens=TOKENS, env={"GATEWAY_STATE_KEY": KEY}) as gw:
        url = gw.url()
        task = rpc(url, "tok-alice", "tools/call", {"name": "slow_compute", "arguments": {"seconds": 60}})["taskId"]
        slow = {"name": "slow_compute", "arguments": {"seconds": 5}}  # without the extension: a call that times out
        assert "timed out" in rpc(url, "tok-alice", "tools/call", slow, declared=False)["content"][0]["text"]
        skipped = rpc(url, "tok-alice", "tools/call", {"name": "greet", "arguments": {"name": "a"}})
        assert (
            skipped["isError"]
            and "circuit_open (circuit open after 1 consecutive failure" in (skipped["content"][0]["text"])
        )
        refused = rpc(url, "tok-alice", "tasks/get", {"taskId": task})["error"]
        assert refused["code"] == -32603 and "circuit open after 1 consecutive failure" in refused["message"]
    assert _chains(tmp_path)[-1] == ("tasks/get", "error", ["target:circuit_open"])


def test_a_task_request_that_races_startup_waits_for_its_backend(tmp_path: Path) -> None:
    """A replica that has just started, its backend still connecting (the downstream holds every request), holds
    a ``tasks/get`` until the backend is ready, as it holds a call, instead of answering that it is not ready."""
    port = free_port()
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    env = {"GATEWAY_STATE_KEY": KEY}
    with start_http_server(tasks_server_argv(port), port) as server:
        with run_gateway(_config(server), tmp_path / "a", tokens=TOKENS, env=env) as first:
            created = {"name": "slow_compute", "arguments": {"seconds": 60}}
            task = rpc(first.url(), "tok-alice", "tools/call", created)["taskId"]
        httpx2.post(server.url("/hold"))
        with run_gateway(_config(server), tmp_path / "b", tokens=TOKENS, env=env, started=False) as second:
            answers: list[dict[str, Any]] = []
            asking = threading.Thread(
                target=lambda: answers.append(rpc(second.url(), "tok-alice", "tasks/get", {"taskId": task}))
            )
            asking.start()
            deadline = time.monotonic() + 10
            while "request.waiting_for_startup" not in second.output():
                assert time.monotonic() < deadline and asking.is_alive(), answers
            httpx2.post(server.url("/release"))
            asking.join(timeout=20)
    assert answers and answers[0]["status"] == "working", answers
