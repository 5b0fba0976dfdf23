"""``gateway import FILE``: a client's MCP server list turned into ``servers:`` entries of federation.yaml.

Reads the ``mcpServers`` JSON of Claude Desktop (``claude_desktop_config.json``), Claude Code (``.mcp.json``) and
Cursor (``~/.cursor/mcp.json``), and the ``servers`` JSON of VS Code (``.vscode/mcp.json``, comments and trailing
commas allowed, or a ``settings.json`` with an ``mcp`` section). ``convert`` is a pure function of the parsed JSON:
it reads no environment, no file the config points at (``envFile``) and no network. It guarantees that

- the YAML it returns validates under the federation.yaml models: every entry is checked with ``parse_config``
  before it is kept, and one that fails is skipped and reported;
- a literal secret never reaches the YAML or the report: a value of ``env``/``headers`` (or a URL query parameter,
  or an argument after a flag) whose key looks like a secret becomes a ``${VAR}`` reference, and the report names
  the variable to set, never the value;
- servers and their keys keep the order of the file;
- everything it could not carry over as written (a rename, an unknown key, a VS Code ``${input:...}``, an
  ``envFile``, a skipped entry) is one sentence of the report.

Client references become the gateway's ``${VAR}`` form: ``${env:X}`` (VS Code, Cursor) -> ``${X}``; ``${X}`` and
``${X:-default}`` (Claude Code) stay; ``${userHome}`` -> ``${HOME}``; ``${workspaceFolder}`` -> ``${WORKSPACE_FOLDER}``.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, TextIO

import json5
import yaml

from gateway.config import parse_config
from gateway.errors import ConfigError

__all__ = ["FORMATS", "Imported", "Variable", "add_import_subcommand", "convert", "parse_client_config", "run_import"]

Format = Literal["claude", "vscode"]
FORMATS = ("auto", "claude", "vscode")
"""``claude``: ``{"mcpServers": ...}`` (Claude Desktop, Claude Code, Cursor); ``vscode``: ``{"servers": ...}``."""

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_NAME_MAX = 48  # federation.yaml backend names: ^[A-Za-z0-9_-]{1,48}$ (config._BACKEND_NAME_RE)
_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL", "COOKIE")
_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_WITH_DEFAULT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):-.*", re.DOTALL)
_CONFIG_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")  # what parse_config will look up
_AUTH_SCHEME = re.compile(r"(Bearer|Basic|Token|Bot)(\s+)(\S.*)", re.IGNORECASE | re.DOTALL)
_QUERY_PARAM = re.compile(r"([?&])([^=&#]+)=([^&#]*)")
_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*")
_FLAG_SECRET_WORDS = frozenset({"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL"})
_FLAG_OTHER_WORDS = frozenset(
    {"NO", "DISABLE", "ENABLE", "SKIP", "USE", "WITH", "WITHOUT", "FILE", "PATH", "DIR", "ENV"}
)
_PLACEHOLDER = "http://placeholder.invalid"  # stands in for every ${VAR} while validating: fits a url and a string

_TRANSPORTS = {
    "stdio": "stdio",
    "http": "streamable_http",
    "streamable-http": "streamable_http",
    "streamable_http": "streamable_http",
    "streamablehttp": "streamable_http",
    "sse": "sse",
}
_STDIO_KEYS = frozenset({"type", "command", "args", "env", "cwd", "envFile", "disabled"})
_REMOTE_KEYS = frozenset({"type", "url", "serverUrl", "headers", "disabled"})
_HINTS = {
    "timeout": "set timeout_s (seconds) on the entry if it matters",
    "autoApprove": "the gateway asks no approvals; limit what it publishes with tools.include / tools.exclude",
    "alwaysAllow": "the gateway asks no approvals; limit what it publishes with tools.include / tools.exclude",
    "oauth": "the gateway runs no OAuth flow for a downstream server; send a token with headers and ${VAR}",
    "dev": "VS Code's watch/debug settings for developing a server; the gateway has none",
}
_PREDEFINED = {  # VS Code / Cursor predefined variables -> what the gateway writes instead
    "userHome": "${HOME}",
    "pathSeparator": "/",
    "/": "/",
    "workspaceFolder": "${WORKSPACE_FOLDER}",
    "workspaceFolderBasename": "${WORKSPACE_FOLDER_BASENAME}",
}


@dataclass(frozen=True)
class Variable:
    """An environment variable the imported entries reference and the gateway's environment must provide."""

    name: str
    why: str
    """Where it is used, e.g. ``env GITHUB_TOKEN of server 'github' (a secret moved out of the file)``."""
    secret: bool


@dataclass(frozen=True)
class Imported:
    """The result of one import."""

    yaml: str
    """A ``servers:`` mapping (with a comment header): paste it into federation.yaml, or use it as one."""
    servers: tuple[str, ...]
    """The imported servers, under their federation names, in file order."""
    skipped: tuple[str, ...]
    """Entries that were not imported, as the file names them."""
    report: tuple[str, ...]
    """One sentence per thing not carried over exactly as written (never a secret's value)."""
    variables: tuple[Variable, ...]
    """What to set in the gateway's environment before ``gateway check`` (``${VAR}`` without a default)."""


# --------------------------------------------------------------------------------------------------- parsing


def parse_client_config(text: str, *, file: str = "<memory>") -> Any:
    """Parse a client's JSON. ``//`` and ``/* */`` comments and trailing commas (VS Code's JSONC) are allowed: the
    text is read as JSON5 (``json5``), of which JSONC is a subset.

    Raises:
        ConfigError: the text is not JSON; names the file, the line and the column.
    """
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise ConfigError(file, "", 1, "invalid JSON: the file is empty")
    try:
        data, error, position = json5.parse(text)
    except RecursionError as exc:
        raise ConfigError(file, "", None, "invalid JSON: nested too deeply") from exc
    if error is None:
        return data
    line = text.count("\n", 0, position) + 1
    column = position - text.rfind("\n", 0, position)
    raise ConfigError(file, "", line, f"invalid JSON: {_json5_problem(error)} (line {line}, column {column})")


def _json5_problem(error: str) -> str:
    """json5's error text without its own position (``<string>:4 Unexpected "x" at column 5``): what was wrong."""
    what = re.sub(r"^<string>:\d+ ", "", error)
    what = re.sub(r" at column \d+$", "", what)
    what = re.sub(r'^Unexpected "(.+)"$', lambda m: f"unexpected {m.group(1)!r}", what)
    return what[:1].lower() + what[1:]


def _detect(data: Any, requested: str, file: str) -> tuple[Format, Mapping[str, Any], list[str], Any]:
    """(format, the servers object, ignored top-level keys, VS Code inputs)."""
    if not isinstance(data, dict):
        raise ConfigError(
            file,
            "",
            1,
            'the top level must be a JSON object with "mcpServers" (Claude Desktop, Claude Code, '
            'Cursor) or "servers" (VS Code)',
        )
    holder: dict[str, Any] = data
    prefix = ""
    if requested in ("auto", "vscode") and "servers" not in data and isinstance(data.get("mcp"), dict):
        holder, prefix = data["mcp"], "mcp."  # a VS Code settings.json
    fmt: Format
    if requested == "claude" or (requested == "auto" and "mcpServers" in holder):
        fmt, key = "claude", "mcpServers"
    elif requested == "vscode" or (requested == "auto" and "servers" in holder):
        fmt, key = "vscode", "servers"
    else:
        raise ConfigError(
            file, "", None, 'found no "mcpServers" (Claude Desktop, Claude Code, Cursor) or "servers" (VS Code) object'
        )
    if key not in holder:
        raise ConfigError(file, "", None, f'found no "{prefix}{key}" object (the {fmt} format was asked for)')
    servers = holder[key]
    if not isinstance(servers, dict):
        raise ConfigError(file, prefix + key, None, "must be an object mapping server names to their settings")
    known = {key, "inputs"} if fmt == "vscode" else {key}
    # The rest of a VS Code settings.json is the editor's business, not an import problem.
    ignored = [] if prefix else [k for k in holder if k not in known]
    return fmt, servers, ignored, holder.get("inputs") if fmt == "vscode" else None


# --------------------------------------------------------------------------------------------------- naming


def _upper_snake(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").upper() or "VALUE"
    return f"_{name}" if name[0].isdigit() else name


def _federation_names(names: list[str]) -> dict[str, str]:
    """Original name -> a unique name that satisfies ``^[A-Za-z0-9_-]{1,48}$``."""
    result: dict[str, str] = {}
    taken = {n for n in names if re.fullmatch(r"[A-Za-z0-9_-]{1,48}", n)}
    for name in names:
        if name in taken and name not in result.values():
            result[name] = name
            continue
        base = _NAME_BAD_CHARS.sub("-", name).strip("-")[:_NAME_MAX].strip("-") or "server"
        candidate, counter = base, 2
        while candidate in taken or candidate in result.values():
            suffix = f"-{counter}"
            candidate = base[: _NAME_MAX - len(suffix)] + suffix
            counter += 1
        result[name] = candidate
    return result


def _looks_secret(key: str) -> bool:
    upper = key.upper()
    return any(word in upper for word in _SECRET_WORDS)


def _secret_flag(arg: str) -> bool:
    """``--api-key``, ``--token``, ``--apiKey``: a flag whose value is a secret (not ``--no-auth``, ``--key-file``)."""
    if not _FLAG.fullmatch(arg):
        return False
    words = set(_upper_snake(re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", arg)).split("_"))
    return bool(words & _FLAG_SECRET_WORDS) and not words & _FLAG_OTHER_WORDS


# --------------------------------------------------------------------------------------------------- conversion


class _Converter:
    def __init__(self, fmt: Format, inputs: Any, source: str) -> None:
        self.fmt = fmt
        self.source = source
        self.inputs: dict[str, Mapping[str, Any]] = {}
        if isinstance(inputs, list):
            for item in inputs:
                if isinstance(item, dict) and isinstance(item.get("id"), str):
                    self.inputs[item["id"]] = item
        self.report: list[str] = []
        self.variables: dict[str, Variable] = {}
        self._secret_values: dict[str, str] = {}  # variable -> the secret it stands for (kept in memory only)

    # ------------------------------------------------------------------ bookkeeping

    def note(self, server: str, message: str) -> None:
        self.report.append(f"server {server!r}: {message}")

    def need(self, name: str, why: str, *, secret: bool = False) -> None:
        if name not in self.variables:
            self.variables[name] = Variable(name, why, secret)

    def secret_variable(self, server: str, key: str, value: str) -> str:
        """A variable name ``<SERVER>_<KEY>`` for this secret (the key alone when it already starts with the
        server's first word, as ``GITHUB_TOKEN`` for ``github-work``); a different secret never shares a name, the
        same secret used twice does."""
        server_part, key_part = _upper_snake(server), _upper_snake(key)
        first_word = server_part.split("_")[0]
        names_server = key_part == first_word or key_part.startswith(first_word + "_")
        base = key_part if names_server else f"{server_part}_{key_part}"
        name, counter = base, 2
        while name in self.variables and self._secret_values.get(name) != value:
            name = f"{base}_{counter}"
            counter += 1
        self._secret_values[name] = value
        return name

    # ------------------------------------------------------------------ values

    def string(self, server: str, where: str, raw: Any) -> str | None:
        if isinstance(raw, str):
            return raw
        if isinstance(raw, bool):
            return "true" if raw else "false"
        if isinstance(raw, int | float):
            return json.dumps(raw)
        if raw is None:
            self.note(server, f"{where} is null (in VS Code: unset the variable); left out")
        else:
            self.note(server, f"{where} is a {type(raw).__name__}, not text; left out")
        return None

    def translate(self, server: str, where: str, value: str) -> str:
        """Rewrite the client's ``${...}`` references into the gateway's ``${VAR}`` form."""

        def replace(match: re.Match[str]) -> str:
            inner = match.group(1)
            what = f"{where} of server {server!r}"
            if inner.startswith("env:") and _ENV_NAME.fullmatch(inner[4:]):
                self.need(inner[4:], what)
                return "${" + inner[4:] + "}"
            if inner.startswith("input:"):
                return self.input_reference(server, where, inner[6:])
            if inner in _PREDEFINED:
                written = _PREDEFINED[inner]
                if written.startswith("${WORKSPACE"):
                    variable = written[2:-1]
                    self.need(variable, f"{what} (VS Code's ${{{inner}}})")
                    self.note(
                        server,
                        f"{where} uses ${{{inner}}}, which the gateway does not know: written as {written}; set "
                        f"{variable} to the project folder (or write the path in its place)",
                    )
                return written
            if _ENV_NAME.fullmatch(inner):
                self.need(inner, what)
                return match.group(0)
            if _ENV_WITH_DEFAULT.fullmatch(inner):
                return match.group(0)  # ${VAR:-default}: the same syntax and meaning in federation.yaml
            variable = _upper_snake(inner)
            self.need(variable, f"{what} (was ${{{inner}}})")
            self.note(
                server,
                f"{where} uses ${{{inner}}}, which the gateway cannot resolve: written as ${{{variable}}}; set "
                f"{variable} to its value",
            )
            return "${" + variable + "}"

        return _REFERENCE.sub(replace, value)

    def input_reference(self, server: str, where: str, ident: str) -> str:
        variable = _upper_snake(ident)
        spec = self.inputs.get(ident, {})
        description = spec.get("description")
        about = f" ({description})" if isinstance(description, str) and description else ""
        secret = bool(spec.get("password")) or _looks_secret(ident)
        self.need(variable, f"{where} of server {server!r} (VS Code input {ident!r})", secret=secret)
        if not spec:
            about += ", not declared in inputs"
        self.note(
            server,
            f"{where} uses the VS Code input {ident!r}{about}, which VS Code prompts for and the gateway cannot: "
            f"written as ${{{variable}}}; set {variable} in the gateway's environment",
        )
        return "${" + variable + "}"

    def hide(self, server: str, key: str, where: str, value: str) -> str:
        """Replace a literal secret with a reference; keep an Authorization scheme (``Bearer ${VAR}``)."""
        if "${" in value or not value:
            return value
        scheme = ""
        if match := _AUTH_SCHEME.fullmatch(value):
            scheme, value = match.group(1) + match.group(2), match.group(3)
        variable = self.secret_variable(server, key, value)
        self.need(variable, f"{where} of server {server!r} (a secret moved out of the file)", secret=True)
        held = "the credential after " + repr(scheme.strip()) if scheme else "its value"
        self.note(
            server,
            f"{where} looks like a secret: written as {scheme}${{{variable}}}; set {variable} to {held} where "
            "the gateway runs",
        )
        return scheme + "${" + variable + "}"

    def mapping(self, server: str, kind: str, raw: Any) -> dict[str, str]:
        if not isinstance(raw, dict):
            self.note(server, f"{kind} is not an object; left out")
            return {}
        result: dict[str, str] = {}
        for key, item in raw.items():
            where = f"{kind} {key}"
            value = self.string(server, where, item)
            if value is None:
                continue
            value = self.translate(server, where, value)
            if _looks_secret(key):
                value = self.hide(server, key, where, value)
            result[key] = value
        return result

    def args(self, server: str, raw: Any) -> list[str]:
        if not isinstance(raw, list):
            self.note(server, "args is not a list; left out")
            return []
        result: list[str] = []
        secret_flag: str | None = None
        for index, item in enumerate(raw):
            value = self.string(server, f"args[{index}]", item)
            if value is None:
                continue
            value = self.translate(server, f"args[{index}]", value)
            flag, eq, rest = value.partition("=")
            if secret_flag is not None and not value.startswith("-"):
                value = self.hide(server, secret_flag.lstrip("-"), f"the argument after {secret_flag}", value)
            elif eq and _secret_flag(flag):
                value = f"{flag}={self.hide(server, flag.lstrip('-'), f'the value of {flag}=', rest)}"
            secret_flag = value if _secret_flag(value) else None
            result.append(value)
        return result

    def url(self, server: str, raw: Any) -> str | None:
        value = self.string(server, "url", raw)
        if value is None:
            return None
        value = self.translate(server, "url", value)

        def replace(match: re.Match[str]) -> str:
            sep, key, secret = match.groups()
            if not _looks_secret(key):
                return match.group(0)
            return f"{sep}{key}={self.hide(server, key, f'the URL query parameter {key}', secret)}"

        return _QUERY_PARAM.sub(replace, value)

    # ------------------------------------------------------------------ one entry

    def entry(self, server: str, spec: Any) -> dict[str, Any] | None:
        if not isinstance(spec, dict):
            self.note(server, "is not an object; skipped")
            return None
        transport = self.transport(server, spec)
        if transport is None:
            return None
        out: dict[str, Any] = {"transport": transport}
        known = _STDIO_KEYS if transport == "stdio" else _REMOTE_KEYS
        if transport == "stdio":
            command = self.string(server, "command", spec.get("command"))
            if not command:
                self.note(server, "has no command; skipped")
                return None
            out["command"] = self.translate(server, "command", command)
            if "args" in spec:
                out["args"] = self.args(server, spec["args"])
            if any(c.isspace() for c in command) and not out.get("args"):
                self.note(
                    server,
                    f"command {command!r} contains spaces: the gateway runs it as one program name, never through a "
                    "shell; put the program in command and its arguments in args",
                )
            if "env" in spec:
                out["env"] = self.mapping(server, "env", spec["env"])
            if "cwd" in spec and (cwd := self.string(server, "cwd", spec["cwd"])):
                out["cwd"] = self.translate(server, "cwd", cwd)
            if "envFile" in spec:
                self.note(
                    server,
                    f"envFile {spec['envFile']!r} is not read by the gateway (a file of secrets stays where it is): "
                    "set those variables in the gateway's environment, and reference the ones the server needs in "
                    "env as ${VAR}",
                )
        else:
            url_key = "url" if "url" in spec else "serverUrl"
            url = self.url(server, spec[url_key]) if url_key in spec else None
            if not url:
                self.note(server, "has no url; skipped")
                return None
            out["url"] = url
            if "headers" in spec:
                out["headers"] = self.mapping(server, "header", spec["headers"])
        for key in ("args", "env", "headers"):
            if key in out and not out[key]:
                del out[key]
        if spec.get("disabled") is True:
            out["enabled"] = False
            out["disabled_reason"] = f"disabled in {self.source}"
        ignored = [k for k in spec if k not in known]
        for key in ignored:
            hint = _HINTS.get(key)
            if hint is None:
                wrong_kind = key in _STDIO_KEYS | _REMOTE_KEYS
                hint = f"not used by a {transport} server" if wrong_kind else "no counterpart in federation.yaml"
            self.note(server, f"key {key!r} ignored: {hint}")
        return out

    def transport(self, server: str, spec: Mapping[str, Any]) -> str | None:
        kind = spec.get("type")
        if kind is not None:
            transport = _TRANSPORTS.get(str(kind).lower())
            if transport is None:
                self.note(
                    server,
                    f"type {kind!r} is not a transport the gateway speaks (stdio, http, sse); skipped",
                )
            return transport
        if "command" in spec:
            return "stdio"
        url = spec.get("url", spec.get("serverUrl"))
        if isinstance(url, str):
            path = url.split("?", 1)[0].split("#", 1)[0].rstrip("/")
            transport = "sse" if path.endswith("/sse") else "streamable_http"
            ends = "ends" if transport == "sse" else "does not end"
            self.note(
                server,
                f"has a url but no type: assumed {transport} (the URL {ends} in /sse); change transport if the "
                "server speaks the other one",
            )
            return transport
        self.note(server, "has neither command nor url; skipped")
        return None


def _check(name: str, entry: Mapping[str, Any]) -> str | None:
    """Why this entry is not a valid servers entry, or None when it is."""
    try:
        _validate(_dump({"servers": {name: dict(entry)}}))
    except ConfigError as exc:
        where = exc.key_path.removeprefix(f"servers.{name}").lstrip(".")
        return f"{where}: {exc.message}" if where else exc.message
    return None


def _validate(text: str) -> None:
    env = {name: _PLACEHOLDER for name in _CONFIG_REFERENCE.findall(text)}
    parse_config(text, file="<import>", env=env)


class _Flow(dict[str, Any]):
    """A mapping written on one line (``env: {K: v}``), like the hand-written federation.yaml."""


class _FlowList(list[str]):
    """A list written on one line (``args: [-y, pkg]``)."""


class _Dumper(yaml.SafeDumper):
    pass


_Dumper.add_representer(_Flow, lambda d, v: d.represent_mapping("tag:yaml.org,2002:map", v, flow_style=True))
_Dumper.add_representer(_FlowList, lambda d, v: d.represent_sequence("tag:yaml.org,2002:seq", v, flow_style=True))


def _dump(data: Mapping[str, Any]) -> str:
    """Block style for the structure, one line for each ``args``/``env``/``headers``; keys in insertion order."""

    def leaves(value: Any) -> Any:
        if isinstance(value, dict):
            return {k: _Flow(v) if k in ("env", "headers") else leaves(v) for k, v in value.items()}
        if isinstance(value, list):
            return _FlowList(value)
        return value

    return yaml.dump(
        leaves(dict(data)), Dumper=_Dumper, sort_keys=False, default_flow_style=False, allow_unicode=True, width=116
    )


def convert(data: Any, *, fmt: str = "auto", source: str = "<memory>") -> Imported:
    """Turn a parsed client config into ``servers:`` YAML, a report and the variables it needs.

    Args:
        data: the parsed JSON (``parse_client_config``).
        fmt: ``auto`` (by the top-level key), ``claude`` (``mcpServers``) or ``vscode`` (``servers``).
        source: the file's name, for the YAML header and ``disabled_reason`` (a name, not a path, is best).

    Raises:
        ConfigError: the data holds no server list of the asked format.
    """
    if fmt not in FORMATS:
        raise ValueError(f"format must be one of {', '.join(FORMATS)}, not {fmt!r}")
    chosen, servers, ignored, inputs = _detect(data, fmt, source)
    converter = _Converter(chosen, inputs, source)
    if ignored:
        converter.report.append(f"top-level keys ignored (not server definitions): {', '.join(ignored)}")
    names = _federation_names(list(servers))
    out: dict[str, dict[str, Any]] = {}
    skipped: list[str] = []
    for original, spec in servers.items():
        name = names[original]
        if name != original:
            converter.report.append(
                f"server {original!r} renamed to {name!r} (federation names are 1 to 48 of A-Z a-z 0-9 _ -)"
            )
        entry = converter.entry(name, spec)
        if entry is not None and (problem := _check(name, entry)) is not None:
            converter.note(name, f"not a valid servers entry ({problem}); skipped")
            entry = None
        if entry is None:
            skipped.append(original)
            continue
        out[name] = entry
    if not servers:
        converter.report.append("the file declares no servers")

    label = {"claude": "Claude Desktop / Claude Code / Cursor", "vscode": "VS Code"}[chosen]
    header = [
        f"# Imported by `gateway import` from {source} ({label} format).",
        "# Paste these entries under `servers:` in federation.yaml, or use this file as a federation of its own.",
    ]
    required = [v for v in converter.variables.values()]
    if required:
        header.append(f"# Needs these environment variables: {' '.join(v.name for v in required)}")
    text = "\n".join(header) + "\n" + _dump({"servers": out})
    _validate(text)  # the whole file too: a failure here is a bug in this module, not in the input
    return Imported(
        yaml=text,
        servers=tuple(out),
        skipped=tuple(skipped),
        report=tuple(converter.report),
        variables=tuple(required),
    )


# --------------------------------------------------------------------------------------------------- command


def add_import_subcommand(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """Add ``import`` to the CLI's subparsers; run what it parses with ``run_import`` (it needs no federation.yaml)."""
    parser = subparsers.add_parser(
        "import",
        help="turn a client's mcpServers JSON (Claude Desktop, Claude Code, Cursor, VS Code) into servers: entries",
        description=(
            "Print the servers of a client's MCP config as federation.yaml `servers:` entries; the report (renames, "
            "secrets moved to ${VAR}, what could not be mapped) goes to stderr."
        ),
    )
    parser.add_argument("file", help="claude_desktop_config.json, .mcp.json, ~/.cursor/mcp.json, .vscode/mcp.json")
    parser.add_argument(
        "--format",
        choices=FORMATS,
        default="auto",
        help="claude: {mcpServers} (Claude Desktop, Claude Code, Cursor); vscode: {servers}; auto: by the top key",
    )
    parser.add_argument("-o", "--output", help="write the YAML to this file instead of stdout")
    parser.add_argument("--force", action="store_true", help="overwrite --output if it exists")
    return parser


def run_import(args: argparse.Namespace, *, stdout: TextIO | None = None, stderr: TextIO | None = None) -> int:
    """Run a parsed ``gateway import``. Returns 0 (also when entries were skipped: the report says which), 2 when
    the file is unreadable or not JSON of a known format, 1 when the output cannot be written."""
    out = sys.stdout if stdout is None else stdout
    err = sys.stderr if stderr is None else stderr
    try:
        text = Path(args.file).read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        print(f"gateway import: cannot read {args.file}: {reason}", file=err)
        return EXIT_USAGE
    try:
        result = convert(parse_client_config(text, file=args.file), fmt=args.format, source=Path(args.file).name)
    except ConfigError as exc:
        print(f"gateway import: {exc}", file=err)
        return EXIT_USAGE
    if args.output:
        try:
            with open(args.output, "w" if args.force else "x", encoding="utf-8") as handle:
                handle.write(result.yaml)
        except FileExistsError:
            print(f"gateway import: {args.output} exists; pass --force to overwrite it", file=err)
            return EXIT_FAILED
        except OSError as exc:
            print(f"gateway import: cannot write {args.output}: {exc.strerror or exc}", file=err)
            return EXIT_FAILED
    else:
        out.write(result.yaml)
    for line in result.report:
        print(f"import: {line}", file=err)
    where = f" into {args.output}" if args.output else ""
    print(f"import: {len(result.servers)} server(s) imported{where}", file=err)
    if result.skipped:
        count = len(result.skipped)
        entries = "entry" if count == 1 else "entries"
        print(f"import: warning: {count} {entries} skipped ({', '.join(result.skipped)}): see above", file=err)
    if result.variables:
        print("import: set these environment variables where the gateway runs (values not shown):", file=err)
        for variable in result.variables:
            print(f"import:   {variable.name}  <- {variable.why}", file=err)
    return EXIT_OK
