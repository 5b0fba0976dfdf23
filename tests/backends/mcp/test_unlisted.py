"""``servers.NAME.unlisted_tools``: a tool a server serves without listing it (as the conformance suite's reference
server serves its ``test_trigger_*`` tools) is callable through the gateway when the operator declares it, and only
then. Over a real gateway process in front of a real stdio server (tests/fixtures/echo_server.py ``--hidden``): the
declared tool is routed, audited under its name and policed like a listed one, but never listed; undeclared, it is
the same unknown tool as any other name."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from structlog.testing import capture_logs

from gateway.backends.base import Backend
from gateway.calls import Caller
from gateway.config import parse_config
from gateway.core.catalog import Catalog
from gateway.core.policies import Views
from gateway.errors import ConfigError
from gateway.testing import FakeBackend
from tests.core.test_policies import HANDSHAKE, MODERN, raw, rows
from tests.fixtures.gateway_proc import PYTHON, echo_argv, run_gateway

pytestmark = pytest.mark.anyio

TOKENS = "alice=tok-alice-0123,bob=tok-bob-4567"
LISTED = {"echo", "add", "fail", "slow", "sleep", "crash", "pid", "with_defs"}


def config(unlisted: str | None) -> str:
    declared = f"\n    unlisted_tools: {unlisted}" if unlisted is not None else ""
    return f"""
gateway:
  audit: {{path: audit.db}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv("--hidden")[1:])}{declared}
policies:
  all:
    callers: [alice]
  no_hidden:
    callers: [bob]
    tools: {{exclude: [hidden]}}
"""


@pytest.mark.spawns
@pytest.mark.parametrize("era", [HANDSHAKE, MODERN])
async def test_a_declared_unlisted_tool_is_served_audited_and_policed_but_never_listed(
    tmp_path: Path, era: str
) -> None:
    with run_gateway(config("[hidden]"), tmp_path, tokens=TOKENS) as gateway:
        async with raw(gateway.url(), "tok-alice-0123", era) as alice, raw(gateway.url(), "tok-bob-4567", era) as bob:
            assert await alice.tools() == LISTED  # the server does not list it, nor does the gateway
            assert await bob.tools() == LISTED

            served = json.loads(await alice.send("tools/call", {"name": "hidden", "arguments": {"text": "hi"}}))
            assert served["result"]["content"] == [{"type": "text", "text": "hidden: hi"}]
            assert not served["result"].get("isError")

            # A policy that does not allow it answers exactly as for a tool that does not exist.
            refused = await bob.send("tools/call", {"name": "hidden", "arguments": {"text": "hi"}})
            refused_status = bob.status
            unknown = await bob.send("tools/call", {"name": "hidde_", "arguments": {"text": "hi"}})
            assert refused.replace(b"hidden", b"hidde_") == unknown
            assert refused_status == bob.status
            assert json.loads(refused)["error"]["message"] == "Unknown tool: 'hidden'."

    found = [(caller, tool, status) for caller, tool, status, _ in rows(tmp_path)]
    assert found == [("alice", "hidden", "ok"), ("bob", "hidden", "refused"), ("bob", "hidde_", "unknown_tool")]
    assert [step["provider"] for step in rows(tmp_path)[0][3]] == ["e/hidden"]


@pytest.mark.spawns
@pytest.mark.parametrize("era", [HANDSHAKE, MODERN])
async def test_an_undeclared_unlisted_tool_is_an_unknown_tool(tmp_path: Path, era: str) -> None:
    with run_gateway(config(None), tmp_path, tokens=TOKENS) as gateway:
        async with raw(gateway.url(), "tok-alice-0123", era) as alice:
            assert await alice.tools() == LISTED
            hidden = await alice.send("tools/call", {"name": "hidden", "arguments": {"text": "hi"}})
            hidden_status = alice.status
            unknown = await alice.send("tools/call", {"name": "hidde_", "arguments": {"text": "hi"}})
            assert hidden.replace(b"hidden", b"hidde_") == unknown  # never forwarded blindly
            assert hidden_status == alice.status
            assert json.loads(hidden)["error"]["message"] == "Unknown tool: 'hidden'."

    found = [(caller, tool, status) for caller, tool, status, _ in rows(tmp_path)]
    assert found == [("alice", "hidden", "unknown_tool"), ("alice", "hidde_", "unknown_tool")]


def _catalog(text: str, backends: dict[str, Backend]) -> Catalog:
    return Catalog.build(parse_config(text, env={}), backends)


def test_unlisted_tools_are_named_by_the_servers_naming_rule_and_a_listed_tool_wins() -> None:
    servers = """
servers:
  a: {transport: stdio, command: x, unlisted_tools: [trigger, echo, shared]}
  b: {transport: stdio, command: x, unlisted_tools: [shared]}
"""
    backends: dict[str, Backend] = {"a": FakeBackend("a", ["echo", "search"]), "b": FakeBackend("b", ["search"])}
    with capture_logs() as logs:
        catalog = _catalog(servers, backends)
        _catalog(servers, backends)  # rebuilt (a backend changed): the moot declaration is not logged again
    moot = [entry for entry in logs if entry["event"] == "catalog.unlisted_moot"]
    assert moot == [{"event": "catalog.unlisted_moot", "backend": "a", "tool": "echo", "log_level": "info"}]
    # conditional: as is unless the name is taken (two servers declare `shared`); `echo` is listed: moot
    assert set(catalog.unlisted) == {"trigger", "a__shared", "b__shared"}
    assert set(catalog.entries) == {"echo", "a__search", "b__search"}
    assert [t["name"] for t in catalog.list_result["tools"]] == ["echo", "a__search", "b__search"]
    trigger = catalog.get("trigger")
    assert trigger is not None and [p.label for p in trigger.providers] == ["a/trigger"]
    assert catalog.get("echo") is catalog.entries["echo"]
    assert catalog.problems == ()

    always = _catalog("gateway: {naming: {mode: always}}\n" + servers, backends)
    assert set(always.unlisted) == {"a__trigger", "a__shared", "b__shared"}
    assert always.get("trigger") is None

    # A listed tool of another server keeps its name: the unlisted one is prefixed under `conditional`, and under
    # `never` it is not served (a problem for `gateway check`), never the listed one.
    clash = (
        "servers:\n  a: {transport: stdio, command: x, unlisted_tools: [search]}\n  b: {transport: stdio, command: x}\n"
    )
    one: dict[str, Backend] = {"a": FakeBackend("a", ["echo"]), "b": FakeBackend("b", ["search"])}
    conditional = _catalog(clash, one)
    assert set(conditional.entries) == {"echo", "search"} and set(conditional.unlisted) == {"a__search"}
    never = _catalog("gateway: {naming: {mode: never}}\n" + clash, one)
    assert never.get("search") is never.entries["search"] and not never.unlisted
    assert never.problems == (
        "unlisted tool a/search is not served: the name 'search' is already taken (naming mode 'never')",
    )


def test_a_policy_view_can_call_an_allowed_unlisted_tool_without_listing_it() -> None:
    text = """
servers:
  a: {transport: stdio, command: x, unlisted_tools: [trigger, other]}
policies:
  p:
    tools: {exclude: [other]}
"""
    catalog = _catalog(text, {"a": FakeBackend("a", ["echo"])})
    views = Views()
    view = views.view(catalog, Caller("anyone"))
    assert view is not None and view.tools == {"echo", "trigger"}
    assert [t["name"] for t in view.list_result["tools"]] == ["echo"]
    assert views.statistics(catalog)["policies"][0]["tools"] == 1  # what it shows, not what it may call


@pytest.mark.parametrize(
    ("value", "where", "message"),
    [
        ('[ok, "bad name"]', "servers.a.unlisted_tools.1", "tool name 'bad name' is invalid"),
        ("[1]", "servers.a.unlisted_tools.0", "must be text (got 1)"),
        ("oops", "servers.a.unlisted_tools", "must be a list"),
    ],
)
def test_unlisted_tools_are_checked_at_load_naming_file_key_and_line(value: str, where: str, message: str) -> None:
    text = f"servers:\n  a:\n    transport: stdio\n    command: x\n    unlisted_tools: {value}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, file="f.yaml", env={})
    assert str(caught.value).startswith(f"f.yaml:5: {where}: {message}")
