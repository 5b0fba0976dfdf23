"""The session of a dual-era downstream's other era (gateway/backends/mcp/twin.py): what it alone lists is merged
after the shared session's lists, for every list kind, and each request goes on the session that serves it for the
calling client's era; a handshake twin is opened only when a client of that era needs it, and says so in ``eras``.

In memory: the twin's session is a stand-in that answers the four list requests (the real sessions run in
tests/front/test_eras_matched.py)."""

from __future__ import annotations

from typing import Any

import anyio
import mcp_types as types
import pytest

from gateway.backends.mcp.failures import Life
from gateway.backends.mcp.lanes import Lane
from gateway.backends.mcp.relay import InFlight
from gateway.backends.mcp.twin import NOT_YET_TRIED, Twin
from gateway.config import parse_config

pytestmark = pytest.mark.anyio

MODERN = "2026-07-28"
CONFIG = parse_config("servers:\n  s:\n    transport: streamable_http\n    url: http://127.0.0.1:9/mcp\n").servers["s"]
CAPS = types.ServerCapabilities(
    tools=types.ToolsCapability(), prompts=types.PromptsCapability(), resources=types.ResourcesCapability()
)


def _tool(name: str) -> types.Tool:
    return types.Tool(name=name, input_schema={"type": "object"})


class _Lister:
    """A session that lists: tools a, b; prompts p, q; resource r://1; template x://{id}."""

    async def list_tools(self, params: Any = None) -> types.ListToolsResult:
        return types.ListToolsResult(tools=[_tool("a"), _tool("b")])

    async def send_request(self, request: Any, result_type: Any, **_: Any) -> Any:
        return {
            "resources/list": types.ListResourcesResult(resources=[types.Resource(uri="r://1", name="r")]),
            "resources/templates/list": types.ListResourceTemplatesResult(
                resource_templates=[types.ResourceTemplate(uri_template="x://{id}", name="x")]
            ),
            "prompts/list": types.ListPromptsResult(prompts=[types.Prompt(name="p"), types.Prompt(name="q")]),
        }[request.method]


SHARED: dict[str, tuple[Any, ...]] = {
    "tools": (_tool("a"),),
    "resources": (types.Resource(uri="r://1", name="r"),),
    "resource_templates": (),
    "prompts": (types.Prompt(name="p"),),
}


def _call(name: str) -> tuple[str, Any]:
    return "tools/call", types.CallToolRequestParams(name=name, arguments={})


def _prompt(name: str) -> tuple[str, Any]:
    return "prompts/get", types.GetPromptRequestParams(name=name)


def _read(uri: str) -> tuple[str, Any]:
    return "resources/read", types.ReadResourceRequestParams(uri=uri)


def _complete(name: str) -> tuple[str, Any]:
    ref = types.PromptReference(name=name)
    return "completion/complete", types.CompleteRequestParams(ref=ref, argument={"name": "n", "value": "v"})


async def test_what_a_stateless_twin_alone_lists_is_merged_for_every_kind_and_served_there_to_both_eras() -> None:
    twin = Twin("s", CONFIG)
    session: Any = _Lister()
    twin.era, twin.session, twin._caps = MODERN, session, CAPS
    merged = await twin.merged(dict(SHARED), Life())
    assert [t.name for t in merged["tools"]] == ["a", "b"]
    assert [p.name for p in merged["prompts"]] == ["p", "q"]
    assert [t.uri_template for t in merged["resource_templates"]] == ["x://{id}"]
    assert [str(r.uri) for r in merged["resources"]] == ["r://1"]
    alone = [_call("b"), _prompt("q"), _read("x://7"), _complete("q")]
    both = [_call("a"), _prompt("p"), _read("r://1"), _complete("p")]
    for method, params in alone:  # whatever the client's era
        assert await twin.route(method, params, "handshake") is session, method
        assert await twin.route(method, params, MODERN) is session, method
    for method, params in both:  # the client's own era's session
        assert await twin.route(method, params, "handshake") is None, method
        assert await twin.route(method, params, MODERN) is session, method
    assert await twin.route(*_call("c"), MODERN) is None  # not listed by the twin: the shared session's


async def test_a_handshake_twin_is_opened_once_when_a_client_of_its_era_needs_it_and_a_refusal_is_kept() -> None:
    twin, opened, changed = Twin("s", CONFIG), [], []

    async def refusing() -> Lane:
        lane = Lane("handshake", InFlight())
        lane.failure = "it refused the handshake"
        lane.ready.set()
        opened.append(lane)
        return lane

    async def relisted() -> None:
        changed.append(True)

    found = types.DiscoverResult(supported_versions=[MODERN], capabilities=CAPS)
    twin.defer(found, refusing, relisted)
    assert twin.eras((MODERN,)) == (MODERN, NOT_YET_TRIED)
    assert await twin.route(*_call("a"), MODERN) is None  # a 2026 client needs no handshake: nothing opened
    assert opened == []
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:  # several 2025 clients at once: one opening
            for _ in range(3):
                tg.start_soon(twin.route, *_call("a"), "handshake")
    assert (len(opened), changed) == (1, [True])
    assert twin.eras((MODERN,)) == (MODERN, "handshake: refused (it refused the handshake)")
    assert await twin.route(*_call("a"), "handshake") is None  # served over the stateless session, not asked again
    assert len(opened) == 1


def test_a_discover_answer_naming_a_handshake_version_says_the_era_is_spoken_before_it_is_opened() -> None:
    twin = Twin("s", CONFIG)

    async def never() -> Lane:
        raise AssertionError("not opened")

    async def nothing() -> None:
        return None

    found = types.DiscoverResult(supported_versions=["2025-11-25", MODERN], capabilities=CAPS)
    twin.defer(found, never, nothing)
    assert twin.eras((MODERN,)) == ("handshake", MODERN)
