"""The context gate and measured costs: unit tests of the policy, then the real gateway over a generated wiki."""

from __future__ import annotations

import json
import re
from pathlib import Path

import mcp_types as types
import pytest

from gateway.calls import Declared
from gateway.config import Clients
from gateway.core.costs import Cost, costs_from, fill_placeholders
from gateway.core.gate import ClientPolicy
from gateway.ledger.engines import open_reader
from gateway.ledger.readers import Filters, ToolStats
from gateway.testing import in_process_gateway
from tests.fixtures.gateway_proc import GatewayProcesses, mcp_session
from tests.fixtures.procs import RunningServer
from tests.fixtures.waiting import eventually

POLICY = ClientPolicy(Clients(known={"claude-code": 200_000, "cursor*": 128_000, "tiny@0.*": 200_000}))


@pytest.mark.parametrize(
    ("name", "version", "headers", "expected"),
    [
        (None, None, None, Declared(None, "unknown")),
        ("some-client", "1.0", None, Declared(None, "unknown")),
        ("claude-code", "2.1.0", None, Declared(200_000, "clientInfo")),
        ("Claude-Code", "2.1.0", None, Declared(200_000, "clientInfo")),
        ("cursor-vscode", "1.0", None, Declared(128_000, "clientInfo")),
        ("tiny", "0.3", None, Declared(200_000, "clientInfo")),
        ("tiny", "1.0", None, Declared(None, "unknown")),
        ("cursor-vscode", "1.0", {"x-context-window": "1000000"}, Declared(1_000_000, "header")),
        ("claude-code", "2.1.0", {"x-context-window": "32,000"}, Declared(32_000, "header")),
        ("claude-code", "2.1.0", {"x-context-window": "lots"}, Declared(200_000, "clientInfo")),
    ],
)
def test_a_client_declares_its_context_by_header_first_then_client_info(
    name: str | None, version: str | None, headers: dict[str, str] | None, expected: Declared
) -> None:
    assert POLICY.declared(name, version, headers) == expected


def test_an_unknown_client_counts_as_small_and_the_refusal_points_to_the_cheap_loop() -> None:
    unknown = POLICY.declared(None, None)
    assert not POLICY.is_large(unknown)
    assert POLICY.is_large(Declared(150_000, "header"))
    assert not POLICY.is_large(Declared(149_999, "header"))
    text = POLICY.refusal("wiki_read_all", unknown)
    assert "150,000 tokens" in text and "files_search" in text and "files_neighbors" in text
    assert text.index("files_search") < text.index("files_neighbors")


def test_placeholders_are_filled_with_measured_figures_rounded_to_two_digits() -> None:
    stats = [ToolStats("files_search", 12, {"ok": 12}, 0.0, 0.0, 41.7, 90.0, 120.0, p50_result_bytes=5_321)]
    costs = costs_from(stats, {"wiki_index": 1_449, "files_search": 10})
    text = fill_placeholders("index: {cost:wiki_index}; search: {cost:files_search}; x: {cost:nothing}", costs)
    assert text == (
        "index: ~1,400 tokens, estimated from the corpus; "
        "search: ~1,300 tokens, p50 42 ms, median of 12 calls; x: cost not measured yet"
    )
    assert Cost(p50_ms=2_340).text() == "p50 2.3 s"
    assert fill_placeholders("no placeholder", costs) == "no placeholder"


# ------------------------------------------------------------------------------------------------ real gateway

TOKEN = "gate-token"


@pytest.fixture(scope="module")
def wiki_gateway(
    tmp_path_factory: pytest.TempPathFactory, gateway_process: GatewayProcesses
) -> tuple[RunningServer, Path]:
    root = tmp_path_factory.mktemp("gate")
    docs = root / "docs"
    docs.mkdir()
    for i in range(20):
        (docs / f"page{i}.md").write_text(f"# Page {i}\nAbout topic {i}. See [[Page {(i + 1) % 20}]].\n" * 5)
    config = f"""
gateway:
  audit: {{path: {root}/audit.db}}
  costs_refresh_s: 0.3
  router_note: "index costs {{cost:wiki_index}}; read-all costs {{cost:wiki_read_all}}"
wiki:
  root: {docs}
  router: [wiki_index]
clients:
  known: {{claude-code: 200000}}
"""
    return gateway_process(config, tokens=TOKEN, folder=root), root


@pytest.mark.anyio
async def test_small_and_unknown_clients_do_not_see_or_call_wiki_read_all(
    wiki_gateway: tuple[RunningServer, Path],
) -> None:
    gateway, root = wiki_gateway
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        refused = await session.call_tool("wiki_read_all", {})
    assert "wiki_read_all" not in names and "wiki_index" in names
    assert refused.is_error
    assert "files_search" in refused.content[0].text and "no context size declared" in refused.content[0].text
    rows = [r for r in open_reader(root / "audit.db").query(Filters(tool="wiki_read_all")) if r.status == "refused"]
    assert rows and rows[-1].chain == ()


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("headers", "client"),
    [({"X-Context-Window": "200000"}, "some-client"), ({}, "claude-code")],
)
async def test_a_large_client_sees_and_calls_wiki_read_all(
    wiki_gateway: tuple[RunningServer, Path], headers: dict[str, str], client: str
) -> None:
    gateway, _ = wiki_gateway
    info = types.Implementation(name=client, version="2.0")
    async with mcp_session(gateway.url(), token=TOKEN, headers=headers, client_info=info) as session:
        names = {t.name for t in (await session.list_tools()).tools}
        result = await session.call_tool("wiki_read_all", {})
    assert "wiki_read_all" in names
    assert not result.is_error and "page7.md" in result.content[0].text


@pytest.mark.anyio
async def test_the_router_note_carries_costs_measured_on_the_live_wiki(
    wiki_gateway: tuple[RunningServer, Path],
) -> None:
    gateway, _ = wiki_gateway
    async with mcp_session(gateway.url(), token=TOKEN) as session:
        for _ in range(3):
            await session.call_tool("wiki_index", {})

        async def measured() -> bool:
            tools = {t.name: t for t in (await session.list_tools()).tools}
            return re.search(r"index costs [^;]*median of", tools["wiki_index"].description or "") is not None

        await eventually(measured, within=15)
        description = {t.name: t for t in (await session.list_tools()).tools}["wiki_index"].description or ""
    figure = re.search(r"index costs ~([\d,]+) tokens, p50 (\d+) ms, median of (\d+) calls", description)
    assert figure is not None, description
    assert int(figure.group(1).replace(",", "")) > 50  # 20 pages listed: a real size, not a claim
    assert int(figure.group(3)) >= 1  # read from the ledger (a refresh may land after the first call)
    assert re.search(r"read-all costs ~[\d,]+ tokens", description) is not None


@pytest.mark.anyio
async def test_a_refresh_of_the_cost_figures_is_logged_at_debug_saying_so(
    wiki_gateway: tuple[RunningServer, Path],
) -> None:
    gateway, _ = wiki_gateway

    def changes() -> list[dict[str, object]]:
        lines = [json.loads(line) for line in gateway.output().splitlines() if line.startswith("{")]
        return [line for line in lines if line.get("event") == "catalog.changed"]

    await eventually(lambda: any(c["cause"] == "costs" for c in changes()), within=15)
    assert {(c["cause"], c["level"]) for c in changes()} <= {("backends", "info"), ("costs", "debug")}
    assert all(c["changed"] for c in changes())  # each line says what changed: tools, lists


def test_any_tool_can_declare_the_window_it_needs_and_the_refusal_names_that_window() -> None:
    policy = ClientPolicy(Clients(min_context={"graph_query": 32_000, "wiki_read_all": 1_000_000}))
    small, mid, large = Declared(8_000, "header"), Declared(64_000, "header"), Declared(200_000, "header")
    assert not policy.allowed("graph_query", small) and policy.allowed("graph_query", mid)
    assert not policy.allowed("wiki_read_all", large)  # min_context wins over large_context_tools
    assert policy.allowed("files_read", Declared(None, "unknown"))
    assert policy.hidden(mid) == {"wiki_read_all"} and policy.hidden(small) == {"graph_query", "wiki_read_all"}
    assert "32,000 tokens" in policy.refusal("graph_query", small)
    note = "Router:\n  - graphs? -> graph_query\n  - read? -> files_read"
    listing = {
        "tools": [
            {"name": "graph_query", "description": f"Graphs.\n\n{note}"},
            {"name": "files_read", "description": f"Read.\n\n{note}"},
        ]
    }
    shown = policy.listing(listing, note, small)
    assert [t["name"] for t in shown["tools"]] == ["files_read"]
    assert "graph_query" not in shown["tools"][0]["description"]  # the note's item naming it is gone too
    assert policy.listing(listing, note, small) is shown  # cached per listing
    assert policy.listing(listing, note, mid) == listing  # nothing of this list is hidden from this client


@pytest.mark.anyio
@pytest.mark.parametrize("mode", ["legacy", "2026-07-28"])
async def test_a_tool_that_needs_a_window_is_neither_listed_nor_callable_below_it(tmp_path: Path, mode: str) -> None:
    (tmp_path / "a.md").write_text("# A\n\nA page.\n", encoding="utf-8")
    config = f"""
version: 1
gateway: {{audit: {{enabled: false}}}}
wiki: {{root: {tmp_path}}}
clients:
  known: {{mid-agent: 64000, tiny-agent: 8000}}
  min_context: {{files_neighbors: 32000}}
"""
    for name, sees in (("mid-agent", True), ("tiny-agent", False)):
        info = types.Implementation(name=name, version="1")
        async with in_process_gateway(config, mode=mode, client_info=info) as (client, _):
            listed = [t.name for t in (await client.list_tools()).tools]
            assert ("files_neighbors" in listed) is sees and "files_read" in listed
            result = await client.call_tool("files_neighbors", {"path": "a.md"})
            assert result.is_error is not sees
            if not sees:
                assert "at least 32,000 tokens" in result.content[0].text  # type: ignore[union-attr]
