"""federation.yaml -> frozen models: the full example parses, and every error names the file, the key path and the
line. Text is parsed with ``parse_config(text, file=..., env=...)`` so no test reads or writes ``os.environ``."""

from __future__ import annotations

import json
import string
import textwrap
from pathlib import Path
from typing import Any

import pydantic
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from gateway.config import (
    Adapter,
    AdapterTool,
    AuditSettings,
    ConfigProblems,
    ExitCodes,
    Federation,
    GatewaySettings,
    HttpServer,
    Listen,
    Naming,
    Route,
    SseServer,
    StdioServer,
    ToolFilter,
    Variant,
    Wiki,
    load_config,
    parse_config,
)
from gateway.errors import ConfigError
from tests.fixtures import FIXTURES

FULL = FIXTURES / "federation_full.yaml"
FILE = "conf/federation.yaml"


def yaml_text(text: str) -> str:
    return textwrap.dedent(text).lstrip("\n")


def line_of(text: str, needle: str, nth: int = 1) -> int:
    """The 1-based line of the ``nth`` line containing ``needle``."""
    hits = [number for number, line in enumerate(text.splitlines(), start=1) if needle in line]
    return hits[nth - 1]


def config_error(text: str, env: dict[str, str] | None = None, file: str = FILE) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        parse_config(text, file=file, env=env or {})
    return info.value


def assert_names(err: ConfigError, key_path: str, line: int | None, *, file: str = FILE) -> None:
    assert (err.file, err.key_path, err.line) == (file, key_path, line), repr(err)
    where = file + (f":{line}" if line is not None else "") + (f": {key_path}" if key_path else "")
    assert str(err).startswith(f"{where}: "), str(err)


STDIO = """
servers:
  mem:
    transport: stdio
    command: npx
"""


# ----------------------------------------------------------------------------------------------- the happy path


def test_the_design_example_parses_into_typed_frozen_models(tmp_path: Path) -> None:
    file = tmp_path / "federation.yaml"
    fed = parse_config(FULL.read_text(), file=str(file), env={"QMD_TOKEN": "tok-123"})

    assert fed.source == str(file)
    assert fed.gateway.name == "knowledge-gateway"
    assert (fed.gateway.listen.host, fed.gateway.listen.port) == ("127.0.0.1", 8080)
    assert (fed.gateway.naming.mode, fed.gateway.naming.separator) == ("conditional", "__")
    assert fed.gateway.allowed_hosts == ("gateway.internal",)
    assert fed.gateway.router_note is not None and "wiki_index (cheap)" in fed.gateway.router_note

    qmd_mcp = fed.servers["qmd-mcp"]
    assert isinstance(qmd_mcp, HttpServer)
    assert qmd_mcp.headers == {"Authorization": "Bearer tok-123"}
    assert (qmd_mcp.enabled, qmd_mcp.disabled_reason) == (
        False,
        "HTTP transport returns an error page rather than a valid handshake",
    )
    memory = fed.servers["memory"]
    assert isinstance(memory, StdioServer)
    assert memory.args == ("-y", "@modelcontextprotocol/server-memory")
    assert memory.timeout_s == 30
    assert memory.tools.include == ("search_nodes", "open_nodes")
    assert memory.tools.rename == {"search_nodes": "memory_recall"}
    events = fed.servers["events"]
    assert isinstance(events, SseServer)
    assert events.url == "http://127.0.0.1:9000/sse"

    search = fed.adapters["qmd"].tools["files_search"]
    assert isinstance(search, AdapterTool)
    assert search.router is True
    assert search.switch == "mode"
    assert search.variants["deep"].argv == ("query", "{query}", "-n", "{limit}", "--json")
    assert search.variants["keyword"].timeout_s == 15
    assert search.ladder == {"deep": "vector", "vector": "keyword"}
    assert search.output == "json_array"
    assert search.audit == {"query": 100, "mode": 0}
    assert fed.adapters["qmd"].max_output_bytes == 52428800

    assert fed.wiki is not None
    assert fed.wiki.tools == ("wiki_index", "files_read", "files_neighbors", "wiki_read_all")
    assert [step.provider for step in fed.routes["files_search"].providers] == ["qmd-mcp/query", "qmd/files_search"]
    recall = fed.routes["recall"]
    assert recall.providers[0].arguments == {"query": "{question}"}
    assert (recall.schema_from, recall.audit) == ("memory/search_nodes", {"question": 50})
    assert [*fed.servers, *fed.adapters, fed.wiki.name] == ["qmd-mcp", "memory", "events", "qmd", "wiki"]

    with pytest.raises(pydantic.ValidationError):
        fed.gateway.listen.port = 1


def test_an_empty_or_comment_only_file_gives_the_defaults() -> None:
    fed = parse_config("# nothing configured yet\n", file=FILE, env={})
    assert fed.servers == {} and fed.adapters == {} and fed.routes == {} and fed.wiki is None
    assert (fed.gateway.listen.host, fed.gateway.listen.port) == ("127.0.0.1", 8080)
    assert fed.gateway.naming.mode == "conditional"


def test_env_references_are_replaced_and_a_default_applies_only_when_the_variable_is_unset() -> None:
    text = yaml_text(
        """
        servers:
          web:
            transport: streamable_http
            url: "${WEB_URL:-http://127.0.0.1:9/mcp}"
            headers: {Authorization: "Bearer ${TOKEN}", X-Empty: "${EMPTY:-}"}
            timeout_s: ${TIMEOUT:-12.5}
        """
    )
    fed = parse_config(text, file=FILE, env={"TOKEN": "abc"})
    web = fed.servers["web"]
    assert isinstance(web, HttpServer)
    assert web.url == "http://127.0.0.1:9/mcp"
    assert web.headers == {"Authorization": "Bearer abc", "X-Empty": ""}
    assert web.timeout_s == 12.5

    fed = parse_config(text, file=FILE, env={"TOKEN": "abc", "WEB_URL": "https://example.org/mcp", "EMPTY": "x"})
    web = fed.servers["web"]
    assert isinstance(web, HttpServer)
    assert web.url == "https://example.org/mcp"
    assert web.headers["X-Empty"] == "x"


def test_yaml_boolean_and_number_looking_keys_stay_the_text_written() -> None:
    text = yaml_text(
        STDIO
        + "    tools:\n"
        + "      rename: {off: lights_off, yes: confirm, on: turn_on, no: deny, null: nothing, 1: one, ~: tilde}\n"
        + "routes:\n"
        + "  yes: [mem/off]\n"
    )
    fed = parse_config(text, file=FILE, env={})
    assert list(fed.servers["mem"].tools.rename) == ["off", "yes", "on", "no", "null", "1", "~"]
    assert list(fed.routes) == ["yes"]


def test_relative_paths_resolve_against_the_config_files_folder(tmp_path: Path) -> None:
    text = yaml_text(
        """
        gateway:
          audit: {path: data/audit.db}
        servers:
          mem:
            transport: stdio
            command: npx
            cwd: ./servers/mem
          abs:
            transport: stdio
            command: npx
            cwd: /srv/abs
        adapters:
          qmd:
            command: qmd
            cwd: tools
            tools:
              search: {argv: [search, "{query}"]}
        wiki:
          root: ../docs
        """
    )
    folder = tmp_path / "conf"
    fed = parse_config(text, file=str(folder / "federation.yaml"), env={})
    assert fed.gateway.audit.path == str(folder / "data" / "audit.db")
    assert fed.servers["mem"].cwd == str(folder / "servers" / "mem")  # type: ignore[union-attr]
    assert fed.servers["abs"].cwd == "/srv/abs"  # type: ignore[union-attr]
    assert fed.adapters["qmd"].cwd == str(folder / "tools")
    assert fed.wiki is not None
    assert Path(fed.wiki.root).resolve() == (tmp_path / "docs").resolve()
    assert Path(fed.wiki.root).is_absolute()


def test_load_config_reads_the_file_and_resolves_paths_against_its_folder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("QMD_TOKEN", "from-env")
    file = tmp_path / "federation.yaml"
    file.write_text(FULL.read_text())
    fed = load_config(file)
    assert fed.source == str(file)
    assert fed.servers["qmd-mcp"].headers == {"Authorization": "Bearer from-env"}  # type: ignore[union-attr]
    assert fed.wiki is not None and fed.wiki.root == str(tmp_path / "docs")
    assert fed.gateway.audit.path == str(tmp_path / "audit.db")
    assert fed.servers["memory"].cwd == str(tmp_path / "servers" / "memory")  # type: ignore[union-attr]


def test_load_config_on_a_missing_file_names_the_file(tmp_path: Path) -> None:
    missing = tmp_path / "nope" / "federation.yaml"
    with pytest.raises(ConfigError) as info:
        load_config(missing)
    assert info.value.file == str(missing)
    assert "not found" in info.value.message
    assert str(missing) in str(info.value)


def test_a_missing_relative_file_says_which_folder_it_was_looked_for_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # `gateway audit tail` run outside the project said only "federation.yaml: file not found".
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError) as info:
        load_config("federation.yaml")
    assert str(info.value) == f"federation.yaml: file not found (looked for in {tmp_path}, the current folder)"


# ----------------------------------------------------------------------------------------------- errors


def test_a_yaml_syntax_error_names_the_file_and_the_line() -> None:
    text = yaml_text(
        """
        gateway:
          name: g
         listen: {port: 1}
        """
    )
    err = config_error(text)
    assert err.line == line_of(text, "listen")
    assert err.key_path == ""
    assert "YAML syntax error" in err.message
    assert str(err).startswith(f"{FILE}:{err.line}: ")


def test_an_unclosed_flow_mapping_is_a_syntax_error_with_a_line() -> None:
    err = config_error("gateway: {name: g\nservers: {}\n")
    assert err.line is not None and err.line >= 1
    assert "YAML syntax error" in err.message


def test_a_top_level_that_is_not_a_mapping_is_refused() -> None:
    assert_names(config_error("- servers\n- adapters\n"), "", 1)


@pytest.mark.parametrize(
    ("text", "key_path", "needle"),
    [
        ("versoin: 1\n", "versoin", "versoin"),
        ("gateway:\n  listen:\n    host: 127.0.0.1\n    prot: 80\n", "gateway.listen.prot", "prot"),
        (STDIO + "    tools:\n      bogus: 1\n", "servers.mem.tools.bogus", "bogus"),
        (STDIO + "    header: {a: b}\n", "servers.mem.header", "header"),
        (
            "adapters:\n  q:\n    command: q\n    tools:\n      t:\n        argv: [x]\n        timeout: 3\n",
            "adapters.q.tools.t.timeout",
            "timeout:",
        ),
        (
            "adapters:\n  q:\n    command: q\n    tools:\n      t:\n        switch: m\n        variants:\n"
            "          v: {argv: [x], thin_when: {empty: true, exit_contains: x}}\n",
            "adapters.q.tools.t.variants.v.thin_when.exit_contains",
            "exit_contains",
        ),
        ("wiki:\n  root: docs\n  tool: [a]\n", "wiki.tool", "tool:"),
        (STDIO + "routes:\n  r:\n    providers: [mem/a]\n    shema_from: mem/a\n", "routes.r.shema_from", "shema_from"),
    ],
)
def test_an_unknown_key_is_named_by_its_key_path_and_line(text: str, key_path: str, needle: str) -> None:
    text = yaml_text(text)
    err = config_error(text)
    assert_names(err, key_path, line_of(text, needle))
    assert "unknown key" in err.message


@pytest.mark.parametrize(
    ("text", "key_path", "needle", "got"),
    [
        (STDIO + "    timeout_s: fast\n", "servers.mem.timeout_s", "timeout_s", "'fast'"),
        ("gateway:\n  listen:\n    port: 70000\n", "gateway.listen.port", "port", "70000"),
        (STDIO + "    args: npx-args\n", "servers.mem.args", "args", "'npx-args'"),
        ("gateway:\n  naming: {mode: sometimes}\n", "gateway.naming.mode", "naming", "'sometimes'"),
        ("version: 2\n", "version", "version", "2"),
        ("exposure:\n  mode: sometimes\n", "exposure.mode", "mode", "'sometimes'"),
        ("exposure:\n  clients: {cursor: hidden}\n", "exposure.clients.cursor", "clients", "'hidden'"),
    ],
)
def test_a_value_of_the_wrong_type_is_named_with_what_was_given(
    text: str, key_path: str, needle: str, got: str
) -> None:
    text = yaml_text(text)
    err = config_error(text)
    assert_names(err, key_path, line_of(text, needle))
    assert f"(got {got})" in err.message


def test_a_missing_required_key_is_named_and_points_at_its_parent() -> None:
    text = yaml_text(
        """
        servers:
          mem:
            transport: stdio
            args: [x]
        """
    )
    err = config_error(text)
    assert_names(err, "servers.mem.command", line_of(text, "mem:"))
    assert "missing" in err.message

    text = yaml_text("adapters:\n  qmd:\n    command: qmd\n")
    assert_names(config_error(text), "adapters.qmd.tools", line_of(text, "qmd:"))


def test_an_unknown_transport_names_the_transport_key_and_the_allowed_tags() -> None:
    text = yaml_text(
        """
        servers:
          mem:
            command: npx
            transport: carrier_pigeon
        """
    )
    err = config_error(text)
    assert_names(err, "servers.mem.transport", line_of(text, "transport"))
    assert "carrier_pigeon" in err.message
    for tag in ("stdio", "streamable_http", "sse"):
        assert tag in err.message


def test_a_server_without_a_transport_names_the_transport_key() -> None:
    text = yaml_text("servers:\n  mem:\n    command: npx\n")
    err = config_error(text)
    assert_names(err, "servers.mem.transport", line_of(text, "mem:"))


@pytest.mark.parametrize(
    ("text", "key_path", "needle", "meant"),
    [
        (
            "servers:\n  mem:\n    transprot: stdio\n    command: npx\n",
            "servers.mem.transprot",
            "transprot",
            "transport",
        ),
        ("servers:\n  mem:\n    transport: stdio\n    comand: npx\n", "servers.mem.comand", "comand", "command"),
        ("adapters:\n  qmd:\n    comand: qmd\n    tools: {}\n", "adapters.qmd.comand", "comand", "command"),
    ],
)
def test_a_misspelt_required_key_is_named_where_it_is_written_with_the_key_it_resembles(
    text: str, key_path: str, needle: str, meant: str
) -> None:
    # "required key is missing" at the parent's line would send the reader looking for a key that is right there,
    # misspelt: the error names the misspelt key, its line, and the key it resembles.
    err = config_error(text)
    assert_names(err, key_path, line_of(text, needle))
    assert err.message == f"unknown key (not part of the federation.yaml schema; did you mean `{meant}`?)"


def test_a_missing_required_key_beside_an_unrelated_unknown_key_is_still_named_missing() -> None:
    text = yaml_text("servers:\n  mem:\n    transport: stdio\n    args: [x]\n")
    err = config_error(text)
    assert_names(err, "servers.mem.command", line_of(text, "mem:"))
    assert err.message == "required key is missing"


def test_a_config_error_never_echoes_an_interpolated_secret() -> None:
    text = yaml_text(
        """
        servers:
          web:
            transport: htttp
            url: http://127.0.0.1:1/mcp
            headers: {Authorization: "Bearer ${TOKEN}"}
        """
    )
    err = config_error(text, env={"TOKEN": "s3cr3t-bearer-value"})
    assert err.key_path == "servers.web.transport"
    assert "s3cr3t-bearer-value" not in str(err)


DS_TOKEN = "ds-7f3a9c2e-4b1d-SECRET"


@pytest.mark.parametrize(
    ("text", "key_path", "written"),
    [
        (STDIO + "    timeout_s: ${DS_TOKEN}\n", "servers.mem.timeout_s", "(got '${DS_TOKEN}')"),
        (STDIO + "    session: ${DS_TOKEN}\n", "servers.mem.session", "(got '${DS_TOKEN}')"),
        ("servers:\n  web:\n    transport: ${DS_TOKEN}\n", "servers.web.transport", "'${DS_TOKEN}'"),
        ("servers:\n  web:\n    transport: sse\n    url: ${DS_TOKEN}\n", "servers.web.url", "'${DS_TOKEN}'"),
        ("servers:\n  web:\n    transport: sse\n    url: x${DS_TOKEN}\n", "servers.web.url", "'x${DS_TOKEN}'"),
        ("gateway:\n  naming: {mode: '${DS_TOKEN}'}\n", "gateway.naming.mode", "'${DS_TOKEN}'"),
        ("gateway:\n  listen: {port: '${DS_TOKEN}'}\n", "gateway.listen.port", "'${DS_TOKEN}'"),
        (STDIO + "    tools: {rename: {a: '${DS_TOKEN}!'}}\n", "servers.mem.tools.rename", "'${DS_TOKEN}!'"),
        ("routes:\n  r: ['${DS_TOKEN}/search']\n", "routes.r", "backend '${DS_TOKEN}'"),
    ],
    ids=["number", "enum", "transport", "url", "url-part", "mode", "port", "tool-name", "route"],
)
def test_a_config_error_shows_an_expanded_value_as_the_variable_written(text: str, key_path: str, written: str) -> None:
    err = config_error(yaml_text(text), env={"DS_TOKEN": DS_TOKEN})
    assert err.key_path == key_path
    assert DS_TOKEN not in str(err) and DS_TOKEN not in repr(err)
    assert "ds-7f3a9c2e" not in err.message
    assert written in err.message, err.message


SAME = "same-value-in-two-variables"
USES_A = "servers:\n  web:\n    transport: sse\n    url: http://127.0.0.1:1/sse\n    headers: {X-Key: '${A}'}\n"


@pytest.mark.parametrize(
    ("text", "key_path", "written"),
    [
        (
            USES_A + "  mem:\n    transport: stdio\n    command: x\n    timeout_s: ${B}\n",
            "servers.mem.timeout_s",
            "(got '${B}')",
        ),
        (USES_A + "  other:\n    transport: ${B}\n", "servers.other.transport", "(got '${B}')"),
        (USES_A + "routes:\n  r: ['${B}/search']\n", "routes.r", "backend '${B}'"),
    ],
    ids=["number", "transport", "route"],
)
def test_a_value_two_variables_hold_is_shown_as_the_variable_written_at_that_key(
    text: str, key_path: str, written: str
) -> None:
    # ${A} and ${B} hold the same text; the error at the key that wrote ${B} once quoted ${A}, the first one read.
    err = config_error(text, env={"A": SAME, "B": SAME})
    assert err.key_path == key_path
    assert SAME not in str(err)
    assert written in err.message, err.message
    assert "${A}" not in err.message, err.message


def test_a_value_two_variables_hold_echoed_away_from_its_key_names_both() -> None:
    from gateway.config.interpolation import Expansions

    expansions = Expansions()
    expansions.add(SAME, "${A}", ("servers", "web", "url"))
    expansions.add(SAME, "${B}", ("servers", "mem", "command"))
    assert expansions.redact(f"'{SAME}' twice", at="routes.r") == "'${A} or ${B}' twice"
    assert expansions.redact(f"'{SAME}' twice", at="servers.mem") == "'${B}' twice"


def test_a_short_expanded_value_is_shown_as_written_without_masking_the_rest_of_the_message() -> None:
    err = config_error(STDIO + "    timeout_s: '${N}'\n", env={"N": "0"})
    assert err.message == "must be greater than 0 (got '${N}')"
    err = config_error("servers:\n  web:\n    transport: '${T}'\n", env={"T": "s"})
    assert err.message == "unknown transport: use one of stdio, streamable_http, sse (got '${T}')", err.message


def test_a_missing_env_variable_names_the_key_that_references_it() -> None:
    text = yaml_text(
        """
        servers:
          web:
            transport: streamable_http
            url: http://127.0.0.1:1/mcp
            headers:
              Authorization: "Bearer ${QMD_TOKEN}"
        """
    )
    err = config_error(text)
    assert_names(err, "servers.web.headers.Authorization", line_of(text, "Authorization"))
    assert "QMD_TOKEN" in err.message


def test_a_missing_env_variable_in_a_list_names_the_item() -> None:
    text = yaml_text(STDIO + "    args:\n      - -y\n      - ${PKG}\n")
    err = config_error(text)
    assert_names(err, "servers.mem.args.1", line_of(text, "${PKG}"))


def test_a_duplicate_key_is_refused_at_its_second_line() -> None:
    text = yaml_text(
        """
        gateway:
          name: first
          name: second
        """
    )
    err = config_error(text)
    assert err.line == line_of(text, "name: second")
    assert "duplicate key 'name'" in err.message
    assert str(err).startswith(f"{FILE}:{err.line}")


def test_a_duplicate_key_is_named_by_its_key_path() -> None:
    err = config_error(yaml_text("gateway:\n  name: first\n  name: second\n"))
    assert err.key_path == "gateway.name"


@pytest.mark.parametrize(
    "target",
    ["a" * 65, "has space", "slash/name", "", "ünïcode"],
)
def test_an_invalid_rename_target_is_refused(target: str) -> None:
    text = yaml_text(STDIO + "    tools:\n      rename:\n        search: " + json.dumps(target) + "\n")
    err = config_error(text)
    assert_names(err, "servers.mem.tools.rename", line_of(text, "rename"))
    assert repr(target) in err.message


def test_a_rename_target_of_exactly_64_characters_is_accepted() -> None:
    text = yaml_text(STDIO + "    tools:\n      rename: {search: " + "a" * 64 + "}\n")
    assert parse_config(text, file=FILE, env={}).servers["mem"].tools.rename == {"search": "a" * 64}


LADDER = """
adapters:
  qmd:
    command: qmd
    tools:
      search:
        switch: mode
        variants:
          deep: {argv: [query, "{q}"]}
          vector: {argv: [vsearch, "{q}"]}
          keyword: {argv: [search, "{q}"]}
"""


def test_a_ladder_naming_an_unknown_variant_is_refused() -> None:
    text = yaml_text(LADDER + "        ladder: {deep: vector, vector: fuzzy}\n")
    err = config_error(text)
    assert_names(err, "adapters.qmd.tools.search", line_of(text, "search:"))
    assert "'fuzzy'" in err.message


def test_a_ladder_that_loops_is_refused() -> None:
    text = yaml_text(LADDER + "        ladder: {deep: vector, vector: keyword, keyword: deep}\n")
    err = config_error(text)
    assert_names(err, "adapters.qmd.tools.search", line_of(text, "search:"))
    assert "loops" in err.message


def test_a_ladder_that_ends_on_a_floor_is_accepted() -> None:
    text = yaml_text(LADDER + "        ladder: {deep: vector, vector: keyword}\n")
    tool = parse_config(text, file=FILE, env={}).adapters["qmd"].tools["search"]
    assert tool.ladder == {"deep": "vector", "vector": "keyword"}


def test_thin_when_on_a_tool_with_variants_is_refused_not_ignored() -> None:
    text = yaml_text(LADDER + "        thin_when: {empty: true}\n")
    err = config_error(text)
    assert_names(err, "adapters.qmd.tools.search", line_of(text, "search:"))
    assert "`thin_when` on each variant" in err.message


def test_thin_when_and_thin_exit_codes_on_a_tool_without_variants_are_read() -> None:
    text = yaml_text(
        'adapters:\n  g:\n    command: g\n    tools:\n      path:\n        argv: [path, "{a}"]\n'
        "        exit_codes: {ok: [0], thin: [3, 4]}\n"
        "        thin_when: {empty: false, stdout_contains: No path found}\n"
    )
    tool = parse_config(text, file=FILE, env={}).adapters["g"].tools["path"]
    assert tool.exit_codes.thin == (3, 4)
    assert tool.thin_when is not None and tool.thin_when.stdout_contains == "No path found"


def test_rewrite_rules_are_read_in_order_and_a_bad_one_is_refused_at_its_key() -> None:
    tool = "adapters:\n  g:\n    command: g\n    tools:\n      q:\n        argv: [q]\n"
    text = yaml_text(tool + "        rewrite:\n          - {pattern: 'token_budget=(\\d+)', replace: 'budget=\\1'}\n")
    (rule,) = parse_config(text, file=FILE, env={}).adapters["g"].tools["q"].rewrite
    assert (rule.pattern, rule.replace) == (r"token_budget=(\d+)", r"budget=\1")
    broken = yaml_text(tool + "        rewrite: [{pattern: '(unclosed'}]\n")
    err = config_error(broken)
    assert_names(err, "adapters.g.tools.q.rewrite.0.pattern", line_of(broken, "rewrite:"))
    assert "'(unclosed' is not a regular expression" in err.message
    parsed = yaml_text(tool + "        output: json\n        rewrite: [{pattern: x}]\n")
    assert "`rewrite` applies to `output: text` only" in config_error(parsed).message


def test_an_adapter_tool_needs_argv_or_a_switch() -> None:
    text = yaml_text("adapters:\n  qmd:\n    command: qmd\n    tools:\n      search: {timeout_s: 3}\n")
    err = config_error(text)
    assert_names(err, "adapters.qmd.tools.search", line_of(text, "search"))
    assert "argv" in err.message


def test_a_route_naming_an_undeclared_backend_is_refused() -> None:
    text = yaml_text(STDIO + "routes:\n  find: [mem/search, ghost/search]\n")
    err = config_error(text)
    assert "'find'" in err.message and "'ghost'" in err.message
    assert err.file == FILE


def test_a_route_naming_an_undeclared_backend_is_named_by_its_key_path_and_line() -> None:
    text = yaml_text(STDIO + "routes:\n  find: [mem/search, ghost/search]\n")
    assert_names(config_error(text), "routes.find", line_of(text, "find:"))


@pytest.mark.parametrize(
    "text",
    [
        STDIO + "adapters:\n  mem:\n    command: x\n    tools: {}\n",
        STDIO + "  wiki:\n    transport: stdio\n    command: x\nwiki: {root: docs}\n",
        "adapters:\n  docs:\n    command: x\n    tools: {}\nwiki: {name: docs, root: docs}\n",
    ],
)
def test_backend_names_must_be_unique_across_servers_adapters_and_wiki(text: str) -> None:
    err = config_error(yaml_text(text))
    assert "unique" in err.message
    assert err.file == FILE


def test_a_duplicate_backend_name_is_named_by_its_key_path_and_line() -> None:
    text = yaml_text(STDIO + "adapters:\n  mem:\n    command: x\n    tools: {}\n")
    assert_names(config_error(text), "adapters.mem", line_of(text, "mem:", nth=2))


def test_a_top_level_source_key_is_an_unknown_key() -> None:
    text = "source: elsewhere.yaml\n"
    err = config_error(text)
    assert_names(err, "source", 1)


def test_every_problem_of_a_file_is_reported_in_one_run_in_the_order_of_the_file() -> None:
    text = yaml_text(
        """
        gateway:
          listen: {port: 70000}
        servers:
          web:
            transport: streamable_http
            url: http://127.0.0.1:1/mcp
            headers: {Authorization: "Bearer ${TOKEN}"}
          mem:
            transport: stdio
            command: npx
            bogus: 1
            timeout_s: fast
        """
    )
    err = config_error(text)
    assert isinstance(err, ConfigProblems)
    found = [(p.key_path, p.line) for p in err.problems]
    assert found == [
        ("gateway.listen.port", line_of(text, "port")),
        ("servers.web.headers.Authorization", line_of(text, "Authorization")),
        ("servers.mem.bogus", line_of(text, "bogus")),
        ("servers.mem.timeout_s", line_of(text, "timeout_s")),
    ]
    assert_names(err, "gateway.listen.port", line_of(text, "port"))  # it reads as the first
    assert str(err).splitlines() == [str(p) for p in err.problems]
    assert "environment variable TOKEN is not set" in err.problems[1].message


def test_every_reference_that_does_not_resolve_is_reported_in_one_run() -> None:
    text = yaml_text(
        STDIO
        + "adapters:\n  mem:\n    command: x\n    tools: {}\n"
        + "routes:\n  find: [ghost/search]\n"
        + "policies:\n  readers: {backends: {include: [nowhere]}}\n"
    )
    err = config_error(text)
    assert isinstance(err, ConfigProblems)
    assert [(p.key_path, p.line) for p in err.problems] == [
        ("adapters.mem", line_of(text, "mem:", nth=2)),
        ("routes.find", line_of(text, "find:")),
        ("policies.readers.backends", line_of(text, "readers")),
    ]


def test_every_key_given_twice_is_reported_in_one_run() -> None:
    text = yaml_text("gateway:\n  name: a\n  name: b\nservers: {}\nservers: {}\n")
    err = config_error(text)
    assert isinstance(err, ConfigProblems)
    assert [(p.key_path, p.line) for p in err.problems] == [("gateway.name", 3), ("servers", 5)]


@pytest.mark.parametrize(
    ("text", "key_path"),
    [
        (STDIO + "    timeout_s: ${SLOW}\n", "servers.mem.timeout_s"),
        (STDIO + "routes:\n  r: ['${SLOW}/search']\n", "routes.r.0"),
    ],
    ids=["a-value", "a-reference"],
)
def test_a_value_whose_variable_is_not_set_is_reported_once_as_the_missing_variable(text: str, key_path: str) -> None:
    err = config_error(text)
    assert not isinstance(err, ConfigProblems)
    assert (err.key_path, err.message) == (key_path, "environment variable SLOW is not set (referenced as ${SLOW})")


# ----------------------------------------------------------------------------------------------- property


MODEL_MAPPINGS: dict[tuple[str, ...], type[pydantic.BaseModel]] = {
    (): Federation,
    ("gateway",): GatewaySettings,
    ("gateway", "listen"): Listen,
    ("gateway", "naming"): Naming,
    ("gateway", "audit"): AuditSettings,
    ("servers", "mem"): StdioServer,
    ("servers", "mem", "tools"): ToolFilter,
    ("servers", "web"): HttpServer,
    ("adapters", "qmd"): Adapter,
    ("adapters", "qmd", "tools", "search"): AdapterTool,
    ("adapters", "qmd", "tools", "search", "variants", "fast"): Variant,
    ("adapters", "qmd", "tools", "search", "exit_codes"): ExitCodes,
    ("wiki",): Wiki,
    ("routes", "find"): Route,
}
"""Every mapping of the property's base document that is a model (free-form mappings such as ``env`` take any key)."""


def base_document() -> dict[str, Any]:
    return {
        "version": 1,
        "gateway": {
            "name": "g",
            "listen": {"host": "127.0.0.1", "port": 8080},
            "naming": {"mode": "always", "separator": "__"},
            "audit": {"path": "a.db"},
        },
        "servers": {
            "mem": {"transport": "stdio", "command": "npx", "tools": {"include": ["a"], "rename": {"a": "b"}}},
            "web": {"transport": "streamable_http", "url": "http://127.0.0.1:1/mcp"},
        },
        "adapters": {
            "qmd": {
                "command": "qmd",
                "tools": {
                    "search": {
                        "switch": "mode",
                        "variants": {"fast": {"argv": ["s", "{q}"], "timeout_s": 3}},
                        "exit_codes": {"ok": [0]},
                    }
                },
            }
        },
        "wiki": {"root": "docs"},
        "routes": {"find": {"providers": ["mem/a"], "description": "d"}},
    }


def emit(doc: dict[str, Any], comments: int) -> tuple[str, dict[tuple[str, ...], int]]:
    """Block-style YAML written by hand (independent of the loader), with the line of every key."""
    lines = ["# federation.yaml"] * comments
    where: dict[tuple[str, ...], int] = {}

    def walk(mapping: dict[str, Any], path: tuple[str, ...], indent: int) -> None:
        for key, value in mapping.items():
            where[(*path, key)] = len(lines) + 1
            if isinstance(value, dict) and value:
                lines.append(f"{' ' * indent}{key}:")
                walk(value, (*path, key), indent + 2)
            else:
                lines.append(f"{' ' * indent}{key}: {json.dumps(value)}")

    walk(doc, (), 0)
    return "\n".join(lines) + "\n", where


yaml_keys = st.one_of(
    st.from_regex(r"[A-Za-z_][A-Za-z0-9_-]{0,12}", fullmatch=True),
    st.sampled_from(["off", "on", "yes", "no", "y", "n", "true", "null", "1", "0x1f", "3.5"]),
)
yaml_values = st.one_of(
    st.integers(-5, 5),
    st.booleans(),
    st.text(string.ascii_letters, max_size=6),
    st.dictionaries(st.sampled_from(["a", "b", "c"]), st.integers(0, 3), max_size=2),
    st.lists(st.integers(0, 3), max_size=2),
)


@given(
    where=st.sampled_from(sorted(MODEL_MAPPINGS)),
    key=yaml_keys,
    value=yaml_values,
    position=st.integers(0, 10),
    comments=st.integers(0, 3),
)
def test_any_unknown_key_anywhere_is_named_by_its_key_path_and_its_own_line(
    where: tuple[str, ...], key: str, value: Any, position: int, comments: int
) -> None:
    assume(key not in MODEL_MAPPINGS[where].model_fields)
    doc = base_document()
    parent = doc
    for part in where:
        parent = parent[part]
    items = list(parent.items())
    items.insert(min(position, len(items)), (key, value))
    parent.clear()
    parent.update(items)
    text, lines = emit(doc, comments)

    with pytest.raises(ConfigError) as info:
        parse_config(text, file=FILE, env={})
    err = info.value
    assert err.key_path == ".".join((*where, key)), repr(err)
    assert err.key_path.endswith(key)
    assert err.line == lines[(*where, key)], (repr(err), text)


def test_the_property_documents_parse_cleanly_without_an_unknown_key() -> None:
    text, _ = emit(base_document(), comments=0)
    fed = parse_config(text, file=FILE, env={})
    assert fed.routes["find"].description == "d"
    assert fed.adapters["qmd"].tools["search"].variants["fast"].argv == ("s", "{q}")


def test_env_values_written_as_relative_paths_resolve_against_the_files_folder() -> None:
    text = (
        "servers:\n  m: {transport: stdio, command: x, env: {A: ./.cache/m.jsonl, B: plain, C: /abs}}\n"
        "adapters:\n  q: {command: q, env: {X: ../up}, tools: {t: {argv: [a]}}}\n"
    )
    fed = parse_config(text, file="/srv/gw/federation.yaml", env={})
    assert fed.servers["m"].env == {"A": "/srv/gw/.cache/m.jsonl", "B": "plain", "C": "/abs"}
    assert fed.adapters["q"].env == {"X": "/srv/gw/../up"}


def test_exposure_defaults_to_listing_every_tool_and_its_search_and_call_tools_must_differ() -> None:
    assert parse_config("version: 1\n", file=FILE, env={}).exposure.mode == "all"
    text = "exposure:\n  search_tool: find\n  call_tool: find\n"
    err = config_error(text)
    assert_names(err, "exposure", line_of(text, "exposure"))
    assert "must differ" in err.message
    text = "exposure:\n  pinned: [ok, 'not a name']\n"
    err = config_error(text)
    assert_names(err, "exposure.pinned", line_of(text, "pinned"))
    assert "tool name 'not a name' is invalid" in err.message
