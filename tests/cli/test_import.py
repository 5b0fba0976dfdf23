"""``gateway import``: real client configs (tests/fixtures/client_configs/) become servers entries that validate under
the federation.yaml models, with secrets moved to ``${VAR}`` and everything else that could not be mapped reported.
The round trip runs the real command line: import, then ``gateway check`` on the result."""

from __future__ import annotations

import argparse
import io
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from gateway.cli.importer import Imported, add_import_subcommand, convert, parse_client_config, run_import
from gateway.config import Federation, HttpServer, SseServer, StdioServer, parse_config
from gateway.errors import ConfigError
from tests.fixtures import FIXTURES

CONFIGS = FIXTURES / "client_configs"
ECHO_SERVER = FIXTURES / "echo_server.py"
PYTHON = sys.executable

SECRETS = {  # the literal secrets in the fixtures: none of them may reach the YAML or the report
    "claude_desktop_config.json": ["BSAfake0123456789abcdefFAKE", "ghp_fakeFAKEfake0123456789abcdefFAKE"],
    "claude_code.mcp.json": ["lin_api_fakeFAKE0123456789"],
    "cursor_mcp.json": ["ctx7sk-fake-0123456789", "ntn_fakeFAKE0123456789"],
    "vscode_mcp.json": [],
}


def imported(name: str, fmt: str = "auto") -> Imported:
    path = CONFIGS / name
    return convert(parse_client_config(path.read_text(encoding="utf-8"), file=str(path)), fmt=fmt, source=name)


def federation(result: Imported) -> Federation:
    """The imported YAML as the gateway reads it, with every variable it needs set."""
    env = {variable.name: f"value-of-{variable.name}" for variable in result.variables}
    return parse_config(result.yaml, env=env)


def raw_servers(result: Imported) -> dict[str, Any]:
    servers: dict[str, Any] = yaml.safe_load(result.yaml)["servers"]
    return servers


def report(result: Imported) -> str:
    return "\n".join(result.report)


# ----------------------------------------------------------------------------------------------- the four clients


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_every_client_config_becomes_yaml_that_parses_under_the_federation_models(name: str) -> None:
    result = imported(name)
    fed = federation(result)
    assert list(fed.servers) == list(result.servers)
    for secret in SECRETS[name]:
        assert secret not in result.yaml
        assert secret not in report(result)
        assert all(secret not in variable.why for variable in result.variables)


@pytest.mark.parametrize("name", sorted(SECRETS))
def test_the_output_keeps_the_order_of_the_file_and_is_the_same_on_every_run(name: str) -> None:
    data = parse_client_config((CONFIGS / name).read_text(encoding="utf-8"))
    listed = data.get("mcpServers", data.get("servers"))
    first, second = imported(name), imported(name)
    assert first == second
    kept = [n for n in listed if n not in first.skipped]
    assert len(first.servers) == len(kept)
    positions = [first.yaml.index(f"\n  {server}:\n") for server in first.servers]
    assert positions == sorted(positions)


def test_claude_desktop_stdio_servers_keep_their_command_and_a_secret_env_value_becomes_a_variable() -> None:
    result = imported("claude_desktop_config.json")
    fed = federation(result)
    filesystem = fed.servers["filesystem"]
    assert isinstance(filesystem, StdioServer)
    assert filesystem.command == "npx"
    assert filesystem.args == (
        "-y",
        "@modelcontextprotocol/server-filesystem",
        "/Users/alice/Desktop",
        "/Users/alice/Downloads",
    )
    servers = raw_servers(result)
    assert servers["brave-search"]["env"] == {"BRAVE_API_KEY": "${BRAVE_API_KEY}"}
    assert servers["github-work"]["env"] == {
        "GITHUB_PERSONAL_ACCESS_TOKEN": "${GITHUB_PERSONAL_ACCESS_TOKEN}",
        "GITHUB_TOOLSETS": "repos,issues",  # not a secret: stays as written
    }
    assert [(v.name, v.secret) for v in result.variables] == [
        ("BRAVE_API_KEY", True),
        ("GITHUB_PERSONAL_ACCESS_TOKEN", True),
    ]


def test_claude_desktop_names_outside_the_backend_rule_are_renamed_and_other_top_level_keys_reported() -> None:
    result = imported("claude_desktop_config.json")
    assert result.servers == ("filesystem", "brave-search", "github-work")
    assert "server 'github (work)' renamed to 'github-work'" in report(result)
    assert "top-level keys ignored (not server definitions): globalShortcut" in report(result)


def test_claude_code_stdio_http_and_sse_entries_map_to_their_transports() -> None:
    result = imported("claude_code.mcp.json")
    fed = federation(result)
    assert isinstance(fed.servers["memory"], StdioServer)
    sentry, linear = fed.servers["sentry"], fed.servers["linear"]
    assert isinstance(sentry, HttpServer) and sentry.url == "https://mcp.sentry.dev/mcp"
    assert isinstance(linear, SseServer) and linear.url == "https://mcp.linear.app/sse"
    servers = raw_servers(result)
    assert servers["memory"]["env"] == {"MEMORY_FILE_PATH": "${MEMORY_DIR:-.}/memory.jsonl"}  # same syntax here
    assert servers["sentry"]["headers"] == {"Authorization": "Bearer ${SENTRY_AUTH_TOKEN}"}
    assert servers["linear"]["headers"] == {"X-Api-Key": "${LINEAR_X_API_KEY}"}
    assert {v.name: v.secret for v in result.variables} == {"SENTRY_AUTH_TOKEN": False, "LINEAR_X_API_KEY": True}


def test_claude_code_entries_of_a_transport_the_gateway_does_not_speak_are_skipped_and_reported() -> None:
    result = imported("claude_code.mcp.json")
    assert result.skipped == ("browser",)
    assert "server 'browser': type 'ws' is not a transport the gateway speaks" in report(result)


def test_cursor_url_entries_get_a_transport_by_their_url_and_env_references_become_ours() -> None:
    result = imported("cursor_mcp.json")
    fed = federation(result)
    assert isinstance(fed.servers["context7"], HttpServer)
    assert isinstance(fed.servers["playwright"], SseServer)
    servers = raw_servers(result)
    assert servers["notion"]["headers"] == {"Authorization": "Bearer ${NOTION_AUTHORIZATION}"}
    assert servers["context7"]["headers"] == {"CONTEXT7_API_KEY": "${CONTEXT7_API_KEY}"}
    assert servers["postgres"]["env"] == {"PGPASSWORD": "${PGPASSWORD}"}  # was ${env:PGPASSWORD}
    text = report(result)
    assert "server 'playwright': has a url but no type: assumed sse" in text
    assert "server 'notion': key 'autoApprove' ignored" in text
    assert "NOTION_AUTHORIZATION to the credential after 'Bearer'" in text


def test_vscode_inputs_become_variables_and_the_report_says_what_to_set() -> None:
    result = imported("vscode_mcp.json")
    fed = federation(result)
    github = fed.servers["github"]
    assert isinstance(github, HttpServer)
    assert github.headers == {"Authorization": "Bearer value-of-GITHUB_TOKEN"}
    assert raw_servers(result)["perplexity"]["env"] == {"PERPLEXITY_API_KEY": "${PERPLEXITY_KEY}"}
    text = report(result)
    assert "uses the VS Code input 'github-token' (GitHub Personal Access Token)" in text
    assert "set GITHUB_TOKEN in the gateway's environment" in text
    assert "VS Code input 'perplexity-key', not declared in inputs" in text
    assert {v.name: v.secret for v in result.variables} == {"GITHUB_TOKEN": True, "PERPLEXITY_KEY": True}


def test_vscode_env_file_and_dev_settings_are_reported_as_unmapped() -> None:
    result = imported("vscode_mcp.json")
    text = report(result)
    assert "server 'perplexity': envFile '${workspaceFolder}/.env' is not read by the gateway" in text
    assert "server 'fetch': key 'dev' ignored" in text
    assert "envFile" not in result.yaml and "dev" not in raw_servers(result)["fetch"]


def test_asking_for_the_other_format_names_the_missing_key() -> None:
    with pytest.raises(ConfigError, match='found no "servers" object'):
        imported("claude_desktop_config.json", fmt="vscode")


# ----------------------------------------------------------------------------------------------- the rules


def convert_servers(servers: dict[str, Any], key: str = "mcpServers") -> Imported:
    return convert({key: servers}, source="test.json")


def test_servers_started_by_a_package_runner_get_one_line_on_what_it_needs_from_the_environment() -> None:
    result = convert_servers(
        {
            "fs": {"command": "npx", "args": ["-y", "@modelcontextprotocol/server-filesystem", "/tmp"]},
            "memory": {"command": "/usr/local/bin/npx", "args": ["-y", "@modelcontextprotocol/server-memory"]},
            "time": {"command": "uvx", "args": ["mcp-server-time"]},
            "local": {"command": "node", "args": ["server.js"]},
        }
    )
    lines = [line for line in result.report if "fetches the server when it is not cached yet" in line]
    assert [line.split(" start")[0] for line in lines] == ["servers 'fs', 'memory'", "server 'time'"]
    assert "with npx," in lines[0] and "with uvx," in lines[1]
    assert all("NODE_EXTRA_CA_CERTS" in line and "pass_env" in line and "connect_timeout_s" in line for line in lines)


def test_names_are_sanitised_to_the_backend_rule_without_colliding() -> None:
    result = convert_servers(
        {
            "my server": {"command": "a"},
            "my-server": {"command": "b"},
            "ünïcode/name": {"command": "c"},
            "x" * 60: {"command": "d"},
            "!!!": {"command": "e"},
        }
    )
    assert result.servers == ("my-server-2", "my-server", "n-code-name", "x" * 48, "server")
    assert all(re.fullmatch(r"[A-Za-z0-9_-]{1,48}", name) for name in result.servers)
    assert report(result).count("renamed to") == 4
    federation(result)


def test_secret_flags_and_url_query_parameters_become_variables_but_switches_and_paths_do_not() -> None:
    result = convert_servers(
        {
            "srv": {
                "command": "srv",
                "args": [
                    "--api-key",
                    "sk-1",
                    "--no-auth",
                    "/data",
                    "--token=tok-2",
                    "--key-file",
                    "/k",
                    "--apiKey",
                    "k3",
                ],
            },
            "remote": {"type": "sse", "url": "https://h.example/sse?api_key=abc123&limit=5"},
        }
    )
    servers = raw_servers(result)
    assert servers["srv"]["args"] == [
        "--api-key",
        "${SRV_API_KEY}",
        "--no-auth",
        "/data",
        "--token=${SRV_TOKEN}",
        "--key-file",
        "/k",
        "--apiKey",
        "${SRV_APIKEY}",
    ]
    assert servers["remote"]["url"] == "https://h.example/sse?api_key=${REMOTE_API_KEY}&limit=5"
    for secret in ("sk-1", "tok-2", "k3", "abc123"):
        assert secret not in result.yaml and secret not in report(result)
    federation(result)


def test_the_same_secret_used_twice_shares_one_variable_and_different_ones_do_not() -> None:
    result = convert_servers(
        {
            "a": {"command": "a", "env": {"API_KEY": "same"}, "args": ["--api-key", "same"]},
            "b": {"type": "http", "url": "https://b.example/mcp", "headers": {"Authorization": "Token one"}},
            "b-other": {"type": "http", "url": "https://c.example/mcp", "headers": {"B_AUTHORIZATION": "two"}},
        }
    )
    servers = raw_servers(result)
    assert servers["a"]["env"] == {"API_KEY": "${A_API_KEY}"} and servers["a"]["args"] == ["--api-key", "${A_API_KEY}"]
    assert servers["b"]["headers"] == {"Authorization": "Token ${B_AUTHORIZATION}"}
    assert servers["b-other"]["headers"] == {"B_AUTHORIZATION": "${B_AUTHORIZATION_2}"}


def test_an_entry_that_does_not_validate_is_skipped_with_the_models_reason() -> None:
    result = convert_servers({"ftp": {"type": "http", "url": "ftp://example.com/mcp"}, "ok": {"command": "ok"}})
    assert result.servers == ("ok",) and result.skipped == ("ftp",)
    assert "server 'ftp': not a valid servers entry (url: must be an http:// or https:// URL" in report(result)


def test_entries_without_a_command_or_url_and_non_objects_are_skipped() -> None:
    result = convert_servers({"nothing": {"args": ["x"]}, "text": "npx foo", "stdio": {"type": "stdio"}})
    assert result.servers == () and result.skipped == ("nothing", "text", "stdio")
    text = report(result)
    assert "server 'nothing': has neither command nor url; skipped" in text
    assert "server 'text': is not an object; skipped" in text
    assert "server 'stdio': has no command; skipped" in text
    assert yaml.safe_load(result.yaml) == {"servers": {}}


def test_disabled_entries_stay_declared_but_disabled_with_a_reason() -> None:
    fed = federation(convert_servers({"off": {"command": "x", "disabled": True}}))
    assert fed.servers["off"].enabled is False
    assert fed.servers["off"].disabled_reason == "disabled in test.json"


def test_vscode_predefined_variables_become_environment_references_or_are_reported() -> None:
    result = convert_servers(
        {"s": {"type": "stdio", "command": "${userHome}/bin/s", "cwd": "${workspaceFolder}", "args": ["${cwd:x}"]}},
        key="servers",
    )
    servers = raw_servers(result)
    assert servers["s"]["command"] == "${HOME}/bin/s"
    assert servers["s"]["cwd"] == "${WORKSPACE_FOLDER}"
    assert servers["s"]["args"] == ["${CWD_X}"]
    assert {v.name for v in result.variables} == {"WORKSPACE_FOLDER", "CWD_X"}
    assert "set WORKSPACE_FOLDER to the project folder" in report(result)


def test_a_vscode_settings_file_with_an_mcp_section_is_read() -> None:
    result = convert({"editor.fontSize": 13, "mcp": {"servers": {"a": {"type": "stdio", "command": "a"}}}})
    assert result.servers == ("a",) and result.report == ()


def test_jsonc_comments_and_trailing_commas_are_allowed_and_strings_are_left_alone() -> None:
    text = '{\n  // a comment\n  "servers": {"a": {"url": "https://h.example//x/*y*/", /* c */ "type": "http",},},\n}\n'
    data = parse_client_config(text)
    assert data == {"servers": {"a": {"url": "https://h.example//x/*y*/", "type": "http"}}}


def test_invalid_json_names_the_file_the_line_and_the_column() -> None:
    with pytest.raises(ConfigError) as caught:
        parse_client_config('{\n  "mcpServers": {\n    "a": {"command": "x"}\n    "b": {}\n  }\n}\n', file="c.json")
    assert caught.value.line == 4
    assert str(caught.value) == "c.json:4: invalid JSON: unexpected '\"' (line 4, column 5)"


@pytest.mark.parametrize(
    ("text", "line", "message"),
    [
        ("", 1, "invalid JSON: the file is empty"),
        ('{"servers": {}}\n\n/* never closed', 3, "unexpected end of input (line 3, column 16)"),  # a comment left open
        ('{\n  // a comment\n  "servers": {"a": [1, 2,, 3]}\n}', 3, "unexpected ',' (line 3, column 26)"),
        ("[" * 100_000, None, "invalid JSON: nested too deeply"),
    ],
)
def test_broken_jsonc_is_refused_with_its_line(text: str, line: int | None, message: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_client_config(text, file="c.json")
    assert caught.value.file == "c.json" and caught.value.line == line
    assert message in str(caught.value)


def test_json_that_is_not_a_client_config_is_refused() -> None:
    with pytest.raises(ConfigError, match='found no "mcpServers"'):
        convert({"something": {}})
    with pytest.raises(ConfigError, match="the top level must be a JSON object"):
        convert([1, 2])
    with pytest.raises(ConfigError, match="must be an object mapping server names"):
        convert({"mcpServers": []})


# ----------------------------------------------------------------------------------------------- the command


def gateway(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [PYTHON, "-m", "gateway", *args], cwd=cwd, capture_output=True, text=True, timeout=60, env=env
    )


@pytest.mark.spawns
def test_import_prints_yaml_on_stdout_and_the_report_on_stderr_without_any_federation_file(tmp_path: Path) -> None:
    done = gateway("import", str(CONFIGS / "cursor_mcp.json"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout == imported("cursor_mcp.json").yaml
    assert "import: server 'notion': key 'autoApprove' ignored" in done.stderr
    assert "import: 4 server(s) imported" in done.stderr
    assert "NOTION_AUTHORIZATION" in done.stderr and "ntn_fake" not in done.stderr + done.stdout
    assert not (tmp_path / "federation.yaml").exists()


def run_import_here(*argv: str) -> tuple[int, str, str]:
    """``gateway import ARGV`` in this process, parsed by the same subparser the CLI mounts."""
    parser = argparse.ArgumentParser(prog="gateway")
    add_import_subcommand(parser.add_subparsers(dest="command"))
    out, err = io.StringIO(), io.StringIO()
    code = run_import(parser.parse_args(["import", *argv]), stdout=out, stderr=err)
    return code, out.getvalue(), err.getvalue()


def test_import_exits_0_with_warnings_when_entries_were_skipped() -> None:
    code, out, err = run_import_here(str(CONFIGS / "claude_code.mcp.json"))
    assert code == 0
    assert out == imported("claude_code.mcp.json").yaml
    assert "import: warning: 1 entry skipped (browser): see above" in err


def test_import_exits_2_on_invalid_json_naming_the_file_line_and_column(tmp_path: Path) -> None:
    bad = tmp_path / "bad.json"
    bad.write_text('{"mcpServers": {\n  "a": {"command": "x"\n}\n', encoding="utf-8")
    code, out, err = run_import_here(str(bad))
    assert code == 2
    assert out == ""
    assert err.startswith(f"gateway import: {bad}:4: invalid JSON: ")
    assert "(line 4, column 1)" in err


def test_import_exits_2_on_an_unreadable_file(tmp_path: Path) -> None:
    code, _, err = run_import_here(str(tmp_path / "missing.json"))
    assert code == 2
    assert err == f"gateway import: cannot read {tmp_path / 'missing.json'}: No such file or directory\n"


def test_import_writes_the_output_file_and_refuses_to_overwrite_it_without_force(tmp_path: Path) -> None:
    source, target = str(CONFIGS / "vscode_mcp.json"), tmp_path / "out.yaml"
    assert run_import_here(source, "-o", str(target))[0] == 0
    assert target.read_text(encoding="utf-8") == imported("vscode_mcp.json").yaml
    target.write_text("mine\n", encoding="utf-8")
    code, out, err = run_import_here(source, "-o", str(target))
    assert code == 1 and out == ""
    assert f"{target} exists; pass --force to overwrite it" in err
    assert target.read_text(encoding="utf-8") == "mine\n"
    assert run_import_here(source, "-o", str(target), "--force")[0] == 0
    assert target.read_text(encoding="utf-8") == imported("vscode_mcp.json").yaml


@pytest.mark.spawns
def test_imported_file_round_trips_through_gateway_check_to_a_ready_backend(tmp_path: Path) -> None:
    claude = {
        "mcpServers": {
            "echo server": {
                "command": PYTHON,
                "args": [str(ECHO_SERVER), "--stdio"],
                "env": {"ECHO_API_KEY": "literal-secret-value", "ECHO_MODE": "plain"},
            }
        }
    }
    (tmp_path / "claude_desktop_config.json").write_text(json.dumps(claude), encoding="utf-8")
    done = gateway("import", "claude_desktop_config.json", "-o", "federation.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "federation.yaml").read_text(encoding="utf-8")
    assert "literal-secret-value" not in written + done.stderr
    assert "ECHO_API_KEY: ${ECHO_API_KEY}" in written or "ECHO_API_KEY: '${ECHO_API_KEY}'" in written

    env = {k: v for k, v in os.environ.items() if k != "ECHO_API_KEY"}
    unset = gateway("check", "-c", "federation.yaml", "--json", cwd=tmp_path, env=env)
    assert unset.returncode == 2
    assert "environment variable ECHO_API_KEY is not set" in unset.stderr

    checked = gateway("check", "-c", "federation.yaml", "--json", cwd=tmp_path, env={**env, "ECHO_API_KEY": "x"})
    assert checked.returncode == 0, checked.stderr
    doc = json.loads(checked.stdout)
    assert [(b["name"], b["kind"], b["state"]) for b in doc["backends"]] == [("echo-server", "stdio", "ready")]
    assert doc["backends"][0]["tools"] > 0


@pytest.mark.spawns
def test_the_gateways_own_variables_never_reach_an_imported_child_and_a_url_password_becomes_a_variable(
    tmp_path: Path,
) -> None:
    # A client never expands ${GATEWAY_TOKENS} in its own file (it is literal text there); the gateway would, and
    # hand its own tokens and state key to the child. A URL password is a literal secret like any other.
    dump = tmp_path / "child-env.json"
    claude = {
        "mcpServers": {
            "echo": {
                "command": PYTHON,
                "args": [str(ECHO_SERVER), "--stdio"],
                "env": {
                    "GITHUB_TOKEN": "${GATEWAY_TOKENS}",
                    "STATE": "${env:GATEWAY_STATE_KEY}",
                    "ECHO_ENV_DUMP": str(dump),
                },
            },
            "remote": {"type": "http", "url": "https://alice:hunter2@example.invalid/mcp"},
        }
    }
    (tmp_path / "claude_desktop_config.json").write_text(json.dumps(claude), encoding="utf-8")
    done = gateway("import", "claude_desktop_config.json", "-o", "federation.yaml", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    written = (tmp_path / "federation.yaml").read_text(encoding="utf-8")
    assert "hunter2" not in written + done.stderr
    assert "GATEWAY_TOKENS}" not in written and "GATEWAY_STATE_KEY}" not in written, written
    assert "https://alice:${REMOTE_PASSWORD}@example.invalid/mcp" in written, written
    assert "the gateway's own variable GATEWAY_TOKENS" in done.stderr, done.stderr

    servers = yaml.safe_load(written)["servers"]
    assert servers["echo"]["env"]["ECHO_ENV_DUMP"] == str(dump)
    needed = {name: "set-for-the-server" for name in re.findall(r"\$\{([A-Z0-9_]+)\}", written)}
    own = {"GATEWAY_TOKENS": "alice=the-gateways-own-token", "GATEWAY_STATE_KEY": "the-gateways-own-state-key"}
    checked = gateway("check", "-c", "federation.yaml", cwd=tmp_path, env={**os.environ, **own, **needed})
    assert dump.exists(), checked.stdout + checked.stderr
    child = json.loads(dump.read_text())
    assert not [name for name, seen in child.items() if "the-gateways-own" in seen], child
