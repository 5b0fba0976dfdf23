"""What a new user's mistakes in federation.yaml read like: every problem of the file in one run, each in plain words
(not pydantic's), with a guess at what was meant when a key, a transport or an enum value looks misspelt; and the
``${VAR}``s of a backend switched off are not required."""

from __future__ import annotations

import textwrap

import pytest

from gateway.config import ConfigProblems, parse_config
from gateway.config.interpolation import UNSET_STAND_IN
from gateway.errors import ConfigError

FILE = "federation.yaml"

NEW_USER = textwrap.dedent(
    """\
    version: 2
    gateway:
      naming: {mode: conditionl}
      listen: {port: 70000}
    server:
      memory: {transport: stdio, command: mcp-server-memory}
    servers:
      everything: {transport: stdoi, command: mcp-server-everything}
      time: {transport: stdio, comand: mcp-server-time}
      git: {transport: stdio, command: mcp-server-git, timeout_s: soon, enabeld: false}
      web: {transport: sse, url: 127.0.0.1:9000/sse}
      empty: {transport: stdio, command: ""}
    routes:
      find: {providers: []}
    """
)


MEANT_CONDITIONAL = "did you mean `conditional`?)"
GOT_STDOI = "(got 'stdoi'; did you mean `stdio`?)"


def test_every_mistake_of_a_file_is_reported_in_one_run_in_plain_words_with_a_guess() -> None:
    with pytest.raises(ConfigProblems) as caught:
        parse_config(NEW_USER, file=FILE, env={})
    said = [(p.line, p.key_path, p.message) for p in caught.value.problems]
    assert said == [
        (1, "version", "must be 1 (got 2)"),
        (3, "gateway.naming.mode", "must be one of never, conditional, always (got 'conditionl'; " + MEANT_CONDITIONAL),
        (4, "gateway.listen.port", "must be at most 65535 (got 70000)"),
        (5, "server", "unknown key (not part of the federation.yaml schema; did you mean `servers`?)"),
        (8, "servers.everything.transport", "unknown transport: use one of stdio, streamable_http, sse " + GOT_STDOI),
        (9, "servers.time.comand", "unknown key (not part of the federation.yaml schema; did you mean `command`?)"),
        (10, "servers.git.timeout_s", "must be a number (got 'soon')"),
        (10, "servers.git.enabeld", "unknown key (not part of the federation.yaml schema; did you mean `enabled`?)"),
        (11, "servers.web.url", "must be an http:// or https:// URL (got '127.0.0.1:9000/sse')"),
        (12, "servers.empty.command", "must not be empty (got '')"),
        (14, "routes.find.providers", "must have at least 1 item"),
    ]  # fmt: skip
    text = str(caught.value)
    assert "Input should" not in text and "String should" not in text and "Input tag" not in text


@pytest.mark.parametrize(
    ("written", "said"),
    [
        ("gateway:\n  audit: {retention_day: 3}\n", "did you mean `retention_days`?"),
        ("wiki:\n  roots: ./docs\n", "did you mean `root`?"),
        ("gateway:\n  naming: {mode: allways}\n", "did you mean `always`?"),
        ("gateway:\n  flavour: 1\n", "check its spelling"),  # nothing alike: no guess
    ],
)
def test_a_misspelt_key_or_value_anywhere_gets_the_nearest_allowed_one(written: str, said: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(written, file=FILE, env={})
    assert caught.value.message.endswith(f"{said})"), caught.value.message


def test_a_value_from_the_environment_is_neither_shown_nor_guessed_at() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config("servers:\n  a: {transport: '${T}', command: x}\n", file=FILE, env={"T": "stdoi"})
    assert caught.value.message == "unknown transport: use one of stdio, streamable_http, sse (got '${T}')"


SWITCHED_OFF = textwrap.dedent(
    """\
    servers:
      qmd-http:
        transport: streamable_http
        url: ${QMD_URL}
        headers: {Authorization: "Bearer ${QMD_TOKEN}"}
        enabled: false
        disabled_reason: "qmd's HTTP server is not started"
      tickets: {transport: stdio, command: "${TICKETS_BIN}", args: ["--token", "${TICKETS_TOKEN}"], enabled: no}
    adapters:
      search: {command: "${SEARCH_BIN}", enabled: false, tools: {s: {argv: [x]}}}
    wiki: {root: "${WIKI_ROOT}", enabled: false}
    """
)


def test_a_switched_off_backends_variables_need_not_be_set() -> None:
    fed = parse_config(SWITCHED_OFF, file=FILE, env={})
    http = fed.servers["qmd-http"]
    assert not http.enabled and http.disabled_reason == "qmd's HTTP server is not started"
    assert http.url == UNSET_STAND_IN  # `${QMD_URL}` as written is no URL: checked as a stand-in
    assert http.headers == {"Authorization": "Bearer ${QMD_TOKEN}"}  # as written where that passes
    assert fed.servers["tickets"].command == "${TICKETS_BIN}" and not fed.adapters["search"].enabled


def test_an_enabled_backends_variable_is_still_required_and_so_is_one_a_switched_off_value_cannot_do_without() -> None:
    slow = "  slow: {transport: stdio, command: x, timeout_s: '${SLOW_S}', enabled: false}\n"
    text = SWITCHED_OFF.replace("enabled: no", "enabled: yes").replace("servers:\n", "servers:\n" + slow, 1)
    with pytest.raises(ConfigProblems) as caught:
        parse_config(text, file=FILE, env={})
    said = [(p.key_path, p.message) for p in caught.value.problems]
    assert said == [
        (
            "servers.slow.timeout_s",
            "environment variable SLOW_S is not set (referenced as ${SLOW_S}) (its backend is switched off, but this "
            "value cannot be checked without it)",
        ),
        ("servers.tickets.command", "environment variable TICKETS_BIN is not set (referenced as ${TICKETS_BIN})"),
        ("servers.tickets.args.1", "environment variable TICKETS_TOKEN is not set (referenced as ${TICKETS_TOKEN})"),
    ]
