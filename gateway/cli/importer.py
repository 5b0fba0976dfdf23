"""``gateway import FILE``: a client's MCP server list turned into ``servers:`` entries of federation.yaml.

Reads the ``mcpServers`` JSON of Claude Desktop (``claude_desktop_config.json``), Claude Code (``.mcp.json``) and
Cursor (``~/.cursor/mcp.json``), and the ``servers`` JSON of VS Code (client_config.py). ``convert`` is a pure
function of the parsed JSON, entry by entry (server_entry.py). It guarantees that the YAML it returns validates
under the federation.yaml models (every entry is checked with ``parse_config`` before it is kept; one that fails is
skipped and reported), that servers keep the order of the file under names federation.yaml accepts (a rename is
reported), and that no literal secret reaches the YAML or the report.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

import yaml

from gateway.cli.client_config import detect, parse_client_config
from gateway.cli.parser import FORMATS, add_import_subcommand
from gateway.cli.server_entry import EntryConverter, Variable, federation_names
from gateway.config import parse_config
from gateway.errors import ConfigError

__all__ = ["FORMATS", "Imported", "Variable", "add_import_subcommand", "convert", "parse_client_config", "run_import"]

EXIT_OK, EXIT_FAILED, EXIT_USAGE = 0, 1, 2

_CONFIG_REFERENCE = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)")  # what parse_config will look up
_PLACEHOLDER = "http://placeholder.invalid"  # stands in for every ${VAR} while validating: fits a url and a string


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
    chosen, servers, ignored, inputs = detect(data, fmt, source)
    converter = EntryConverter(inputs, source)
    if ignored:
        converter.report.append(f"top-level keys ignored (not server definitions): {', '.join(ignored)}")
    names = federation_names(list(servers))
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
    converter.report += converter.fetching()

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
