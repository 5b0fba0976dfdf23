"""The merged catalog built from scripted backends: naming, filters, the router note, untouched schemas, routes and
argument templates."""

from __future__ import annotations

import json
import string
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import anyio
import pytest
from hypothesis import given
from hypothesis import strategies as st

from gateway.backends.base import Backend, BackendState
from gateway.config import Federation, parse_config
from gateway.core.catalog import Catalog, Provider, list_tokens
from gateway.testing import FakeBackend, make_tool

NOTE = "ROUTER NOTE: start with wiki_index."


def config(text: str) -> Federation:
    return parse_config(text, file="federation.yaml", env={})


def servers(*names: str, extra: str = "", gateway: str = "") -> str:
    body = "".join(f"  {name}:\n    transport: stdio\n    command: x\n{extra}" for name in names)
    return f"gateway:\n  router_note: {json.dumps(NOTE)}\n{gateway}servers:\n{body}"


def build(fed: Federation, *backends: FakeBackend) -> Catalog:
    table: dict[str, Backend] = {b.name: b for b in backends}
    return Catalog.build(fed, table)


def names(catalog: Catalog) -> list[str]:
    return [tool["name"] for tool in catalog.list_result["tools"]]


def listed(catalog: Catalog, name: str) -> dict[str, Any]:
    matches = [tool for tool in catalog.list_result["tools"] if tool["name"] == name]
    assert len(matches) == 1, names(catalog)
    tool: dict[str, Any] = matches[0]
    return tool


def provider_labels(catalog: Catalog, name: str) -> list[str]:
    entry = catalog.get(name)
    assert entry is not None, names(catalog)
    return [p.label for p in entry.providers]


# ----------------------------------------------------------------------------------------------- naming


def test_naming_never_publishes_bare_names_and_reports_a_collision_as_a_problem() -> None:
    fed = config(servers("a", "b", gateway="  naming: {mode: never}\n"))
    catalog = build(fed, FakeBackend("a", ["search", "only_a"]), FakeBackend("b", ["search", "only_b"]))
    assert sorted(names(catalog)) == ["only_a", "only_b"]  # neither server takes a name both publish (shadowing.py)
    assert len(catalog.problems) == 2
    assert "a/search" in catalog.problems[0] and "also published by b" in catalog.problems[0]


def test_naming_conditional_prefixes_only_the_colliding_names() -> None:
    fed = config(servers("a", "b"))
    catalog = build(fed, FakeBackend("a", ["search", "only_a"]), FakeBackend("b", ["search", "only_b"]))
    assert sorted(names(catalog)) == ["a__search", "b__search", "only_a", "only_b"]
    assert provider_labels(catalog, "a__search") == ["a/search"]
    assert provider_labels(catalog, "b__search") == ["b/search"]
    assert catalog.problems == ()


def test_naming_always_prefixes_every_tool_with_the_configured_separator() -> None:
    fed = config(servers("a", "b", gateway="  naming: {mode: always, separator: .}\n"))
    catalog = build(fed, FakeBackend("a", ["search", "only_a"]), FakeBackend("b", ["only_b"]))
    assert sorted(names(catalog)) == ["a.only_a", "a.search", "b.only_b"]
    assert provider_labels(catalog, "a.search") == ["a/search"]


def test_naming_conditional_prefixes_a_tool_that_collides_with_a_route_name() -> None:
    fed = config(servers("a", "b") + "routes:\n  search: [b/find]\n")
    catalog = build(fed, FakeBackend("a", ["search"]), FakeBackend("b", ["find"]))
    assert sorted(names(catalog)) == ["a__search", "search"]
    assert provider_labels(catalog, "search") == ["b/find"]
    assert provider_labels(catalog, "a__search") == ["a/search"]


tool_names = st.lists(st.text(string.ascii_lowercase + string.digits, min_size=1, max_size=6), max_size=5, unique=True)


@given(a=tool_names, b=tool_names, c=tool_names)
def test_under_conditional_naming_exactly_the_shared_names_are_prefixed(
    a: list[str], b: list[str], c: list[str]
) -> None:
    fed = config(servers("a", "b", "c"))
    catalog = build(fed, FakeBackend("a", a), FakeBackend("b", b), FakeBackend("c", c))
    expected: set[str] = set()
    for backend, tools in (("a", a), ("b", b), ("c", c)):
        for tool in tools:
            shared = sum(tool in other for other in (a, b, c)) > 1
            expected.add(f"{backend}__{tool}" if shared else tool)
    assert set(names(catalog)) == expected
    assert len(names(catalog)) == len(a) + len(b) + len(c)
    assert catalog.problems == ()


def test_a_name_longer_than_64_characters_after_prefixing_is_left_out_with_a_problem() -> None:
    backend = "b" * 40
    fed = config(servers(backend, gateway="  naming: {mode: always}\n"))
    catalog = build(fed, FakeBackend(backend, ["t" * 22, "short"]))  # 40 + 2 + 22 = 64: fits
    assert sorted(names(catalog)) == sorted([f"{backend}__{'t' * 22}", f"{backend}__short"])

    catalog = build(fed, FakeBackend(backend, ["t" * 23, "short"]))  # 65: does not
    assert names(catalog) == [f"{backend}__short"]
    assert len(catalog.problems) == 1
    problem = catalog.problems[0]
    assert f"{backend}/{'t' * 23}" in problem and "65" in problem and "not published" in problem


# ----------------------------------------------------------------------------------------------- filters


def test_include_publishes_only_the_listed_tools() -> None:
    fed = config(servers("mem", extra="    tools:\n      include: [search_nodes, open_nodes]\n"))
    catalog = build(fed, FakeBackend("mem", ["search_nodes", "open_nodes", "delete_entities"]))
    assert sorted(names(catalog)) == ["open_nodes", "search_nodes"]


def test_exclude_leaves_the_listed_tools_out() -> None:
    fed = config(servers("mem", extra="    tools:\n      exclude: [delete_entities]\n"))
    catalog = build(fed, FakeBackend("mem", ["search_nodes", "delete_entities"]))
    assert names(catalog) == ["search_nodes"]


def test_rename_publishes_under_the_new_name_and_calls_the_backend_by_its_own() -> None:
    fed = config(servers("mem", extra="    tools:\n      rename: {search_nodes: memory_recall}\n"))
    catalog = build(fed, FakeBackend("mem", ["search_nodes", "open_nodes"]))
    assert sorted(names(catalog)) == ["memory_recall", "open_nodes"]
    assert provider_labels(catalog, "memory_recall") == ["mem/search_nodes"]


def test_a_renamed_tool_that_collides_is_prefixed_under_its_new_name() -> None:
    fed = config(servers("a", "b", extra="    tools:\n      rename: {find: search}\n"))
    catalog = build(fed, FakeBackend("a", ["search"]), FakeBackend("b", ["find"]))
    assert sorted(names(catalog)) == ["a__search", "b__search"]
    assert provider_labels(catalog, "b__search") == ["b/find"]


@pytest.mark.parametrize("key", ["memory_recall", "search_nodes"])
def test_describe_replaces_the_description_by_published_or_own_name(key: str) -> None:
    fed = config(
        servers(
            "mem",
            extra="    tools:\n      rename: {search_nodes: memory_recall}\n"
            f"      describe: {{{key}: 'What did we decide?'}}\n",
        )
    )
    catalog = build(fed, FakeBackend("mem", [make_tool("search_nodes", "downstream words"), make_tool("other", "o")]))
    assert listed(catalog, "memory_recall")["description"] == "What did we decide?"
    assert listed(catalog, "other")["description"] == "o"


# ----------------------------------------------------------------------------------------------- router note


def note_marked(catalog: Catalog) -> set[str]:
    return {tool["name"] for tool in catalog.list_result["tools"] if NOTE in (tool.get("description") or "")}


def test_the_router_note_goes_only_to_router_marked_tools() -> None:
    fed = config(
        f"""
gateway:
  router_note: |
    {NOTE}
servers:
  marked:
    transport: stdio
    command: x
    router: true
  picky:
    transport: stdio
    command: x
    tools:
      rename: {{raw: renamed}}
      router: [renamed]
  plain:
    transport: stdio
    command: x
adapters:
  qmd:
    command: qmd
    tools:
      files_search: {{argv: [s, "{{query}}"], router: true}}
      files_stats: {{argv: [stats]}}
wiki:
  root: docs
routes:
  ask: {{providers: [plain/ask_src], router: true}}
  plain_route: [plain/route_src]
"""
    )
    backends = (
        FakeBackend("marked", [make_tool("m1", "one"), make_tool("m2")]),
        FakeBackend("picky", [make_tool("raw", "raw words"), make_tool("unmarked", "u")]),
        FakeBackend("plain", [make_tool("p", "p"), make_tool("ask_src", "ask"), make_tool("route_src", "r")]),
        FakeBackend("qmd", [make_tool("files_search", "find"), make_tool("files_stats", "s")], kind="adapter"),
        FakeBackend("wiki", [make_tool("wiki_index", "idx"), make_tool("wiki_grep", "g")], kind="wiki"),
    )
    catalog = build(fed, *backends)
    assert set(names(catalog)) == {
        "m1",
        "m2",
        "renamed",
        "unmarked",
        "p",
        "files_search",
        "files_stats",
        "wiki_index",
        "wiki_grep",
        "ask",
        "plain_route",
    }
    assert note_marked(catalog) == {"m1", "m2", "renamed", "files_search", "wiki_index", "ask"}
    assert listed(catalog, "m1")["description"] == f"one\n\n{NOTE}"
    assert listed(catalog, "m2")["description"] == NOTE  # no description of its own: the note alone
    assert listed(catalog, "unmarked")["description"] == "u"
    assert listed(catalog, "p")["description"] == "p"
    assert listed(catalog, "plain_route")["description"] == "r"


def test_a_route_whose_schema_comes_from_a_router_adapter_tool_carries_the_note() -> None:
    fed = config(
        f"""
gateway:
  router_note: {json.dumps(NOTE)}
servers:
  remote:
    transport: stdio
    command: x
adapters:
  qmd:
    command: qmd
    tools:
      files_search: {{argv: [s, "{{query}}"], router: true}}
routes:
  files_search: [remote/query, qmd/files_search]
"""
    )
    catalog = build(fed, FakeBackend("remote", ["query"]), FakeBackend("qmd", ["files_search"], kind="adapter"))
    assert note_marked(catalog) == {"files_search"}


def test_without_a_router_note_descriptions_are_unchanged() -> None:
    fed = config("servers:\n  a:\n    transport: stdio\n    command: x\n    router: true\n")
    catalog = build(fed, FakeBackend("a", [make_tool("t", "words"), make_tool("bare")]))
    assert listed(catalog, "t")["description"] == "words"
    assert "description" not in listed(catalog, "bare")


# ----------------------------------------------------------------------------------------------- schemas


INPUT_SCHEMA: dict[str, Any] = {
    "$schema": "https://json-schema.org/draft/2020-12/schema",
    "type": "object",
    "$defs": {"Query": {"type": "string", "minLength": 1}, "Mode": {"enum": ["keyword", "vector"]}},
    "properties": {
        "query": {"$ref": "#/$defs/Query"},
        "mode": {"$ref": "#/$defs/Mode", "default": None},
        "max_results": {"type": ["integer", "null"], "default": None},
        "filters": {"type": "object", "additionalProperties": {"type": "string"}, "propertyNames": {"pattern": "^x"}},
    },
    "required": ["query"],
    "additionalProperties": False,
    "x-vendor": {"snake_case_key": [1, {"nested_key": True}]},
}
OUTPUT_SCHEMA: dict[str, Any] = {
    "type": "object",
    "$defs": {"Hit": {"type": "object", "properties": {"doc_id": {"type": "string"}}, "additionalProperties": True}},
    "properties": {"hits": {"type": "array", "items": {"$ref": "#/$defs/Hit"}}},
}


def test_input_and_output_schemas_are_published_untouched() -> None:
    fed = config(servers("a", "b"))
    original_in, original_out = json.dumps(INPUT_SCHEMA), json.dumps(OUTPUT_SCHEMA)
    catalog = build(
        fed,
        FakeBackend("a", [make_tool("search", "s", INPUT_SCHEMA, OUTPUT_SCHEMA)]),
        FakeBackend("b", [make_tool("search", "s", INPUT_SCHEMA, OUTPUT_SCHEMA)]),  # prefixed: still untouched
    )
    for name in ("a__search", "b__search"):
        tool = listed(catalog, name)
        assert tool["inputSchema"] == INPUT_SCHEMA
        assert tool["outputSchema"] == OUTPUT_SCHEMA
        assert json.dumps(tool["inputSchema"]) == original_in  # same keys, same order, nothing dropped or renamed
        assert json.dumps(tool["outputSchema"]) == original_out
        entry = catalog.get(name)
        assert entry is not None and entry.tool.input_schema == INPUT_SCHEMA
    assert json.dumps(INPUT_SCHEMA) == original_in  # and the backend's own schema was not modified
    json.dumps(catalog.list_result)  # the whole answer is plain JSON


def test_a_routes_schema_is_published_untouched() -> None:
    fed = config(servers("a") + "routes:\n  find: [a/search]\n")
    catalog = build(fed, FakeBackend("a", [make_tool("search", "s", INPUT_SCHEMA, OUTPUT_SCHEMA)]))
    tool = listed(catalog, "find")
    assert json.dumps(tool["inputSchema"]) == json.dumps(INPUT_SCHEMA)
    assert json.dumps(tool["outputSchema"]) == json.dumps(OUTPUT_SCHEMA)


# ----------------------------------------------------------------------------------------------- backend states


@pytest.mark.parametrize("state", [BackendState.FAILED, BackendState.DISABLED, BackendState.STARTING])
def test_a_backend_that_is_not_ready_has_no_tools_in_the_catalog(state: BackendState) -> None:
    fed = config(servers("up", "down"))
    down = FakeBackend("down", ["search", "other"], state=state, reason="it broke", list_when_down=True)
    catalog = build(fed, FakeBackend("up", ["search"]), down)
    assert names(catalog) == ["search"]  # and no prefix: the down backend's tool does not collide
    assert provider_labels(catalog, "search") == ["up/search"]
    assert catalog.by_backend() == {"up": 1}


def test_a_backend_lost_after_being_ready_keeps_its_last_known_tools_and_the_very_same_listing() -> None:
    fed = config(servers("up", "flaky"))
    flaky = FakeBackend("flaky", ["search", "other"])
    flaky.set_state(BackendState.READY)
    backends = {"up": FakeBackend("up", ["search"]), "flaky": flaky}
    ready = Catalog.build(fed, backends)
    flaky.set_state(BackendState.FAILED, "the connection closed; reconnecting")
    assert flaky.tools() == ()  # the backend itself offers nothing now
    lost = Catalog.build(fed, backends)
    assert lost.list_result == ready.list_result and not lost.changes(ready)  # no list_changed for a reconnect
    assert provider_labels(lost, "flaky__search") == ["flaky/search"]
    flaky.set_state(BackendState.STARTING, "connecting")
    assert names(Catalog.build(fed, backends)) == names(ready)


def test_a_lost_backends_tools_leave_once_it_is_disabled_or_removed() -> None:
    fed = config(servers("up", "flaky"))
    flaky = FakeBackend("flaky", ["search", "other"])
    flaky.set_state(BackendState.READY)
    flaky.set_state(BackendState.FAILED, "gone")
    up = FakeBackend("up", ["search"])
    assert names(Catalog.build(fed, {"up": up})) == ["search"]  # removed by a reload
    flaky.set_state(BackendState.DISABLED, "disabled in federation.yaml", declared=True)
    assert names(Catalog.build(fed, {"up": up, "flaky": flaky})) == ["search"]


def test_a_disabled_adapter_or_wiki_has_no_tools_in_the_catalog() -> None:
    fed = config("adapters:\n  qmd:\n    command: qmd\n    tools:\n      s: {argv: [s]}\nwiki:\n  root: docs\n")
    catalog = build(
        fed,
        FakeBackend("qmd", ["s"], kind="adapter", state=BackendState.DISABLED, list_when_down=True),
        FakeBackend("wiki", ["wiki_index"], kind="wiki", state=BackendState.DISABLED, list_when_down=True),
    )
    assert names(catalog) == []


def test_a_degraded_backend_that_still_serves_keeps_its_tools_published() -> None:
    fed = config("wiki:\n  root: docs\n")
    wiki = FakeBackend("wiki", ["wiki_index"], kind="wiki", state=BackendState.DEGRADED, reason="watcher failed")
    assert names(build(fed, wiki)) == ["wiki_index"]


@pytest.mark.anyio
async def test_a_fake_backend_run_in_a_task_group_becomes_ready_and_joins_a_rebuilt_catalog() -> None:
    fed = config(servers("a"))
    backend = FakeBackend("a", ["search"], state=BackendState.STARTING)
    changes: list[BackendState] = []
    backend.subscribe(lambda: changes.append(backend.status.state))
    assert names(build(fed, backend)) == []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            await tg.start(backend.run)
            assert names(build(fed, backend)) == ["search"]
            tg.cancel_scope.cancel()
    assert changes == [BackendState.READY]


# ----------------------------------------------------------------------------------------------- routes


ROUTED = """
servers:
  remote:
    transport: stdio
    command: x
  other:
    transport: stdio
    command: x
adapters:
  qmd:
    command: qmd
    tools:
      files_search: {argv: [s, "{query}"], audit: {query: 10}}
"""


def route_backends(
    *, remote: BackendState = BackendState.READY, qmd: BackendState = BackendState.READY
) -> tuple[FakeBackend, ...]:
    return (
        FakeBackend(
            "remote",
            [make_tool("query", "remote words", {"type": "object", "title": "remote"}), "status"],
            state=remote,
        ),
        FakeBackend("other", [make_tool("query", "other words", {"type": "object", "title": "other"})]),
        FakeBackend(
            "qmd",
            [make_tool("files_search", "qmd words", {"type": "object", "title": "qmd"})],
            kind="adapter",
            state=qmd,
        ),
    )


def test_a_provider_tool_consumed_by_a_route_is_not_published_on_its_own() -> None:
    fed = config(ROUTED + "routes:\n  files_search: [remote/query, qmd/files_search]\n")
    catalog = build(fed, *route_backends())
    assert sorted(names(catalog)) == ["files_search", "query", "status"]  # other/query keeps its bare name
    assert provider_labels(catalog, "files_search") == ["remote/query", "qmd/files_search"]
    assert provider_labels(catalog, "query") == ["other/query"]
    entry = catalog.get("files_search")
    assert entry is not None and entry.route
    assert catalog.by_backend() == {"remote": 2, "qmd": 1, "other": 1}


def test_a_route_takes_its_schema_from_schema_from() -> None:
    fed = config(
        ROUTED + "routes:\n  files_search:\n    providers: [qmd/files_search, remote/query]\n"
        "    schema_from: remote/query\n"
    )
    tool = listed(build(fed, *route_backends()), "files_search")
    assert tool["inputSchema"]["title"] == "remote"
    assert tool["description"] == "remote words"


def test_a_route_takes_its_schema_from_the_first_adapter_or_wiki_provider_by_default() -> None:
    fed = config(ROUTED + "routes:\n  files_search: [remote/query, qmd/files_search]\n")
    catalog = build(fed, *route_backends())
    tool = listed(catalog, "files_search")
    assert tool["inputSchema"]["title"] == "qmd"
    assert tool["description"] == "qmd words"
    entry = catalog.get("files_search")
    assert entry is not None and dict(entry.audit) == {"query": 10}  # the adapter tool's audit spec comes along


def test_a_route_takes_its_schema_from_the_first_available_provider_when_no_adapter_serves_it() -> None:
    fed = config(ROUTED + "routes:\n  ask: [remote/query, other/query]\n")
    assert listed(build(fed, *route_backends()), "ask")["inputSchema"]["title"] == "remote"
    catalog = build(fed, *route_backends(remote=BackendState.FAILED))
    assert listed(catalog, "ask")["inputSchema"]["title"] == "other"
    assert provider_labels(catalog, "ask") == ["remote/query", "other/query"]  # the down provider stays in the chain


def test_a_route_whose_schema_from_is_down_falls_back_to_an_available_provider() -> None:
    fed = config(
        ROUTED + "routes:\n  ask:\n    providers: [remote/query, other/query]\n    schema_from: remote/query\n"
    )
    catalog = build(fed, *route_backends(remote=BackendState.FAILED))
    assert listed(catalog, "ask")["inputSchema"]["title"] == "other"


def test_a_route_description_and_audit_override_the_providers() -> None:
    fed = config(
        ROUTED + "routes:\n  files_search:\n    providers: [remote/query, qmd/files_search]\n"
        "    description: Route words.\n    audit: {query: 3}\n"
    )
    catalog = build(fed, *route_backends())
    assert listed(catalog, "files_search")["description"] == "Route words."
    entry = catalog.get("files_search")
    assert entry is not None and dict(entry.audit) == {"query": 3}


def test_a_route_with_no_available_provider_is_not_published_and_says_why() -> None:
    fed = config(ROUTED + "routes:\n  files_search: [remote/query, qmd/files_search]\n")
    catalog = build(fed, *route_backends(remote=BackendState.FAILED, qmd=BackendState.FAILED))
    assert "files_search" not in names(catalog)
    assert catalog.get("files_search") is None
    assert any("'files_search'" in problem and "not published" in problem for problem in catalog.problems)


def test_route_argument_templates_reach_the_catalog_entry() -> None:
    fed = config(ROUTED + "routes:\n  ask:\n    - provider: remote/query\n      arguments: {q: '{question}'}\n")
    entry = build(fed, *route_backends()).get("ask")
    assert entry is not None
    assert entry.providers[0].map_arguments({"question": "why?"}) == {"q": "why?"}


# ----------------------------------------------------------------------------------------------- Provider.map_arguments


def test_map_arguments_without_a_template_passes_a_copy_of_the_arguments_through() -> None:
    provider = Provider("b", "t")
    arguments = {"query": "x", "limit": 5, "nested": {"a": [1]}}
    mapped = provider.map_arguments(arguments)
    assert mapped == arguments
    mapped["extra"] = 1
    assert "extra" not in arguments


def test_map_arguments_substitutes_an_exact_placeholder_keeping_the_value_type() -> None:
    provider = Provider("b", "t", {"q": "{query}", "n": "{limit}", "f": "{flags}", "o": "{opts}", "z": "{none}"})
    arguments: dict[str, Any] = {"query": "x", "limit": 5, "flags": [True, 1.5], "opts": {"k": "v"}, "none": None}
    assert provider.map_arguments(arguments) == {"q": "x", "n": 5, "f": [True, 1.5], "o": {"k": "v"}, "z": None}


def test_map_arguments_fills_nested_dicts_and_lists() -> None:
    provider = Provider(
        "b", "t", {"search": {"text": "{query}", "opts": {"limit": "{limit}"}}, "terms": ["{query}", "{limit}"]}
    )
    assert provider.map_arguments({"query": "x", "limit": 3}) == {
        "search": {"text": "x", "opts": {"limit": 3}},
        "terms": ["x", 3],
    }


def test_map_arguments_drops_keys_and_items_whose_argument_is_absent() -> None:
    provider = Provider("b", "t", {"q": "{query}", "m": "{mode}", "nested": {"m": "{mode}"}, "list": ["{mode}", "k"]})
    assert provider.map_arguments({"query": "x"}) == {"q": "x", "nested": {}, "list": ["k"]}


def test_map_arguments_keeps_literals_and_strings_that_only_contain_a_placeholder() -> None:
    provider = Provider(
        "b",
        "t",
        {
            "format": "json",
            "n": 3,
            "on": True,
            "nothing": None,
            "mixed": "q={query}",
            "braces": "{}",
            "pad": " {query}",
        },
    )
    assert provider.map_arguments({"query": "x"}) == {
        "format": "json",
        "n": 3,
        "on": True,
        "nothing": None,
        "mixed": "q={query}",
        "braces": "{}",
        "pad": " {query}",
    }


def test_map_arguments_drops_an_absent_argument_whose_name_is_not_an_identifier() -> None:
    provider = Provider("b", "t", {"n": "{max-results}", "q": "{query}"})
    assert provider.map_arguments({"max-results": 3}) == {"n": 3}  # present: substituted (this part works)
    assert provider.map_arguments({"query": "x"}) == {"q": "x"}  # absent: dropped, not sent as "{max-results}"


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3),
    max_leaves=8,
)
identifiers = st.from_regex(r"[a-z_][a-z0-9_]{0,8}", fullmatch=True)


@given(arguments=st.dictionaries(identifiers, json_values, max_size=6), wanted=st.lists(identifiers, max_size=6))
def test_a_placeholder_for_each_argument_maps_exactly_the_present_ones(
    arguments: Mapping[str, Any], wanted: list[str]
) -> None:
    provider = Provider("b", "t", {f"to_{name}": f"{{{name}}}" for name in wanted})
    mapped = provider.map_arguments(arguments)
    assert mapped == {f"to_{name}": arguments[name] for name in wanted if name in arguments}
    for name in wanted:
        if name in arguments:
            assert mapped[f"to_{name}"] is arguments[name]  # the value itself, not a copy or its text


GATED_NOTE = """Router:
  - Know the path? -> files_read
  - Large context, audit-style "everything about X"? -> wiki_read_all (only offered to
    clients that declare a large context)
  - "What connects A to B?" -> graph_query"""


def test_a_small_clients_listing_has_no_router_note_item_naming_a_tool_it_cannot_see() -> None:
    fed = parse_config(
        "gateway:\n  router_note: |\n"
        + "".join(f"    {line}\n" for line in GATED_NOTE.split("\n"))
        + "servers:\n  a: {transport: stdio, command: x, router: true}\n"
    )
    catalog = build(fed, FakeBackend("a", ["files_read", "wiki_read_all"]))
    small = {t["name"]: t["description"] for t in catalog.listing(large_context=False)["tools"]}
    large = {t["name"]: t["description"] for t in catalog.listing(large_context=True)["tools"]}
    assert small.keys() == {"files_read"} and large.keys() == {"files_read", "wiki_read_all"}
    assert large["files_read"].endswith(GATED_NOTE)
    assert small["files_read"].endswith(
        'Router:\n  - Know the path? -> files_read\n  - "What connects A to B?" -> graph_query'
    )
    assert "wiki_read_all" not in small["files_read"]


# ------------------------------------------------------------------------------------ the note once, and its cost


def _routed(placement: str) -> Catalog:
    fed = config(
        f"""
gateway:
  router_note: {json.dumps(NOTE)}
{placement}servers:
  a:
    transport: stdio
    command: x
    router: true
"""
    )
    return build(fed, FakeBackend("a", ["first", "second", "third"]))


def test_the_router_note_can_be_placed_once_in_one_tool_and_the_catalog_costs_fewer_tokens() -> None:
    each, once = _routed(""), _routed("  router_note_in: once\n")
    assert note_marked(each) == {"first", "second", "third"}
    assert note_marked(once) == {"first"}  # the first routed tool, in the catalog's order
    chosen = _routed("  router_note_in: once\n  router_note_tool: third\n")
    assert note_marked(chosen) == {"third"}
    assert 0 < once.tokens[0] < each.tokens[0]
    assert once.tokens[0] == list_tokens(once.list_result)


def test_with_budgets_the_reader_is_listed_to_the_clients_budgets_reach_and_callable() -> None:
    fed = config(servers("a", gateway="") + "clients: {budget: {answer_share: 0.1}}\n")
    catalog = build(fed, FakeBackend("a", ["search"]))
    assert "read_result" not in names(catalog)  # large clients are exempt: their list is unchanged
    small = catalog.listing(False)
    assert [t["name"] for t in small["tools"]] == ["search", "read_result"]
    assert catalog.get("read_result") is not None
    assert catalog.tokens[1] > catalog.tokens[0]


def test_the_default_files_search_description_promises_the_shape_its_structured_result_has() -> None:
    text = (Path(__file__).resolve().parents[2] / "federation.yaml").read_text(encoding="utf-8")
    fed = parse_config(text, file="federation.yaml", env={})
    description = fed.adapters["qmd"].tools["files_search"].description or ""
    assert '{"results": [' in description  # what shape_result returns as structuredContent (core/results.py)
    assert "Returns a JSON array" not in description
