"""The context gate and measured costs: unit tests of the policy, then the real gateway over a generated wiki."""

from __future__ import annotations

import json
import re
from pathlib import Path

import anyio
import mcp_types as types
import pytest

from gateway.calls import Declared
from gateway.config import Clients
from gateway.core.costs import MIN_CALLS, Cost, band, costs_from, fill_placeholders
from gateway.core.gate import ClientPolicy
from gateway.ledger.engines import open_reader
from gateway.ledger.readers import Filters, ToolStats
from gateway.testing import in_process_gateway
from tests.fixtures.gateway_proc import PYTHON, GatewayProcesses, echo_argv, mcp_session, run_gateway
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
    assert "`X-Context-Window: 150000`" in text  # a header a person can copy into the Inspector's --header


def test_placeholders_are_filled_with_bands_of_measured_figures_or_of_the_estimate_until_enough_calls() -> None:
    stats = [
        ToolStats("files_search", 12, {"ok": 12}, 0.0, 0.0, 41.7, 90.0, 120.0, p50_result_bytes=5_321),
        ToolStats("files_read", 4, {"ok": 4}, 0.0, 0.0, 3.0, 4.0, 5.0, p50_result_bytes=800),
    ]
    costs = costs_from(stats, {"wiki_index": 1_449, "files_search": 10})
    text = fill_placeholders(
        "index: {cost:wiki_index}; search: {cost:files_search}; read: {cost:files_read}; x: {cost:nothing}", costs
    )
    assert text == (
        "index: ~2,000 tokens; search: ~1,000 tokens, ~50 ms; read: cost not measured yet; x: cost not measured yet"
    )  # files_read has answered fewer than MIN_CALLS calls: no figure yet
    assert Cost(p50_ms=2_000).text() == "~2 s"
    assert fill_placeholders("no placeholder", costs) == "no placeholder"


@pytest.mark.parametrize(
    ("median", "held", "published"),
    [
        (355.0, 200.0, 200.0),  # within a factor of 1.8 of the band: it holds, though 500 is nearer
        (361.0, 200.0, 500.0),
        (112.0, 200.0, 200.0),
        (110.0, 200.0, 100.0),
        (140.0, None, 100.0),  # nothing held: the nearest band
        (150.0, None, 200.0),
        (0.2, None, 1.0),
    ],
)
def test_a_published_band_holds_until_the_median_leaves_it_by_more_than_the_hold_factor(
    median: float, held: float | None, published: float
) -> None:
    assert band(median, held) == published


def test_a_median_wavering_around_a_boundary_never_changes_what_is_published() -> None:
    published: dict[str, Cost] = {}
    texts = set()
    for i in range(200):  # latency and size waver by 10% around 316 ms and 1,580 tokens: midpoints of two bands
        factor = 1.1 if i % 2 else 0.9
        stats = [ToolStats("t", 10 + i, {"ok": 10 + i}, 0.0, 0.0, 316 * factor, 0, 0, p50_result_bytes=6_320 * factor)]
        published = costs_from(stats, {}, published)
        texts.add(published["t"].text())
    assert len(texts) == 1, texts


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
        for _ in range(MIN_CALLS):
            await session.call_tool("wiki_index", {})

        async def measured() -> bool:  # the latency is the ledger's: only measured figures have one
            tools = {t.name: t for t in (await session.list_tools()).tools}
            return re.search(r"index costs ~[\d,]+ tokens, ~", tools["wiki_index"].description or "") is not None

        await eventually(measured, within=15)
        description = {t.name: t for t in (await session.list_tools()).tools}["wiki_index"].description or ""
    figure = re.search(r"index costs ~([\d,]+) tokens, ~(\d+) (ms|s);", description)
    assert figure is not None, description
    assert int(figure.group(1).replace(",", "")) >= 100  # 20 pages listed: a real size, not a claim
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


@pytest.mark.anyio
@pytest.mark.spawns
async def test_a_tools_list_stays_byte_identical_call_after_call_while_a_tools_cost_stays_in_its_band(
    tmp_path: Path,
) -> None:
    """Tool descriptions head every agent's prompt cache: a list that changed at every cost refresh was a cache miss
    and a list_changed for every client. 12 calls of a tool that takes 0.2 s, the costs refreshed every 0.1 s: the
    list changes once, when the measured band replaces "not measured yet", and never again."""
    config = f"""
gateway:
  audit: {{path: {tmp_path / "audit.db"}}}
  costs_refresh_s: 0.1
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv("--stdio")[1:])}
    tools:
      include: [slow]
      describe: {{slow: "Reports progress while it works. Costs {{cost:slow}}."}}
"""
    announced: list[str] = []

    async def on_message(message: object) -> None:
        if isinstance(message, types.ToolListChangedNotification):
            announced.append(message.method)

    lists: list[str] = []
    with run_gateway(config, tmp_path) as gateway:
        async with mcp_session(gateway.url(), message_handler=on_message) as session:
            with anyio.fail_after(60):
                lists.append(json.dumps((await session.list_tools()).model_dump(mode="json")))
                for _ in range(12):
                    await session.call_tool("slow", {"seconds": 0.2, "steps": 1})
                    lists.append(json.dumps((await session.list_tools()).model_dump(mode="json")))

                async def measured() -> bool:
                    return "not measured" not in ((await session.list_tools()).tools[0].description or "")

                await eventually(measured, within=15)
                lists.append(json.dumps((await session.list_tools()).model_dump(mode="json")))
    assert "cost not measured yet" in lists[0]
    assert len(set(lists)) == 2, [json.loads(text)["tools"][0]["description"] for text in dict.fromkeys(lists)]
    assert len(announced) <= 1
    assert re.search(r"Costs ~\d+ tokens, ~\d+ ms\.", lists[-1]) is not None, lists[-1]


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
