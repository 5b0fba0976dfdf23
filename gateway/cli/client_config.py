"""A client's MCP config file, read: the JSON of Claude Desktop, Claude Code and Cursor (``mcpServers``) or of VS
Code (``servers``; JSONC, or a ``settings.json`` with an ``mcp`` section), its format told and its servers object
found. A file that is not JSON, or holds no server list of the format asked for, is a ``ConfigError`` naming the
file (and, for bad JSON, the line and column)."""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any, Literal

from gateway.errors import ConfigError

__all__ = ["Format", "detect", "parse_client_config"]

Format = Literal["claude", "vscode"]


def parse_client_config(text: str, *, file: str = "<memory>") -> Any:
    """Parse a client's JSON. ``//`` and ``/* */`` comments and trailing commas (VS Code's JSONC) are allowed: text
    that is not plain JSON (read by ``json``, the common case and fifty times faster) is read as JSON5 (``json5``),
    of which JSONC is a subset.

    Raises:
        ConfigError: the text is not JSON; names the file, the line and the column.
    """
    text = text.removeprefix("\ufeff")
    if not text.strip():
        raise ConfigError(file, "", 1, "invalid JSON: the file is empty")
    try:
        return json.loads(text)
    except (ValueError, RecursionError):
        pass  # JSONC, or not JSON at all: json5 tells which, and where
    import json5  # here: most files are plain JSON, and this parser is slow to load and to run

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


def detect(data: Any, requested: str, file: str) -> tuple[Format, Mapping[str, Any], list[str], Any]:
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
