"""Listings: resources, templates and prompts merged from the ready backends, named like the tools, resolvable back.

In memory: real ``McpBackend`` objects that never connect, given what a handshake and the list requests would have
returned.
"""

from __future__ import annotations

import mcp_types as types
import pytest

from gateway.backends.base import BackendState, BackendStatus
from gateway.backends.mcp.session import McpBackend
from gateway.calls import Origin
from gateway.config import parse_config
from gateway.core.listings import Listings, Offers


def _backend(
    name: str,
    *,
    prompts: tuple[str, ...] = (),
    resources: tuple[str, ...] = (),
    templates: tuple[str, ...] = (),
    caps: types.ServerCapabilities | None = None,
    state: BackendState = BackendState.READY,
) -> McpBackend:
    config = parse_config(f"servers:\n  {name}:\n    transport: stdio\n    command: x\n").servers[name]
    backend = McpBackend(name, config)
    backend._status = BackendStatus(state)
    backend._init = types.InitializeResult(
        protocol_version="2025-11-25",
        capabilities=caps
        or types.ServerCapabilities(
            prompts=types.PromptsCapability(),
            resources=types.ResourcesCapability(subscribe=True),
            completions=types.CompletionsCapability(),
        ),
        server_info=types.Implementation(name=name, version="1"),
    )
    backend._lists["prompts"] = tuple(types.Prompt(name=p, description=f"{p} of {name}") for p in prompts)
    backend._lists["resources"] = tuple(types.Resource(uri=u, name=u) for u in resources)
    backend._lists["resource_templates"] = tuple(types.ResourceTemplate(uri_template=t, name=t) for t in templates)
    return backend


def _build(*backends: McpBackend, mode: str = "conditional") -> Listings:
    config = parse_config(f"gateway:\n  naming: {{mode: {mode}}}\n")
    return Listings.build(config, {b.name: b for b in backends})


def test_names_are_untouched_unless_they_collide_and_then_prefixed_with_the_backend() -> None:
    lists = _build(
        _backend("a", prompts=("greet", "only_a"), resources=("x://1", "x://a"), templates=("x://item/{id}",)),
        _backend("b", prompts=("greet",), resources=("x://1",), templates=("x://item/{id}", "y://{n}")),
    )
    assert [p["name"] for p in lists.prompts_result["prompts"]] == ["a__greet", "only_a", "b__greet"]
    assert [r["uri"] for r in lists.resources_result["resources"]] == ["a__x://1", "x://a", "b__x://1"]
    assert [t["uriTemplate"] for t in lists.templates_result["resourceTemplates"]] == [
        "a__x://item/{id}",
        "b__x://item/{id}",
        "y://{n}",
    ]
    assert lists.prompt("b__greet") == Origin("b", "greet") and lists.prompt("greet") is None
    assert lists.prompts_result["prompts"][2]["description"] == "greet of b"  # the rest of the item is untouched
    assert lists.template("a__x://item/{id}") == Origin("a", "x://item/{id}")


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("a__x://1", (Origin("a", "x://1"),)),  # listed, prefixed
        ("x://a", (Origin("a", "x://a"),)),  # listed, untouched
        ("b__x://item/7", (Origin("b", "x://item/7"),)),  # from a prefixed template: the prefix survives expansion
        ("y://42", (Origin("b", "y://42"),)),  # from an untouched template
        ("a__x://unlisted", (Origin("a", "x://unlisted"),)),  # a backend's prefix, nothing listed: that backend
        ("z://unknown", (Origin("a", "z://unknown"), Origin("b", "z://unknown"))),  # every resource backend, in order
    ],
)
def test_every_published_uri_resolves_back_to_its_backend_and_its_own_uri(
    uri: str, expected: tuple[Origin, ...]
) -> None:
    lists = _build(
        _backend("a", resources=("x://1", "x://a"), templates=("x://item/{id}",)),
        _backend("b", resources=("x://1",), templates=("x://item/{id}", "y://{n}")),
    )
    assert lists.resolve(uri) == expected


def test_always_prefixes_everything_and_never_keeps_the_first_and_records_the_rest() -> None:
    a, b = _backend("a", prompts=("greet",)), _backend("b", prompts=("greet", "solo"))
    assert [p["name"] for p in _build(a, b, mode="always").prompts_result["prompts"]] == [
        "a__greet",
        "b__greet",
        "b__solo",
    ]
    never = _build(a, b, mode="never")
    assert [p["name"] for p in never.prompts_result["prompts"]] == ["greet", "solo"]
    assert never.prompt("greet") == Origin("a", "greet")
    assert never.problems == ("prompt b/greet is not published: 'greet' is already taken (naming mode 'never')",)


def test_only_ready_backends_count_and_the_offers_are_their_union() -> None:
    tools_only = types.ServerCapabilities(tools=types.ToolsCapability())
    logs = types.ServerCapabilities(logging=types.LoggingCapability(), resources=types.ResourcesCapability())
    lists = _build(
        _backend("up", caps=logs, resources=("x://up",)),
        _backend("plain", caps=tools_only),
        _backend("down", prompts=("gone",), state=BackendState.FAILED),
    )
    assert lists.offers == Offers(resources=True, subscribe=False, prompts=False, completions=False, logging=True)
    assert lists.prompts_result == {"prompts": []}
    assert lists.resource_backends == ("up",)
    assert _build().offers == Offers()
