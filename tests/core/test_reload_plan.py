"""What an edit of federation.yaml changes: the reload plan, computed from two validated configurations."""

from __future__ import annotations

import pytest

from gateway.config import parse_config
from gateway.core.reload import check_reload, plan_reload
from gateway.errors import ConfigError

BASE = """
gateway: {listen: {port: 8080}}
servers:
  a: {transport: stdio, command: a}
  b: {transport: streamable_http, url: "http://127.0.0.1:1/mcp"}
adapters:
  c: {command: c, tools: {t: {argv: [x]}}}
wiki: {root: docs}
"""


def test_an_identical_file_changes_nothing() -> None:
    plan = plan_reload(parse_config(BASE), parse_config(BASE))
    assert plan.summary() == {}
    assert plan.unchanged == ("a", "b", "c", "wiki")


def test_added_removed_and_changed_backends_are_told_apart() -> None:
    new = BASE.replace('  b: {transport: streamable_http, url: "http://127.0.0.1:1/mcp"}\n', "").replace(
        "command: a}", "command: a, args: [--verbose]}\n  d: {transport: stdio, command: d}"
    )
    plan = plan_reload(parse_config(BASE), parse_config(new))
    assert plan.added == ("d",)
    assert plan.removed == ("b",)
    assert plan.changed == ("a",)
    assert plan.unchanged == ("c", "wiki")


def test_a_backend_moved_between_sections_is_a_change() -> None:
    new = BASE.replace("  c: {command: c, tools: {t: {argv: [x]}}}\n", "  x: {command: c, tools: {t: {argv: [x]}}}\n")
    new = new.replace("servers:\n", "servers:\n  c: {transport: stdio, command: c}\n")
    plan = plan_reload(parse_config(BASE), parse_config(new))
    assert "c" in plan.changed and plan.added == ("x",)


def test_settings_bound_at_startup_are_reported_as_needing_a_restart() -> None:
    new = BASE.replace("port: 8080", "port: 9090")
    plan = plan_reload(parse_config(BASE), parse_config(new + "routes: {}\n"))
    assert plan.restart_needed == ("gateway.listen",)
    assert plan.changed == ()


def test_disabling_a_wiki_restarts_it_as_a_disabled_backend_shown_with_its_reason() -> None:
    new = BASE.replace("wiki: {root: docs}", "wiki: {root: docs, enabled: false, disabled_reason: moving}")
    plan = plan_reload(parse_config(BASE), parse_config(new))
    assert plan.changed == ("wiki",) and plan.removed == ()


@pytest.mark.parametrize(
    ("text", "what"),
    [
        ("", "the file is empty"),
        ("# half-saved\n", "the file is empty"),
        ("gateway: {drain_s: 5}\nservers: {}\n", "the file declares no backends (servers, adapters, wiki)"),
    ],
)
def test_an_edit_removing_every_backend_is_refused_naming_the_file(text: str, what: str) -> None:
    with pytest.raises(ConfigError) as info:
        check_reload(parse_config(BASE), parse_config(text, file="conf/federation.yaml", env={}))
    assert str(info.value) == (
        f"conf/federation.yaml: {what}: applying it would remove all 4 backends, so it is taken for an unfinished "
        "or truncated save and refused; to serve without backends, set `gateway.allow_no_backends: true`"
    )


def test_removing_every_backend_applies_when_the_file_says_so_or_none_were_running() -> None:
    check_reload(parse_config(BASE), parse_config("gateway: {allow_no_backends: true}\n"))
    check_reload(parse_config(""), parse_config(""))
    check_reload(parse_config(BASE), parse_config("wiki: {enabled: false}\n"))  # a disabled backend is declared
