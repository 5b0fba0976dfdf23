"""Search exposure's decisions in memory (gateway/disclosure.py): who is in search mode, what its list holds, how
the call tool unwraps, what a search answers, and how cost bands read. Over real processes: tests/test_disclosure.py."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest

from gateway.backends.base import Backend, BackendState
from gateway.calls import ANONYMOUS
from gateway.config import Federation, parse_config
from gateway.core.catalog import Catalog
from gateway.core.costs import Cost
from gateway.errors import InvalidArguments
from gateway.front import exposure as exposure_module
from gateway.front.exposure import Disclosure, cost_band
from gateway.search.ranking import Embedder, load_embedder
from gateway.testing import FakeBackend, make_tool

pytestmark = pytest.mark.anyio


def _federation(exposure: str, router_note: str = "") -> Federation:
    text = "servers:\n"
    for name in ("mail", "maps"):
        text += f"  {name}:\n    transport: stdio\n    command: x\n"
    if router_note:
        text += f"gateway:\n  router_note: {json.dumps(router_note)}\n"
    return parse_config(text + exposure, file="federation.yaml", env={})


MAIL = FakeBackend("mail", [make_tool("send_email", "Send an email to someone."), make_tool("wiki_read_all", "All.")])
MAPS = FakeBackend("maps", [make_tool("maps_directions", "Directions between two places.")])


def _disclosure(fed: Federation, *backends: FakeBackend) -> tuple[Disclosure, Catalog]:
    table: dict[str, Backend] = {b.name: b for b in (backends or (MAIL, MAPS))}
    catalog = Catalog.build(fed, table)
    return Disclosure(lambda: fed, lambda: catalog, lambda: table, load_embedder), catalog


def test_the_mode_follows_the_client_patterns_then_the_default() -> None:
    disclosure, _ = _disclosure(_federation("exposure:\n  mode: all\n  clients: {'claude*': search}\n"))
    assert disclosure.searching("claude-code", "1.0", large=True)
    assert not disclosure.searching("cursor", "1.0", large=True)
    assert not disclosure.searching(None, None, large=False)


def test_auto_searches_for_a_small_client_or_a_catalog_over_its_limits() -> None:
    disclosure, _ = _disclosure(_federation("exposure:\n  mode: auto\n"))
    assert disclosure.searching("x", "1", large=False)  # below the context gate
    assert not disclosure.searching("x", "1", large=True)  # 3 tools, a few hundred bytes
    many, _ = _disclosure(_federation("exposure:\n  mode: auto\n  auto_tools: 2\n"))
    assert many.searching("x", "1", large=True)
    heavy, _ = _disclosure(_federation("exposure:\n  mode: auto\n  auto_tokens: 10\n"))
    assert heavy.searching("x", "1", large=True)


def test_the_search_list_holds_the_two_tools_then_the_pins_and_the_router_note_rides_on_the_search_tool() -> None:
    fed = _federation("exposure:\n  mode: search\n  pinned: [maps_directions, nowhere]\n", "Router: mail -> send_email")
    disclosure, catalog = _disclosure(fed)
    tools = disclosure.listing(catalog, large=True)["tools"]
    assert [t["name"] for t in tools] == ["find_tools", "call_tool", "maps_directions"]  # an unknown pin is skipped
    assert tools[0]["description"].endswith("Router: mail -> send_email")
    assert disclosure.listing(catalog, large=True) is disclosure.listing(catalog, large=True)  # built once
    assert disclosure.input_schema("call_tool") == tools[1]["inputSchema"]
    assert disclosure.input_schema("send_email") is None


def test_a_pin_change_is_a_change_of_the_search_list_and_a_backend_change_is_not() -> None:
    fed = _federation("exposure:\n  mode: search\n  pinned: [maps_directions]\n")
    disclosure, catalog = _disclosure(fed)
    _, fewer = _disclosure(fed, MAIL)  # the maps backend left: the pinned tool is gone
    assert disclosure.tools_changed(catalog, fewer)
    same_pins = Catalog.build(fed, {"mail": MAIL, "maps": MAPS, "extra": FakeBackend("extra", ["more"])})
    assert not disclosure.tools_changed(catalog, same_pins)
    other = Catalog.build(
        _federation("exposure:\n  mode: search\n  pinned: [send_email]\n"), {"mail": MAIL, "maps": MAPS}
    )
    assert disclosure.tools_changed(catalog, other)
    never_searched = object()  # a connection never seen in search mode
    assert disclosure.tools_changed_for(never_searched, ANONYMOUS, catalog, other) is None


def test_the_call_tool_unwraps_into_the_real_call_and_refuses_bad_arguments() -> None:
    disclosure, _ = _disclosure(_federation("exposure:\n  mode: search\n"))
    assert disclosure.unwrap({"name": "send_email", "arguments": {"to": "a"}}) == ("send_email", {"to": "a"})
    assert disclosure.unwrap({"name": "send_email"}) == ("send_email", None)
    for bad, argument in (({}, "name"), ({"name": 3}, "name"), ({"name": "call_tool"}, "name"),
                          ({"name": "x", "arguments": [1]}, "arguments")):  # fmt: skip
        with pytest.raises(InvalidArguments) as info:
            disclosure.unwrap(bad)
        assert info.value.argument == argument


async def test_a_search_answers_ready_tools_with_health_and_cost_and_skips_down_backends_unless_asked() -> None:
    down = FakeBackend("maps", [make_tool("maps_directions", "Directions between two places.")], list_when_down=True)
    fed = _federation("exposure:\n  mode: search\n")
    disclosure, catalog = _disclosure(fed, MAIL, down)
    down.set_state(BackendState.FAILED, "connection refused")
    answer = (await disclosure.search({"query": "driving directions"}, None)).structured_content
    assert answer is not None and "maps_directions" not in [t["name"] for t in answer["tools"]]
    shown = await disclosure.search({"query": "driving directions", "include_unavailable": True}, None)
    first: dict[str, Any] = shown.structured_content["tools"][0]  # type: ignore[index]
    assert (first["name"], first["backend"], first["health"]) == (
        "maps_directions",
        "maps",
        "failed: connection refused",
    )
    assert first["cost"] == "not measured yet"
    hidden = (await disclosure.search({"query": "read everything"}, {"send_email"})).structured_content  # the seam
    assert hidden is not None
    assert [t["name"] for t in hidden["tools"] + hidden.get("closest", [])] == ["send_email"]
    for bad in (
        {"query": ""},
        {"query": "x", "limit": 0},
        {"query": "x", "backend": 1},
        {"query": "x", "read_only": "y"},
    ):
        with pytest.raises(InvalidArguments):
            await disclosure.search(bad, None)


async def test_a_search_scores_each_hit_and_says_plainly_when_no_tool_fits() -> None:
    fed = _federation("exposure:\n  mode: search\n")
    disclosure, _ = _disclosure(fed)
    fits = (await disclosure.search({"query": "get driving directions from Lyon to Geneva"}, None)).structured_content
    assert fits is not None and fits["fits"] is True
    first = fits["tools"][0]
    assert first["name"] == "maps_directions" and 0.0 < first["score"] <= 1.0
    assert [t["score"] for t in fits["tools"]] == sorted((t["score"] for t in fits["tools"]), reverse=True)
    none = await disclosure.search({"query": "order a large pepperoni pizza to my office"}, None)
    answer = none.structured_content
    assert answer is not None and answer["tools"] == [] and answer["fits"] is False
    assert answer["note"].startswith("No tool fits this request")
    assert {t["name"] for t in answer["closest"]} <= {"send_email", "wiki_read_all", "maps_directions"}
    assert all(0.0 <= t["score"] < 0.5 and "inputSchema" not in t for t in answer["closest"])
    assert json.loads(none.content[0].text) == answer  # type: ignore[union-attr]


def test_a_cost_band_names_the_band_and_the_figures() -> None:
    assert cost_band(None) == "not measured yet"
    assert cost_band(Cost(200, 10.0, "measured")) == "small (~200 tokens, ~10 ms)"
    assert cost_band(Cost(5_000)).startswith("medium (")
    assert cost_band(Cost(50_000)).startswith("large (")


async def test_a_search_during_a_long_index_build_ranks_by_keywords_and_says_so(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    release = threading.Event()

    def slow_model() -> Embedder:
        assert release.wait(10), "the test never released the model"
        return load_embedder()

    monkeypatch.setattr(exposure_module, "INDEX_WAIT_S", 0.05)
    fed = _federation("exposure:\n  mode: search\n")
    table: dict[str, Backend] = {b.name: b for b in (MAIL, MAPS)}
    catalog = Catalog.build(fed, table)
    disclosure = Disclosure(lambda: fed, lambda: catalog, lambda: table, slow_model)
    early = (await disclosure.search({"query": "driving directions"}, None)).structured_content
    assert early is not None and early["ranking"].endswith("the semantic index of 3 tools is being built")
    assert early["tools"][0]["name"] == "maps_directions"
    release.set()
    monkeypatch.setattr(exposure_module, "INDEX_WAIT_S", 10.0)
    later = (await disclosure.search({"query": "driving directions"}, None)).structured_content
    assert later is not None and "ranking" not in later and later["tools"][0]["name"] == "maps_directions"
