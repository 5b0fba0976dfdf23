"""The edge of ``/mcp`` (gateway/edge.py, gateway/inputs.py): what one caller sends cannot reach a downstream that
every caller shares, in either protocol era.

Real processes: the gateway (``python -m gateway serve``) in front of tests/fixtures/echo_server.py over stdio, one
session shared by every caller; raw HTTP posts in the session era (2025-11-25, ``initialize`` and
``Mcp-Session-Id``) and the stateless era (2026-07-28, ``_meta`` per request). Each refusal is checked for its answer,
its ledger row, and a bystander call answered by the same downstream process (same pid) afterwards.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from tests.fixtures.gateway_proc import GatewayProcesses, echo_argv
from tests.fixtures.procs import RunningServer

pytestmark = pytest.mark.anyio

WAIT = 15  # seconds: the bound on every exchange with the gateway process
ACCEPT = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
MODERN = "2026-07-28"
REPLAY_BYTES = 8 * 1024 * 1024  # the event store's budget for this gateway (the default is 32 MiB)
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("edge")


def echo_config(settings: dict[str, Any]) -> str:
    """A gateway in front of tests/fixtures/echo_server.py over stdio (server ``e``), with ``settings`` as its
    config's ``gateway`` section."""
    argv = echo_argv("--stdio")
    return f"""
gateway: {json.dumps(settings)}
servers:
  e:
    transport: stdio
    command: {argv[0]}
    args: {json.dumps(argv[1:])}
"""


@pytest.fixture(scope="module")
def gateway(folder: Path, gateway_process: GatewayProcesses) -> RunningServer:
    settings = {"audit": {"path": str(folder / "audit.db")}, "edge": {"replay_bytes": REPLAY_BYTES}}
    return gateway_process(echo_config(settings), folder=folder)


def rows(folder: Path) -> list[tuple[str, str, list[dict[str, Any]]]]:
    with sqlite3.connect(folder / "audit.db") as db:
        found = db.execute("SELECT tool, status, chain FROM calls ORDER BY id").fetchall()
    return [(tool, status, json.loads(chain)) for tool, status, chain in found]


class Raw:
    """Raw JSON-RPC posts in one era; ``post`` returns (HTTP status, the JSON-RPC answer or None for a 202)."""

    def __init__(self, http: httpx2.AsyncClient, url: str, era: str) -> None:
        self.http, self.url, self.era = http, url, era
        self.headers = dict(ACCEPT)
        self.next_id = 100

    async def open(self) -> None:
        if self.era == MODERN:
            self.headers["mcp-protocol-version"] = MODERN
            return
        init = {"protocolVersion": self.era, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        opened = await self.http.post(
            self.url, headers=self.headers, json={"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
        )
        self.headers.update({"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": self.era})
        await self.http.post(
            self.url, headers=self.headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
        )

    def call(self, name: str, arguments: Any, request_id: Any = ...) -> dict[str, Any]:
        if request_id is ...:
            self.next_id += 1
            request_id = self.next_id
        params: dict[str, Any] = {"name": name, "arguments": arguments}
        if self.era == MODERN:
            params["_meta"] = MODERN_META
        return {"jsonrpc": "2.0", "id": request_id, "method": "tools/call", "params": params}

    async def post(self, body: str) -> tuple[int, dict[str, Any] | None]:
        headers = dict(self.headers)
        if self.era == MODERN:
            name = json.loads(body)["params"]["name"].encode("utf-8", "backslashreplace").decode()
            headers.update({"mcp-method": "tools/call", "mcp-name": name})
        with anyio.fail_after(WAIT):
            response = await self.http.post(self.url, headers=headers, content=body)
        if response.status_code == 202:
            return 202, None
        if response.headers["content-type"].startswith("text/event-stream"):
            data = [line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
            return response.status_code, json.loads(data[-1])
        return response.status_code, response.json()

    async def pid(self) -> int:
        status, answer = await self.post(json.dumps(self.call("pid", {})))
        assert status == 200 and answer is not None, answer
        return int(answer["result"]["content"][0]["text"])


@pytest.fixture(params=["2025-11-25", MODERN])
async def raw(request: pytest.FixtureRequest, gateway: RunningServer) -> AsyncIterator[Raw]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(WAIT)) as http:
        client = Raw(http, gateway.url(), request.param)
        with anyio.fail_after(WAIT):
            await client.open()
        yield client


def deep(levels: int) -> dict[str, Any]:
    value: dict[str, Any] = {}
    for _ in range(levels):
        value = {"a": value}
    return value


@pytest.mark.parametrize(
    ("arguments_json", "argument", "reason"),
    [
        ('{"text": "\\ud800"}', "'text'", "it holds a lone surrogate (U+D800 at character 0)"),
        ('{"text": "ok \\udfff"}', "'text'", "it holds a lone surrogate (U+DFFF at character 3)"),
        (json.dumps({"text": "x", "nested": deep(900)}), "'nested'", "the value is nested more than 64 levels deep"),
        ('{"text": "x", "n": [1, NaN]}', "'n'", "at 'n.1', it is nan, which JSON cannot carry"),
        ('{"text": "x", "n": -Infinity}', "'n'", "it is -inf, which JSON cannot carry"),
    ],
    ids=["surrogate", "surrogate-later", "900-deep", "nan", "infinity"],
)
async def test_an_unsendable_argument_is_refused_as_invalid_params_naming_it_with_a_row_and_the_shared_downstream_lives(
    raw: Raw, folder: Path, arguments_json: str, argument: str, reason: str
) -> None:
    before = await raw.pid()
    body = json.dumps(raw.call("echo", {"text": "PLACEHOLDER"})).replace('{"text": "PLACEHOLDER"}', arguments_json)
    rows_before = len(rows(folder))

    status, answer = await raw.post(body)

    assert status == (400 if raw.era == MODERN else 200)  # each era's own shape for an invalid-params answer
    assert answer is not None and answer["id"] == json.loads(body)["id"]
    assert answer["error"]["code"] == -32602
    message = answer["error"]["message"]
    assert message.startswith(f"Invalid argument {argument} for tool 'echo': ") and reason in message
    new = rows(folder)[rows_before:]
    assert [(tool, status) for tool, status, _ in new] == [("echo", "invalid_params")]
    assert new[0][2][0]["outcome"] == "invalid_params" and reason in new[0][2][0]["reason"]
    assert await raw.pid() == before  # the bystander call: the same downstream process answers


@pytest.mark.parametrize("request_id", [1.5, None, {}, True], ids=["float", "null", "object", "true"])
async def test_a_tools_call_whose_id_is_not_a_string_or_integer_is_an_invalid_request(
    raw: Raw, folder: Path, request_id: Any
) -> None:
    rows_before = len(rows(folder))
    status, answer = await raw.post(json.dumps(raw.call("echo", {"text": "dropped?"}, request_id=request_id)))
    assert status == 400
    assert answer is not None and answer["id"] is None
    assert answer["error"]["code"] == -32600
    assert answer["error"]["message"].startswith("Invalid Request: a request's id must be a string or an integer")
    assert len(rows(folder)) == rows_before  # never reached the router: nothing was called


async def test_a_lone_surrogate_outside_the_arguments_is_refused_naming_where(raw: Raw, folder: Path) -> None:
    before = await raw.pid()
    body = json.dumps(raw.call("echo", {"text": "x"}))
    body = body.replace(
        '"method": "tools/call", "params": {', '"method": "tools/call", "params": {"extra": "\\ud83d", '
    )
    status, answer = await raw.post(body)
    assert status == 400 and answer is not None
    assert answer["error"]["code"] == -32602
    assert answer["error"]["message"].startswith("Invalid params: at 'params.extra', it holds a lone surrogate")
    assert await raw.pid() == before


async def test_an_unknown_tool_leaves_a_row_of_its_own_status(raw: Raw, folder: Path) -> None:
    rows_before = len(rows(folder))
    status, answer = await raw.post(json.dumps(raw.call("no_such_tool", {})))
    assert answer is not None and answer["error"]["code"] == -32602
    assert answer["error"]["message"] == "Unknown tool: 'no_such_tool'."
    assert [(tool, status) for tool, status, _ in rows(folder)[rows_before:]] == [("no_such_tool", "unknown_tool")]


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise AssertionError(f"no VmRSS for pid {pid}")  # pragma: no cover


async def burst(raw: Raw, bodies: list[str], concurrency: int = 4) -> list[dict[str, Any]]:
    answers: list[dict[str, Any]] = []

    async def worker(mine: list[str]) -> None:
        for body in mine:
            status, answer = await raw.post(body)
            assert answer is not None, status
            answers.append(answer)

    with anyio.fail_after(120):
        async with anyio.create_task_group() as tg:
            for i in range(concurrency):
                tg.start_soon(worker, bodies[i::concurrency])
    return answers


@pytest.mark.parametrize("raw", ["2025-11-25"], indirect=True)  # the session era: its answers go to the event store
async def test_a_burst_of_huge_names_and_huge_answers_leaves_the_gateways_memory_bounded(
    raw: Raw, gateway: RunningServer
) -> None:
    huge_name = "n" * 3_900_000
    unknown = [json.dumps(raw.call(huge_name, {})) for _ in range(200)]
    echoes = [json.dumps(raw.call("echo", {"text": "e" * 1_000_000})) for _ in range(100)]
    # Warm up with the same traffic, so the allocator's growth for the burst's transient buffers (and a full store)
    # is in "before": what the bursts add after that is what the gateway keeps.
    await burst(raw, unknown[:40])
    await burst(raw, echoes[:40], concurrency=2)
    before = rss_mb(gateway.process.pid)

    named = await burst(raw, unknown)
    after_names = rss_mb(gateway.process.pid)
    echoed = await burst(raw, echoes, concurrency=2)
    after_answers = rss_mb(gateway.process.pid)
    print(
        f"RSS before {before:.0f} MB, after 200 huge names {after_names:.0f} MB, "
        f"after 100 1-MB answers {after_answers:.0f} MB"
    )

    assert {a["error"]["message"] for a in named} == {f"Unknown tool: {'n' * 120!r}… (3,900,000 characters)."}
    assert all(len(a["result"]["content"][0]["text"]) == 1_000_000 for a in echoed)
    # Before the byte budget and the cut echo, this test measured 423 MB before and +664 MB after the names (the
    # store kept every answer of the last 30 s, up to 512 of them, each echoing its 3.9 MB name); now +2 to +11 MB:
    # what is kept for resumption is bounded by gateway.edge.replay_bytes (8 MiB here).
    assert after_names - before < 30
    assert after_answers - before < 30


async def test_a_tool_name_holding_a_lone_surrogate_is_an_unknown_tool_with_its_row(raw: Raw, folder: Path) -> None:
    before = await raw.pid()
    rows_before = len(rows(folder))
    body = json.dumps(raw.call("PLACEHOLDER", {"text": "x"})).replace("PLACEHOLDER", "echo\\ud800")
    status, answer = await raw.post(body)
    assert answer is not None and answer["error"]["code"] == -32602
    assert answer["error"]["message"] == "Unknown tool: 'echo\\\\ud800'."  # escaped, never the raw surrogate
    assert [(tool, status) for tool, status, _ in rows(folder)[rows_before:]] == [("echo\\ud800", "unknown_tool")]
    assert await raw.pid() == before


@pytest.fixture(scope="module")
def small_gateway(gateway_process: GatewayProcesses) -> RunningServer:
    return gateway_process(echo_config({"audit": {"enabled": False}, "edge": {"max_body_bytes": 65536}}))


@pytest.mark.parametrize("chunked", [False, True], ids=["content-length", "chunked"])
async def test_a_body_over_the_limit_is_refused_with_413_and_one_within_it_is_served(
    small_gateway: RunningServer, chunked: bool
) -> None:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(WAIT)) as http:
        client = Raw(http, small_gateway.url(), MODERN)
        await client.open()
        fits = json.dumps(client.call("echo", {"text": "f" * 60_000}))
        status, answer = await client.post(fits)
        assert status == 200 and answer is not None and answer["result"]["content"][0]["text"] == "f" * 60_000

        body = json.dumps(client.call("echo", {"text": "x" * 100_000})).encode()

        async def pieces() -> AsyncIterator[bytes]:
            for start in range(0, len(body), 16_384):
                yield body[start : start + 16_384]

        headers = {**client.headers, "mcp-method": "tools/call", "mcp-name": "echo"}
        with anyio.fail_after(WAIT):
            response = await http.post(client.url, headers=headers, content=pieces() if chunked else body)
    assert response.status_code == 413
    message = response.json()["error"]["message"]
    if chunked:
        assert message.startswith("Request body too large: more than ")
    else:
        assert (
            message
            == f"Request body too large: {len(body):,} bytes; the limit is 65,536 (gateway.edge.max_body_bytes)."
        )
