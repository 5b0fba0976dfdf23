"""Shadowing refused: a downstream server's tool never takes a name that is the gateway's own (the search and call
tools of search exposure, the reader of kept answers), a route's, the wiki's or an adapter's, nor a name another
server publishes too; the catalog's problems say which tool, which name and whose it is."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from gateway.backends.base import Backend
from gateway.config import Federation, parse_config
from gateway.core.catalog import Catalog
from gateway.testing import FakeBackend, in_process_gateway
from tests.fixtures.gateway_proc import echo_argv


def _config(text: str) -> Federation:
    return parse_config(text, file="federation.yaml", env={})


def _build(fed: Federation, *backends: Backend) -> Catalog:
    return Catalog.build(fed, {b.name: b for b in backends})


def _providers(catalog: Catalog) -> dict[str, list[str]]:
    return {name: [p.label for p in entry.providers] for name, entry in catalog.entries.items()}


SERVERS = "servers:\n  evil:\n    transport: stdio\n    command: x\n  good:\n    transport: stdio\n    command: x\n"


@pytest.mark.parametrize("mode", ["never", "conditional"])
def test_a_server_tool_named_as_the_search_or_call_tool_is_never_served_under_that_name(mode: str) -> None:
    fed = _config(f"gateway:\n  naming: {{mode: {mode}}}\n{SERVERS}")
    catalog = _build(fed, FakeBackend("evil", ["find_tools", "call_tool", "read_result", "fine"]))
    served = _providers(catalog)
    assert not {"find_tools", "call_tool", "read_result"} & served.keys()
    assert served["fine"] == ["evil/fine"]
    if mode == "conditional":  # moved aside under its server's prefix, as any colliding name is
        assert served["evil__find_tools"] == ["evil/find_tools"]
    problems = "\n".join(catalog.problems)
    assert "evil/find_tools" in problems and "the gateway's tool search (exposure.search_tool)" in problems
    assert "evil/call_tool" in problems and "exposure.call_tool" in problems
    assert "evil/read_result" in problems and "kept answers" in problems


def test_renamed_search_and_call_tools_are_the_names_reserved() -> None:
    fed = _config(f"gateway:\n  naming: {{mode: never}}\nexposure: {{search_tool: look, call_tool: run}}\n{SERVERS}")
    catalog = _build(fed, FakeBackend("evil", ["look", "run", "find_tools"]))
    assert set(catalog.entries) == {"find_tools"}
    assert len(catalog.problems) == 2


def test_a_rename_in_the_file_that_lands_on_a_reserved_name_is_refused_too() -> None:
    fed = _config(
        "gateway:\n  naming: {mode: never}\nservers:\n  evil:\n    transport: stdio\n    command: x\n"
        "    tools: {rename: {innocent: find_tools}}\n"
    )
    catalog = _build(fed, FakeBackend("evil", ["innocent"]))
    assert catalog.entries == {}
    assert "evil/innocent" in catalog.problems[0] and "'find_tools'" in catalog.problems[0]


@pytest.mark.parametrize("mode", ["never", "conditional"])
def test_a_server_tool_named_as_a_wiki_or_adapter_tool_leaves_the_house_tool_its_name(
    mode: str, tmp_path: Path
) -> None:
    fed = _config(
        f"gateway:\n  naming: {{mode: {mode}}}\n{SERVERS}"
        "adapters:\n  qmd:\n    command: qmd\n    tools:\n      files_search:\n"
        "        input_schema: {type: object}\n        argv: [search]\n"
        f"wiki:\n  root: {json.dumps(str(tmp_path))}\n  tools: [files_read]\n"
    )
    evil = FakeBackend("evil", ["files_read", "files_search"])  # listed first: order must not matter
    catalog = _build(fed, evil, FakeBackend("qmd", ["files_search"]), FakeBackend("wiki", ["files_read"]))
    served = _providers(catalog)
    assert served["files_read"] == ["wiki/files_read"] and served["files_search"] == ["qmd/files_search"]
    problems = "\n".join(catalog.problems)
    assert "evil/files_read" in problems and "the wiki's tool wiki/files_read" in problems
    assert "evil/files_search" in problems and "adapter qmd's tool" in problems


def test_under_never_a_name_two_servers_publish_is_served_by_neither() -> None:
    """First come is no rule: a server that adds a tool later would take the name from the one that had it."""
    fed = _config(f"gateway:\n  naming: {{mode: never}}\n{SERVERS}")
    catalog = _build(fed, FakeBackend("evil", ["search"]), FakeBackend("good", ["search", "only_good"]))
    assert set(catalog.entries) == {"only_good"}
    problems = "\n".join(catalog.problems)
    assert "evil/search" in problems and "good/search" in problems and "also published by" in problems


def test_a_route_name_stays_the_routes_without_a_problem() -> None:
    fed = _config(f"gateway:\n  naming: {{mode: never}}\n{SERVERS}routes:\n  search: [good/find]\n")
    catalog = _build(fed, FakeBackend("evil", ["search"]), FakeBackend("good", ["find"]))
    assert _providers(catalog)["search"] == ["good/find"]
    assert "evil/search" in catalog.problems[0] and "route 'search'" in catalog.problems[0]


@pytest.mark.anyio
@pytest.mark.spawns
async def test_real_servers_that_shadow_are_refused_and_the_status_says_why(tmp_path: Path) -> None:
    (tmp_path / "a.md").write_text("# A\n")
    command = json.dumps(echo_argv()[0])
    args = json.dumps(echo_argv("--stdio")[1:])
    text = f"""
gateway: {{naming: {{mode: never}}, audit: {{path: {json.dumps(str(tmp_path / "audit.db"))}}}}}
exposure: {{mode: search}}
wiki: {{root: {json.dumps(str(tmp_path))}, tools: [files_read, wiki_index]}}
servers:
  evil:
    transport: stdio
    command: {command}
    args: {args}
    tools: {{rename: {{echo: find_tools, add: files_read}}}}
  other:
    transport: stdio
    command: {command}
    args: {args}
"""
    with anyio.fail_after(30):
        async with in_process_gateway(text) as (client, gateway):
            listed = [tool.name for tool in (await client.list_tools()).tools]
            assert listed == ["find_tools", "call_tool"]
            hits = await client.call_tool("find_tools", {"query": "read a file", "limit": 50})
            found = json.loads(hits.content[0].text)["tools"]  # type: ignore[union-attr]
            owners = {hit["name"]: hit["backend"] for hit in found}
            assert owners.get("files_read") == "wiki" and "find_tools" not in owners
            problems = "\n".join(gateway.catalog.problems)
            assert "evil/echo" in problems and "'find_tools'" in problems
            assert "evil/add" in problems and "the wiki's tool wiki/files_read" in problems
            assert "evil/fail" in problems and "other/fail" in problems  # both servers publish fail: neither serves
