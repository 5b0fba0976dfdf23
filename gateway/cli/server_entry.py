"""One server entry of a client's config turned into one ``servers:`` entry of federation.yaml, as a pure function of
the parsed JSON (no environment, no file it points at, no network). ``EntryConverter`` guarantees that

- a literal secret never reaches the entry or the report: a value of ``env``/``headers`` (or a URL query parameter,
  a URL's password, or an argument after a flag) whose key looks like a secret becomes a ``${VAR}`` reference, and
  the report names the variable to set, never the value;
- the gateway's own variables (``GATEWAY_*``: its tokens, its state key) never reach a server through an import: a
  client never expands ``${GATEWAY_TOKENS}`` in its own file, the gateway would; such a reference becomes a variable
  of the entry's own, reported (the operator may still write one into federation.yaml by hand);
- the entry's keys keep the order of the file;
- everything it could not carry over as written (an unknown key, a VS Code ``${input:...}``, an ``envFile``) is one
  sentence of the report, and each variable the entry needs is a ``Variable``.

Client references become the gateway's ``${VAR}`` form: ``${env:X}`` (VS Code, Cursor) -> ``${X}``; ``${X}`` and
``${X:-default}`` (Claude Code) stay; ``${userHome}`` -> ``${HOME}``; ``${workspaceFolder}`` -> ``${WORKSPACE_FOLDER}``.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from gateway.config import BACKEND_NAME_RE, PACKAGE_RUNNERS

__all__ = ["EntryConverter", "Variable", "federation_names"]

_NAME_MAX = 48  # federation.yaml backend names: config.BACKEND_NAME_RE
_NAME_BAD_CHARS = re.compile(r"[^A-Za-z0-9_-]+")
_SECRET_WORDS = ("TOKEN", "KEY", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL", "COOKIE")
_REFERENCE = re.compile(r"\$\{([^}]*)\}")
_ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_ENV_WITH_DEFAULT = re.compile(r"([A-Za-z_][A-Za-z0-9_]*):-.*", re.DOTALL)
_AUTH_SCHEME = re.compile(r"(Bearer|Basic|Token|Bot)(\s+)(\S.*)", re.IGNORECASE | re.DOTALL)
_QUERY_PARAM = re.compile(r"([?&])([^=&#]+)=([^&#]*)")
_USERINFO = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*://)([^/@?#:]*):([^/@?#]*)@")
_GATEWAY_OWN = "GATEWAY_"
"""The gateway's own variables (``GATEWAY_TOKENS``, ``GATEWAY_STATE_KEY``, ...): never carried into an entry."""
_FLAG = re.compile(r"--?[A-Za-z][A-Za-z0-9_-]*")
_FLAG_SECRET_WORDS = frozenset({"TOKEN", "KEY", "APIKEY", "SECRET", "PASSWORD", "PASSWD", "AUTH", "CREDENTIAL"})
_FLAG_OTHER_WORDS = frozenset(
    {"NO", "DISABLE", "ENABLE", "SKIP", "USE", "WITH", "WITHOUT", "FILE", "PATH", "DIR", "ENV"}
)

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


# --------------------------------------------------------------------------------------------------- naming


def _upper_snake(text: str) -> str:
    name = re.sub(r"[^A-Za-z0-9]+", "_", text).strip("_").upper() or "VALUE"
    return f"_{name}" if name[0].isdigit() else name


def federation_names(names: list[str]) -> dict[str, str]:
    """Original name -> a unique name that satisfies ``^[A-Za-z0-9_-]{1,48}$``."""
    result: dict[str, str] = {}
    taken = {n for n in names if BACKEND_NAME_RE.fullmatch(n)}
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


# --------------------------------------------------------------------------------------------------- one entry


class EntryConverter:
    """Converts the entries of one client file (``entry``), gathering the report and the variables they need;
    ``inputs`` are VS Code's declared inputs, ``source`` the file's name (for ``disabled_reason``)."""

    def __init__(self, inputs: Any, source: str) -> None:
        self.source = source
        self.inputs: dict[str, Mapping[str, Any]] = {}
        if isinstance(inputs, list):
            for item in inputs:
                if isinstance(item, dict) and isinstance(item.get("id"), str):
                    self.inputs[item["id"]] = item
        self.report: list[str] = []
        self.variables: dict[str, Variable] = {}
        self.fetchers: dict[str, list[str]] = {}
        """A command that fetches its server at start (``npx``, ``uvx``, ...) -> the servers it starts."""
        self._secret_values: dict[str, str] = {}  # variable -> the secret it stands for (kept in memory only)

    # ------------------------------------------------------------------ bookkeeping

    def fetching(self) -> list[str]:
        """One sentence per package runner the servers start with: what it needs from the gateway's environment."""
        said = []
        for runner, servers in self.fetchers.items():
            named = ", ".join(repr(server) for server in servers)
            said.append(
                f"server{'s' if len(servers) > 1 else ''} {named} start{'' if len(servers) > 1 else 's'} with "
                f"{runner}, which fetches the server when it is not cached yet: the gateway passes it only PATH, "
                "HOME, its env and the proxy and CA variables (HTTP(S)_PROXY, NO_PROXY, NODE_EXTRA_CA_CERTS, "
                "SSL_CERT_FILE, npm_config_*, PIP_*, ...) of its own environment; add any other variable it needs "
                "to pass_env, and if a first start takes longer than connect_timeout_s (20 s), run it once from a "
                "shell"
            )
        return said

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
            named = inner.removeprefix("env:").partition(":-")[0]
            if named.startswith(_GATEWAY_OWN) and _ENV_NAME.fullmatch(named):
                return self.own_variable(server, where, named)
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

    def own_variable(self, server: str, where: str, named: str) -> str:
        """A reference to one of the gateway's own variables, replaced by a variable of the entry's own."""
        variable = self.secret_variable(server, where.rpartition(" ")[2] or where, "${" + named + "}")
        self.need(variable, f"{where} of server {server!r} (was the gateway's own {named})", secret=True)
        self.note(
            server,
            f"{where} references the gateway's own variable {named}, which a client never expands in its own file "
            f"and the gateway would (its tokens and keys would reach the server): written as ${{{variable}}}; set "
            f"{variable} to the value the server needs",
        )
        return "${" + variable + "}"

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

        def password(match: re.Match[str]) -> str:
            scheme, user, secret = match.groups()
            return f"{scheme}{user}:{self.hide(server, 'password', 'the URL password', secret)}@"

        return _USERINFO.sub(password, _QUERY_PARAM.sub(replace, value), count=1)

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
            runner = command.rsplit("/", 1)[-1]
            if runner in PACKAGE_RUNNERS:
                self.fetchers.setdefault(runner, []).append(server)
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
