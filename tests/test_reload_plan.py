"""What an edit of federation.yaml changes: the reload plan, computed from two validated configurations."""

from __future__ import annotations

from gateway.config import parse_config
from gateway.reload import plan_reload

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
