"""The federation core, end to end: the real gateway process in front of real downstream servers.

Downstreams are tests/fixtures/echo_server.py over stdio and streamable HTTP, plus deliberately broken ones (an HTML
502 page, a missing command, a process that exits at once, one that hangs in initialize). Clients are the SDK's.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession
from mcp.shared.exceptions import MCPError

from tests.fixtures.downstreams import Downstream, Downstreams
from tests.fixtures.gateway_proc import PYTHON, GatewayProcesses, echo_argv, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer, free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

TOKEN = "s3cret-token-for-tests"


def _yaml_list(items: list[str]) -> str:
    return json.dumps(items)


@pytest.fixture(scope="module")
def echo_http(downstream: Downstreams) -> Downstream:
    return downstream("echo", "streamable_http", "--name", "b", own=True)  # a test reads what it writes


@pytest.fixture(scope="module")
def html_502(downstream: Downstreams) -> Downstream:
    return downstream("html_error")


@pytest.fixture(scope="module")
def federation(echo_http: Downstream, html_502: Downstream, tmp_path_factory: pytest.TempPathFactory) -> str:
    return f"""
version: 1
gateway:
  name: test-gateway
  instructions: "Use the echo tools."
  router_note: "ROUTER-NOTE: pick the right tool."
  audit: {{path: audit.db}}
servers:
  a:
    transport: stdio
    command: {PYTHON}
    args: {_yaml_list(echo_argv("--name", "a")[1:])}
    router: true
    timeout_s: 5
  b:
    transport: streamable_http
    url: {echo_http.url()}
    timeout_s: 5
  html:
    transport: streamable_http
    url: {html_502.url()}
  missing:
    transport: stdio
    command: definitely-not-a-command-xyz
  exits:
    transport: stdio
    command: {PYTHON}
    args: ["-c", "import sys; print('fatal: bad config file', file=sys.stderr); sys.exit(3)"]
  hangs:
    transport: stdio
    command: {PYTHON}
    args: ["-c", "import time; time.sleep(600)"]
    connect_timeout_s: 1.5
  off:
    transport: stdio
    command: whatever
    enabled: false
    disabled_reason: "HTTP transport returns an error page rather than a valid handshake"
"""


@pytest.fixture(scope="module")
def gateway(federation: str, gateway_process: GatewayProcesses) -> RunningServer:
    return gateway_process(federation, tokens=f"tester={TOKEN}")


async def _wait_state(server: RunningServer, backend: str, state: str, *, limit: float = 20.0) -> dict[str, Any]:
    found: dict[str, Any] = {}
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:

        async def reached() -> bool:
            doc = (await http.get(server.url("/status"))).json()
            found.update(next(b for b in doc["backends"] if b["name"] == backend))
            return bool(found["state"] == state)

        await eventually(reached, within=limit)
    return found


# ------------------------------------------------------------------------------------------------ catalog


async def test_lists_the_tools_of_every_ready_backend_prefixing_only_colliding_names(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        names = {tool.name for tool in (await session.list_tools()).tools}
    assert {"a__echo", "b__echo", "a__add", "b__add", "a__with_defs", "b__with_defs"} <= names
    assert not any(name.startswith(("html__", "missing__", "exits__", "hangs__", "off__")) for name in names)
    assert len(names) == 16


async def test_initialize_carries_the_configured_instructions_and_list_changed(gateway: RunningServer) -> None:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        async with mcp_session(gateway.url(), token=TOKEN):
            pass
        from mcp.client.streamable_http import streamable_http_client

        async with streamable_http_client(gateway.url(), http_client=http) as (read, write):
            async with ClientSession(read, write) as session:
                init = await session.initialize()
    assert init.instructions == "Use the echo tools."
    assert init.server_info.name == "test-gateway"
    assert init.capabilities.tools is not None and init.capabilities.tools.list_changed


async def test_router_note_is_appended_only_to_router_marked_tools(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        tools = {tool.name: tool for tool in (await session.list_tools()).tools}
    assert tools["a__echo"].description == "Echo the text back.\n\nROUTER-NOTE: pick the right tool."
    assert tools["b__echo"].description == "Echo the text back."


async def test_schemas_pass_through_byte_for_byte(gateway: RunningServer, echo_http: Downstream) -> None:
    async with mcp_session(echo_http.url()) as direct:
        direct_tools = {t.name: t for t in (await direct.list_tools()).tools}
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        via = {t.name: t for t in (await session.list_tools()).tools}
    for name in ("with_defs", "add"):
        assert json.dumps(via[f"b__{name}"].input_schema) == json.dumps(direct_tools[name].input_schema)
        assert via[f"b__{name}"].output_schema == direct_tools[name].output_schema
    assert "$defs" in via["b__with_defs"].input_schema


# ------------------------------------------------------------------------------------------------ parity


@pytest.mark.parametrize(
    ("tool", "arguments"),
    [
        ("echo", {"text": "héllo"}),
        ("add", {"a": 2, "b": 40}),
        ("fail", {"message": "a tool error is an answer"}),
    ],
)
async def test_results_are_the_same_direct_and_through_the_gateway(
    gateway: RunningServer, echo_http: Downstream, tool: str, arguments: dict[str, Any]
) -> None:
    async with mcp_session(echo_http.url()) as direct:
        expected = await direct.call_tool(tool, arguments)
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        got = await session.call_tool(f"b__{tool}", arguments)
    assert got.content == expected.content
    assert got.structured_content == expected.structured_content
    assert got.is_error == expected.is_error
    assert got.meta is not None and got.meta["mcp-gateway/call"]["served_by"] == f"b/{tool}"


async def test_an_unknown_tool_is_a_json_rpc_error_not_a_tool_result(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        with pytest.raises(MCPError) as caught:
            await session.call_tool("no_such_tool", {})
    assert caught.value.error.code == -32602
    assert "no_such_tool" in caught.value.error.message


# ------------------------------------------------------------------------------------------------ reasons


async def test_each_broken_backend_has_its_classified_reason_and_the_others_serve(gateway: RunningServer) -> None:
    await _wait_state(gateway, "hangs", "failed")
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        doc = (await http.get(gateway.url("/status"))).json()
    reasons = {b["name"]: (b["state"], b["reason"] or "") for b in doc["backends"]}
    assert reasons["a"][0] == "ready" and reasons["b"][0] == "ready"
    assert reasons["html"][0] == "failed" and "HTTP 502 with an HTML page" in reasons["html"][1]
    assert reasons["missing"] == ("failed", "command not found: definitely-not-a-command-xyz")
    assert reasons["exits"][0] == "failed"
    assert "exited with code 3" in reasons["exits"][1] and "fatal: bad config file" in reasons["exits"][1]
    assert reasons["hangs"][0] == "failed" and "handshake timed out" in reasons["hangs"][1]
    assert reasons["off"] == ("disabled", "HTTP transport returns an error page rather than a valid handshake")
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        assert (await session.call_tool("a__echo", {"text": "still here"})).content[0].text == "still here"


async def test_healthz_is_public_and_names_states_but_no_reasons(gateway: RunningServer) -> None:
    async with httpx2.AsyncClient() as http:

        async def backend_a_ready() -> bool:
            return (await http.get(gateway.url("/healthz"))).json()["backends"]["a"] == "ready"

        await eventually(backend_a_ready, within=30)  # run alone, the gateway may still be connecting to it
        response = await http.get(gateway.url("/healthz"))
    assert response.status_code == 200
    doc = response.json()
    assert doc["status"] == "degraded"
    assert doc["backends"]["a"] == "ready" and doc["backends"]["off"] == "disabled"
    assert "reason" not in response.text


async def test_the_root_path_points_to_mcp_ui_and_status_without_a_token(gateway: RunningServer) -> None:
    async with httpx2.AsyncClient() as http:
        with anyio.fail_after(10):
            response = await http.get(gateway.url("/"))
    assert response.status_code == 200
    doc = response.json()
    assert [doc[k].split(" ")[0] for k in ("mcp", "ui", "status")] == ["/mcp", "/ui", "/status"]
    assert TOKEN not in response.text and "ready" not in response.text  # pointers only: no state


def test_check_finds_the_projects_tools_next_to_the_file_without_them_on_path(tmp_path: Path) -> None:
    tools = tmp_path / ".tools" / "bin"
    tools.mkdir(parents=True)
    (tools / "project-only-tool").write_text("#!/bin/sh\necho ok\n")
    (tools / "project-only-tool").chmod(0o755)
    path = tmp_path / "federation.yaml"
    path.write_text("adapters:\n  t:\n    command: project-only-tool\n    tools: {x: {argv: []}}\n")
    env = {k: v for k, v in os.environ.items() if k != "PATH"} | {"PATH": "/usr/bin:/bin"}
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "check", "-c", str(path), "--json"],
        capture_output=True, text=True, timeout=60, env=env,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    [backend] = json.loads(done.stdout)["backends"]
    assert (backend["name"], backend["state"], backend["reason"]) == ("t", "ready", None)


def test_check_json_is_the_status_document_with_its_config_section_as_status_has_it(tmp_path: Path) -> None:
    # docs/operations.md: `--json` prints the document /status serves; its `config` is an object there, and a
    # script reading both must find the same shape (it was replaced by the bare file name).
    path = tmp_path / "federation.yaml"
    path.write_text("adapters:\n  t:\n    command: sh\n    tools: {x: {argv: [-c, 'echo ok']}}\n")
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "check", "-c", str(path), "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    config = json.loads(done.stdout)["config"]
    assert (config["file"], config["reload_error"]) == (str(path), None)
    assert isinstance(config["loaded_at"], float)


def test_check_prints_states_and_reasons_and_exits_0(federation: str, tmp_path: Path) -> None:
    path = tmp_path / "federation.yaml"
    path.write_text(federation)
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "check", "-c", str(path), "--json"], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    doc = json.loads(done.stdout)
    states = {b["name"]: b["state"] for b in doc["backends"]}
    assert states == {
        "a": "ready",
        "b": "ready",
        "html": "failed",
        "missing": "failed",
        "exits": "failed",
        "hangs": "failed",
        "off": "disabled",
    }
    table = subprocess.run(
        [PYTHON, "-m", "gateway", "check", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert table.returncode == 0
    assert "command not found: definitely-not-a-command-xyz" in table.stdout
    assert "(declared) HTTP transport returns an error page" in table.stdout


def test_check_states_a_failing_backends_reason_once(tmp_path: Path) -> None:
    # The reason was printed twice: a backend.state warning on stderr, then the table's row.
    path = tmp_path / "federation.yaml"
    path.write_text("servers:\n  gone:\n    transport: stdio\n    command: definitely-not-a-command-xyz\n")
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "check", "-c", str(path)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    reason = "command not found: definitely-not-a-command-xyz"
    assert (done.stdout + done.stderr).count(reason) == 1, done.stdout + done.stderr
    assert [line.split()[:3] for line in done.stdout.splitlines() if reason in line] == [["gone", "stdio", "failed"]]
    loud = subprocess.run(  # asked for, the log lines are written as before
        [PYTHON, "-m", "gateway", "--log-level", "warning", "check", "-c", str(path)],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert '"event": "backend.state"' in loud.stderr and reason in loud.stdout


# ------------------------------------------------------------------------------------------------ crashes


async def test_a_backend_killed_mid_call_answers_is_error_fast_then_heals(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        with anyio.fail_after(10):
            result = await session.call_tool("a__crash", {})
        assert result.is_error
        text = result.content[0].text
        assert "a/crash" in text and "connection closed" in text
    entry = await _wait_state(gateway, "a", "ready")
    assert "exited with code 3" in (entry["last_error"] or "") and "crashing on purpose" in entry["last_error"]
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        assert (await session.call_tool("a__echo", {"text": "back"})).content[0].text == "back"


async def test_a_downstream_timeout_is_an_is_error_naming_the_backend(gateway: RunningServer) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        with anyio.fail_after(20):
            result = await session.call_tool("b__sleep", {"seconds": 30})
    assert result.is_error
    assert "b/sleep" in result.content[0].text and "timed out after 5 s" in result.content[0].text


# ------------------------------------------------------------------------------------------------ progress, cancel


async def test_progress_notifications_come_back_through_the_gateway(gateway: RunningServer) -> None:
    seen: list[tuple[float, float | None, str | None]] = []

    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        seen.append((progress, total, message))

    async with mcp_session(gateway.url(), token=TOKEN) as session:
        for tool in ("a__slow", "b__slow"):
            seen.clear()
            result = await session.call_tool(tool, {"seconds": 0.1, "steps": 3}, progress_callback=on_progress)
            assert result.content[0].text == "done 3"
            assert seen == [(1, 3, "step 1"), (2, 3, "step 2"), (3, 3, "step 3")]


async def test_cancellation_reaches_the_downstream(gateway: RunningServer, echo_http: Downstream) -> None:
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        with pytest.raises(MCPError):
            await session.call_tool("b__sleep", {"seconds": 60}, read_timeout_seconds=0.5)
    await eventually(lambda: "cancelled sleep" in echo_http.output())


# ------------------------------------------------------------------------------------------------ list_changed


async def test_a_lost_backend_keeps_its_tools_listed_and_its_calls_say_why_until_it_returns(tmp_path: Path) -> None:
    """Clients cache tool lists: a backend that was ready and is lost keeps its last known tools in the catalog (no
    list change for a reconnect), and a call to one is answered at once with an isError naming the backend and why,
    with a ledger row; when the backend is back the same name is served again."""
    port = free_port()
    config = f"""
gateway:
  audit: {{path: {tmp_path / "audit.db"}}}
servers:
  a:
    transport: stdio
    command: {PYTHON}
    args: {_yaml_list(echo_argv("--name", "a")[1:])}
  b:
    transport: streamable_http
    url: http://127.0.0.1:{port}/mcp
    connect_timeout_s: 2
    ping_interval_s: 0.5
"""
    changes: list[Any] = []

    async def on_message(message: Any) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            changes.append(message)

    backend_argv = echo_argv("--http", str(port), "--name", "b", "--prefix", "b_")
    with start_http_server(backend_argv, port) as backend:
        with run_gateway(config, tmp_path, tokens=TOKEN) as gateway:
            async with mcp_session(gateway.url(), token=TOKEN, message_handler=on_message) as session:
                listed = {t.name for t in (await session.list_tools()).tools}
                assert {"b_echo", "echo"} <= listed  # no collision: no prefixes
                os.killpg(backend.process.pid, signal.SIGKILL)

                async def b_failed() -> bool:
                    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
                        status = (await http.get(gateway.url("/status"))).json()
                    return any(b["name"] == "b" and b["state"] == "failed" for b in status["backends"])

                await eventually(b_failed, within=30)
                assert {t.name for t in (await session.list_tools()).tools} == listed  # still listed, unchanged
                with anyio.fail_after(5):  # at once: no wait for a connection that is not there
                    down = await session.call_tool("b_echo", {"text": "anyone?"})
                assert down.is_error
                text = down.content[0].text
                assert text.startswith("Tool 'b_echo' failed: every provider failed. b/b_echo: unavailable (")
                with start_http_server(backend_argv, port):  # the backend comes back on its own address

                    async def served() -> bool:
                        return not (await session.call_tool("b_echo", {"text": "rejoined"})).is_error

                    await eventually(served, within=40)  # the backend reconnects with backoff
                    assert (await session.call_tool("b_echo", {"text": "rejoined"})).content[0].text == "rejoined"
                assert changes == []  # the list never changed, so no client was told to re-list
    with sqlite3.connect(tmp_path / "audit.db") as db:
        statuses = [row[0] for row in db.execute("SELECT status FROM calls WHERE tool = 'b_echo' ORDER BY id")]
    assert statuses[0] == "error" and statuses[-2:] == ["ok", "ok"]  # the refused call left its row too


# ------------------------------------------------------------------------------------------------ auth


async def test_requests_without_the_right_token_get_401_before_any_mcp_work(gateway: RunningServer) -> None:
    body = {"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}}
    headers = {"Accept": "application/json, text/event-stream"}
    async with httpx2.AsyncClient() as http:
        missing = await http.post(gateway.url(), json=body, headers=headers)
        wrong = await http.post(gateway.url(), json=body, headers={**headers, "Authorization": "Bearer nope"})
        status = await http.get(gateway.url("/status"))
    assert missing.status_code == 401 and wrong.status_code == 401 and status.status_code == 401
    assert "bearer" in missing.headers["www-authenticate"].lower()
    assert TOKEN not in missing.text


async def test_a_foreign_host_header_is_refused(gateway: RunningServer) -> None:
    async with httpx2.AsyncClient() as http:
        response = await http.post(
            gateway.url(),
            json={"jsonrpc": "2.0", "id": 1, "method": "ping"},
            headers={"Host": "evil.example.com", "Authorization": f"Bearer {TOKEN}"},
        )
    assert 400 <= response.status_code < 500


def test_a_non_loopback_bind_without_tokens_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "federation.yaml"
    path.write_text("servers: {}\n")
    env = {**os.environ, "GATEWAY_TOKENS": ""}
    done = subprocess.run(
        [PYTHON, "-m", "gateway", "serve", "-c", str(path), "--host", "0.0.0.0", "--port", str(free_port())],
        capture_output=True,
        text=True,
        timeout=30,
        env=env,
    )
    assert done.returncode == 2
    assert "refusing to serve on 0.0.0.0 without a bearer token" in done.stderr


# ------------------------------------------------------------------------------------------------ bad config


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("servers:\n  a: [\n", ":3: YAML syntax error"),
        (
            "servers:\n  a:\n    transport: stdio\n    command: x\n    colour: red\n",
            ":5: servers.a.colour: unknown key",
        ),
        ("servers:\n  a:\n    transport: stdio\n    command: x\n    timeout_s: soon\n", ":5: servers.a.timeout_s:"),
        (
            "servers:\n  a:\n    transport: sse\n    url: http://x/sse\n    headers: {X-Key: '${NOT_SET_ANYWHERE}'}\n",
            ":5: servers.a.headers.X-Key: environment variable NOT_SET_ANYWHERE is not set",
        ),
    ],
)
def test_a_bad_config_exits_2_naming_file_key_path_and_line(tmp_path: Path, text: str, expected: str) -> None:
    path = tmp_path / "federation.yaml"
    path.write_text(text)
    env = {k: v for k, v in os.environ.items() if k != "NOT_SET_ANYWHERE"}
    for command in ("check", "serve"):
        done = subprocess.run(
            [PYTHON, "-m", "gateway", command, "-c", str(path)], capture_output=True, text=True, timeout=30, env=env
        )
        assert done.returncode == 2
        assert f"{path}{expected}" in done.stderr


# ------------------------------------------------------------------------------------------------ shutdown


async def test_sigterm_stops_the_gateway_cleanly_and_every_child_process_ends(tmp_path: Path) -> None:
    config = f"""
servers:
  a:
    transport: stdio
    command: {PYTHON}
    args: {_yaml_list(echo_argv("--name", "a")[1:])}
"""
    with run_gateway(config, tmp_path, tokens=TOKEN) as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as session:
            child = int((await session.call_tool("pid", {})).content[0].text)
        os.kill(gateway.process.pid, signal.SIGTERM)
        await eventually(lambda: gateway.process.poll() is not None, within=15)
        assert gateway.process.returncode == 0, gateway.output()
    await eventually(lambda: not _alive(child), within=5)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    try:  # a zombie is dead for our purpose
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except OSError:
        return False


if sys.platform != "linux":  # pragma: no cover
    pytest.skip("process-group tests need Linux", allow_module_level=True)
