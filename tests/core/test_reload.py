"""Hot reload and healing on the real gateway process, under a steady stream of calls from a connected client.

Edits of federation.yaml add, change, remove and break backends while a client keeps calling: no call may fail, the
client's session must survive every edit, and a broken edit is refused with its location while the configuration in
effect keeps serving. A circuit breaker opens on a backend whose calls keep failing and closes once it answers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.client.session import ClientSession

from tests.fixtures.gateway_proc import PYTHON, echo_argv, mcp_session, run_gateway
from tests.fixtures.procs import RunningServer, free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

TOKEN = "reload-token"


def _stdio(name: str, *extra: str, indent: str = "  ") -> str:
    args = json.dumps(echo_argv("--name", name, "--prefix", f"{name}_", *extra)[1:])
    return f"{indent}{name}:\n{indent}  transport: stdio\n{indent}  command: {PYTHON}\n{indent}  args: {args}\n"


def _http(name: str, url: str) -> str:
    return f"  {name}:\n    transport: streamable_http\n    url: {url}\n    ping_interval_s: 0.5\n"


async def _status(gateway: RunningServer) -> dict[str, Any]:
    async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {TOKEN}"}) as http:
        doc: dict[str, Any] = (await http.get(gateway.url("/status"))).json()
        return doc


async def _names(session: ClientSession) -> set[str]:
    return {t.name for t in (await session.list_tools()).tools}


async def test_edits_apply_without_losing_a_call_or_a_session(tmp_path: Path) -> None:
    port = free_port()
    with start_http_server(echo_argv("--http", str(port), "--name", "b", "--prefix", "b_"), port) as b:
        base = "gateway:\n  drain_s: 5\nservers:\n" + _stdio("a") + _http("b", b.url())
        with run_gateway(base, tmp_path, tokens=TOKEN) as gateway:
            path = tmp_path / "federation.yaml"
            calls: list[tuple[str, bool]] = []
            failures: list[str] = []
            changes = anyio.Event()

            async def on_message(message: Any) -> None:
                nonlocal changes
                if isinstance(message, types.ToolListChangedNotification):
                    changes.set()

            async with mcp_session(gateway.url(), token=TOKEN, message_handler=on_message) as session:
                assert {"a_echo", "b_echo"} <= await _names(session)
                stop = anyio.Event()

                async def steady(tool: str) -> None:
                    while not stop.is_set():
                        try:
                            result = await session.call_tool(tool, {"text": "x"})
                        except Exception as exc:  # any failure is what this test is about
                            failures.append(f"{tool}: {exc!r}")
                            return
                        calls.append((tool, result.is_error))
                        if result.is_error:
                            failures.append(f"{tool}: {result.content}")
                        await anyio.sleep(0.01)  # a steady rate, not synchronisation

                async def edit(text: str, done: Any) -> None:
                    nonlocal changes
                    changes = anyio.Event()
                    path.write_text(text)
                    with anyio.fail_after(30):
                        while not done(await _names(session)):
                            await changes.wait()
                            changes = anyio.Event()

                async with anyio.create_task_group() as tg:
                    tg.start_soon(steady, "a_echo")
                    # add c
                    added = base + _stdio("c")
                    await edit(added, lambda names: "c_echo" in names)
                    tg.start_soon(steady, "c_echo")
                    # change a (new args): the old session serves until the new one is ready
                    changed = added.replace('"--prefix", "a_"', '"--prefix", "a_", "--tools", "1"')
                    await edit(changed, lambda names: "a_t0" in names)
                    # remove b
                    removed = changed.replace(_http("b", b.url()), "")
                    await edit(removed, lambda names: not any(n.startswith("b_") for n in names))
                    # break the file: refused, with its location, while the configuration in effect keeps serving
                    path.write_text(removed + "  d:\n    transport: stdio\n    command: x\n    colour: red\n")

                    async def refused() -> bool:
                        return bool((await _status(gateway))["config"]["reload_error"])

                    await eventually(refused, within=20)
                    error = (await _status(gateway))["config"]["reload_error"]
                    line = len((removed + "  d:\n    transport: stdio\n    command: x\n").splitlines()) + 1
                    assert f"{path}:{line}: servers.d.colour: unknown key" in error
                    n = len(calls)
                    await eventually(lambda: len(calls) > n + 20, within=20)  # still serving
                    stop.set()
                assert await _names(session) >= {"a_echo", "a_t0", "c_echo"}
            assert failures == [], failures[:5]
            assert len(calls) > 100
            statuses = {entry["name"]: entry["state"] for entry in (await _status(gateway))["backends"]}
            assert statuses == {"a": "ready", "c": "ready"}


async def test_a_circuit_breaker_opens_on_repeated_failures_and_closes_after_a_good_trial(tmp_path: Path) -> None:
    config = (
        "gateway:\n  circuit_breaker: {failure_threshold: 2, cooldown_s: 1}\nservers:\n"
        + _stdio("a")
        + "    timeout_s: 0.5\n"
    )
    with run_gateway(config, tmp_path, tokens=TOKEN) as gateway:
        async with mcp_session(gateway.url(), token=TOKEN) as session:
            for _ in range(2):
                slow = await session.call_tool("a_sleep", {"seconds": 5})
                assert slow.is_error and "timed out" in slow.content[0].text
            skipped = await session.call_tool("a_echo", {"text": "x"})
            assert skipped.is_error and "circuit_open" in skipped.content[0].text
            entry = next(b for b in (await _status(gateway))["backends"] if b["name"] == "a")
            assert entry["state"] == "degraded" and "circuit open after 2 consecutive failures" in entry["reason"]

            async def trial_succeeds() -> bool:
                result = await session.call_tool("a_echo", {"text": "back"})
                return not result.is_error

            await eventually(trial_succeeds, within=10)
            entry = next(b for b in (await _status(gateway))["backends"] if b["name"] == "a")
            assert entry["state"] == "ready"


DS_TOKEN = "ds-7f3a9c2e-4b1d-SECRET"


async def test_an_empty_truncated_or_broken_save_is_refused_and_the_configuration_in_effect_keeps_serving(
    tmp_path: Path,
) -> None:
    base = "gateway:\n  drain_s: 5\nservers:\n" + _stdio("a")
    with run_gateway(base, tmp_path, tokens=TOKEN, env={"DS_TOKEN": DS_TOKEN}) as gateway:
        path = tmp_path / "federation.yaml"
        failures: list[str] = []
        calls = 0
        async with mcp_session(gateway.url(), token=TOKEN) as session:
            stop = anyio.Event()

            async def steady() -> None:
                nonlocal calls
                while not stop.is_set():
                    try:
                        result = await session.call_tool("a_echo", {"text": "x"})
                    except Exception as exc:  # any failure is what this test is about
                        failures.append(repr(exc))
                        return
                    calls += 1
                    if result.is_error:
                        failures.append(str(result.content))
                    await anyio.sleep(0.01)  # a steady rate, not synchronisation

            async def refused_with(text: str, reason: str) -> str:
                path.write_text(text)

                async def shown() -> bool:
                    return reason in ((await _status(gateway))["config"]["reload_error"] or "")

                await eventually(shown, within=20)
                n = calls
                await eventually(lambda: calls > n + 5, within=20)  # still serving
                error: str = (await _status(gateway))["config"]["reload_error"]
                return error

            async with anyio.create_task_group() as tg:
                tg.start_soon(steady)
                empty = await refused_with("", "the file is empty")
                assert empty == (
                    f"{path}: the file is empty: applying it would remove the only backend, so it is taken for an "
                    "unfinished or truncated save and refused; to serve without backends, set "
                    "`gateway.allow_no_backends: true`"
                )
                truncated = await refused_with(base[: base.index("servers:")], "declares no backends")
                assert truncated.startswith(f"{path}: the file declares no backends (servers, adapters, wiki): ")
                blank = await refused_with("# saving...\n\n", "the file is empty")  # after another reason
                assert blank == empty
                broken = await refused_with(base[: base.index("command")] + "    command: [\n", "YAML syntax error")
                assert broken.startswith(f"{path}:")
                secret = await refused_with(base + "    timeout_s: ${DS_TOKEN}\n", "servers.a.timeout_s")
                assert "(got '${DS_TOKEN}')" in secret
                assert DS_TOKEN not in secret
                stop.set()
            assert failures == [], failures[:5]
            assert {entry["name"] for entry in (await _status(gateway))["backends"]} == {"a"}

            # A valid save applies (and clears the error); an explicit empty one too.
            path.write_text(base + _stdio("c"))

            async def applied() -> bool:
                return "c_echo" in await _names(session)

            await eventually(applied, within=30)

            async def cleared() -> bool:
                return (await _status(gateway))["config"]["reload_error"] is None

            await eventually(cleared, within=30)
            assert (await session.call_tool("c_echo", {"text": "new"})).content[0].text == "new"
            path.write_text("gateway:\n  allow_no_backends: true\n")

            async def emptied() -> bool:
                return (await _status(gateway))["backends"] == [] and not await _names(session)

            await eventually(emptied, within=30)
            assert (await _status(gateway))["config"]["reload_error"] is None
        log = gateway.output()
        assert DS_TOKEN not in log
        refusals = [json.loads(line) for line in log.splitlines() if '"reload.refused"' in line]
        errors = [entry["error"] for entry in refusals]
        distinct = [error for i, error in enumerate(errors) if i == 0 or error != errors[i - 1]]  # a save seen twice
        assert distinct[:3] == [empty, truncated, blank]
        assert all(entry["message"] == "keeping the configuration in effect" for entry in refusals)
