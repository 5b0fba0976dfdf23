"""Reading federation.yaml: ``load_config(path)`` and ``parse_config(text)`` return a validated ``Federation`` or
raise a ``ConfigError`` naming the file, the key path and the line of every problem the file has (``ConfigProblems``
when there are several; it reads as the first, in the file's order), so one run shows everything to fix and a broken
file never starts a half-configured gateway.

The checks, in order, each reporting all it finds: the YAML's syntax (the first error stops there), keys given twice,
``${VAR}`` references to variables that are not set, values the models refuse (one problem per key), and references
between sections. Unknown keys are errors; relative paths resolve against the file's folder; a value that came from
the environment never appears in a message (config/interpolation.py). With ``environ``, the only code that reads
the process environment.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from gateway.config.base import Problem
from gateway.config.federation import Federation
from gateway.config.interpolation import Expansions, interpolate, stand_in, switched_off
from gateway.config.policies import RULES, caller_limits_advice
from gateway.config.wording import guess, keys_at, plain
from gateway.errors import ConfigError

__all__ = ["ConfigProblems", "add_project_tools", "environ", "load_config", "parse_config", "passed_environment"]

Lines = dict[tuple[str, ...], int]
"""Every key path of the document -> the 1-based line of its key."""


class ConfigProblems(ConfigError):
    """Several problems of one file. It reads as the first (``file``, ``key_path``, ``line``, ``message``); its text
    is every problem, one per line, in the order of the file (``problems``)."""

    def __init__(self, problems: Sequence[ConfigError]) -> None:
        first = problems[0]
        super().__init__(first.file, first.key_path, first.line, first.message)
        self.problems = tuple(problems)
        self.args = ("\n".join(str(problem) for problem in problems),)


def _refuse(problems: Sequence[ConfigError]) -> ConfigError:
    """The error to raise for ``problems`` (at least one), in the order of the file; a key's line when known."""
    ordered = sorted(problems, key=lambda problem: (problem.line is None, problem.line or 0))
    return ordered[0] if len(ordered) == 1 else ConfigProblems(ordered)


class _Loader(yaml.SafeLoader):
    """A safe loader that reads every mapping key as the text written (plain YAML turns keys such as ``off``, ``yes``
    or ``1`` into booleans and numbers). Keys given twice are found before (``_lines``)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be plain text", key_node.start_mark
                )
            result[str(key_node.value)] = self.construct_object(value_node, deep=deep)
        return result


def _read_yaml(text: str, file: str) -> tuple[Lines, Any]:
    """The document's key lines and its data (None for an empty file).

    Raises:
        ConfigError: a syntax error, or keys given twice (every one of them).
    """
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        lines, duplicates = _lines(node)
        if duplicates:
            message = "duplicate key {!r} (YAML would silently keep only the last)"
            raise _refuse(
                [ConfigError(file, ".".join(path), line, message.format(path[-1])) for path, line in duplicates]
            )
        return lines, loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(filter(None, [exc.context, exc.problem]))
        raise ConfigError(file, "", line, f"YAML syntax error: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(file, "", None, f"YAML error: {exc}") from exc
    finally:
        loader.dispose()


def _lines(node: yaml.Node | None) -> tuple[Lines, list[tuple[tuple[str, ...], int]]]:
    """Every key path -> the line of its key; and every key given a second time in its mapping, with its line."""
    lines: Lines = {}
    duplicates: list[tuple[tuple[str, ...], int]] = []

    def walk(node: yaml.Node, path: tuple[str, ...]) -> None:
        lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, yaml.MappingNode):
            seen: set[str] = set()
            for key_node, value_node in node.value:
                key = str(key_node.value)
                if key in seen:
                    duplicates.append(((*path, key), key_node.start_mark.line + 1))
                    continue
                seen.add(key)
                walk(value_node, (*path, key))
                lines[(*path, key)] = key_node.start_mark.line + 1
        elif isinstance(node, yaml.SequenceNode):
            for index, item in enumerate(node.value):
                walk(item, (*path, str(index)))

    if node is not None:
        walk(node, ())
    return lines, duplicates


def _locate(loc: tuple[int | str, ...], lines: Lines) -> tuple[str, int | None]:
    """Turn a pydantic error location into (dotted key path, line), skipping union tags that are not keys."""
    matched: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    for part in (str(p) for p in loc):
        candidate = (*matched, part)
        if candidate in lines:
            matched = candidate
            pending = ()
        elif part not in ("stdio", "streamable_http", "sse") and not part.startswith("function-"):
            pending = (*pending, part)  # a key that is missing from the file: name it, point at its parent
    key_path = ".".join((*matched, *pending))
    return key_path, lines.get(matched)


def parse_config(text: str, *, file: str = "<memory>", env: Mapping[str, str] | None = None) -> Federation:
    """Parse and validate federation.yaml text. Relative paths resolve against ``file``'s folder.

    Raises:
        ConfigError: naming the file, the key path and the line of each problem (``ConfigProblems`` for several).
    """
    lines, data = _read_yaml(text, file)
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(file, "", 1, "the top level must be a mapping (version, gateway, servers, ...)")
    expansions = Expansions()
    unset: list[Problem] = []
    data = interpolate(data, os.environ if env is None else env, expansions, unset)
    off = switched_off(data)  # a switched-off backend's variables need not be set
    waived = [(path, message) for path, message in unset if any(path[: len(o)] == o for o in off)]
    problems = [
        ConfigError(file, ".".join(path), lines.get(path), message)
        for path, message in unset
        if (path, message) not in waived
    ]
    base_dir = str(Path(file).resolve().parent) if file != "<memory>" else None
    try:
        fed = _validated(data, base_dir, waived, lines)
    except ValidationError as exc:
        refused = _validation_problems(exc.errors(include_url=False), lines, expansions)
        refused_at = [ConfigError(file, key_path, line, text) for key_path, line, text in refused]
        problems += _besides(unset, refused_at)
        # a switched-off backend's value that cannot be checked without its variable: the variable is needed after all
        problems += [
            ConfigError(
                file,
                ".".join(path),
                lines.get(path),
                f"{message} (its backend is switched off, but this value cannot be checked without it)",
            )
            for path, message in waived
            if any(_at_or_below(p.key_path, ".".join(path)) for p in refused_at)
        ]
        raise _refuse(problems) from None  # pydantic's own text would echo the input
    if not problems:  # references are checked between the values the file will have, every variable set
        problems = [
            ConfigError(file, ".".join(path), lines.get(path), expansions.redact(what, at=".".join(path)))
            for path, what in fed.cross_reference_problems()
        ]
    if problems:
        raise _refuse(problems)
    if "caller_limits" in fed.gateway.auth.model_fields_set:
        import structlog  # only here: reading a file does not load the logging stack (`gateway import` starts fast)

        line = lines.get(RULES)
        advice = caller_limits_advice(fed.gateway.auth.caller_limits, fed.policies)
        structlog.get_logger("gateway.config").warning(
            "config.deprecated",
            message=f"{file}{f':{line}' if line else ''}: gateway.auth.caller_limits is deprecated (read as the "
            f"policies' limits, every caller limited as before): {advice}",
        )
    fed._source = file
    return fed


def _validated(data: dict[str, Any], base_dir: str | None, waived: list[Problem], lines: Lines) -> Federation:
    """``data`` as a ``Federation``; a switched-off backend's values whose variables are not set (``waived``) are
    checked as written, and those refused so are checked once more as ``stand_in``s.

    Raises:
        ValidationError: what the models refuse (with the stand-ins, when the first check refused a waived value).
    """
    context = {"base_dir": base_dir}
    try:
        return Federation.model_validate(data, context=context)
    except ValidationError as exc:
        located = [_locate(tuple(err["loc"]), lines)[0] for err in exc.errors(include_url=False)]
        stood_in = [path for path, _ in waived if any(_at_or_below(key, ".".join(path)) for key in located)]
        if not stood_in:
            raise
    for path in stood_in:
        _replace(data, path, stand_in)
    return Federation.model_validate(data, context=context)


def _replace(data: Any, path: tuple[str, ...], change: Any) -> None:
    """Replace the string at ``path`` (keys, or list indexes as text) in ``data`` with ``change(string)``."""
    *parents, last = path
    for part in parents:
        data = data[int(part)] if isinstance(data, list) else data[part]
    key: Any = int(last) if isinstance(data, list) else last
    data[key] = change(data[key])


def _at_or_below(key_path: str, key: str) -> bool:
    return key_path == key or key_path.startswith(f"{key}.")


def _besides(unset: list[Problem], problems: Iterable[ConfigError]) -> list[ConfigError]:
    """``problems`` but those at or below a key whose variable is not set (its value is the text written, which
    may well be refused: the missing variable is the news)."""
    at = [".".join(path) for path, _ in unset]
    return [p for p in problems if not any(_at_or_below(p.key_path, key) for key in at)]


def _validation_problems(
    errors: list[Any], lines: Lines, expansions: Expansions
) -> Iterable[tuple[str, int | None, str]]:
    """(key path, line, message) of each key the models refused, the first error of each key only."""
    claimed: set[tuple[Any, ...]] = set()  # unknown keys already reported as the misspelling of a missing one
    reported: set[str] = set()
    for err in errors:
        loc = tuple(err["loc"])
        if err["type"] == "extra_forbidden" and loc in claimed:
            continue
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc = (*loc, "transport")
        key_path, line = _locate(loc, lines)
        misspelt = _misspelt_key(err, loc, errors)
        if misspelt is not None:
            claimed.add((*loc[:-1], misspelt))
            key_path, line = _locate((*loc[:-1], misspelt), lines)
            message = f"unknown key (not part of the federation.yaml schema; did you mean `{loc[-1]}`?)"
        else:
            message = _message(err, key_path, expansions)
        if key_path not in reported:
            reported.add(key_path)
            yield key_path, line, message


def _message(err: Any, key_path: str, expansions: Expansions) -> str:
    """What a pydantic error says, as a sentence of the loader's in plain words, with a guess at what was meant when
    an unknown key or a value looks like a misspelling; never showing a value from the environment."""
    loc = tuple(err["loc"])
    if err["type"] == "extra_forbidden":
        hint = guess(str(loc[-1]), keys_at(loc[:-1], Federation)).removeprefix("; ") or "check its spelling"
        return f"unknown key (not part of the federation.yaml schema; {hint})"
    if err["type"] == "missing":
        return "required key is missing"
    if err["type"] == "union_tag_not_found":
        return "required key is missing: `transport` (one of stdio, streamable_http, sse)"
    worded = plain(err)
    message = worded[0] if worded is not None else expansions.redact(err["msg"], at=key_path)
    value = err["ctx"]["tag"] if err["type"] == "union_tag_invalid" else err.get("input")
    if isinstance(value, str | int | float) and err["type"] not in ("value_error", "assertion_error"):
        # Scalars only (a mapping is not worth printing); as written, so an expanded value is not shown, nor guessed at.
        written = expansions.as_written(value, at=key_path)
        hint = guess(value, worded[1]) if worded is not None and written == value else ""
        message = f"{message} (got {written!r}{hint})"
    return message.removeprefix("Value error, ")


def _misspelt_key(err: Any, loc: tuple[Any, ...], errors: list[Any]) -> str | None:
    """The key written beside a missing required one that looks like its misspelling (``comand`` for ``command``).

    A missing ``transport`` leaves no member of the union to check the other keys, so any sibling key may be the
    misspelling; elsewhere only a key the model also refused as unknown may be.
    """
    if err["type"] not in ("missing", "union_tag_not_found") or not isinstance(err.get("input"), dict):
        return None
    wanted = str(loc[-1])
    siblings = [key for key in err["input"] if isinstance(key, str) and key != wanted]
    if err["type"] == "missing":
        parent = loc[:-1]
        unknown = {
            str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden" and tuple(e["loc"][:-1]) == parent
        }
        siblings = [key for key in siblings if key in unknown]
    close = difflib.get_close_matches(wanted, siblings, n=1, cutoff=0.75)
    return close[0] if close else None


def load_config(path: str | os.PathLike[str]) -> Federation:
    """Read, interpolate and validate a federation.yaml file.

    Raises:
        ConfigError: the file is missing, unreadable or invalid (names file, key path and line).
    """
    file = str(path)
    try:
        text = Path(file).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(file, "", None, f"file not found{_looked_in(file)}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(file, "", None, f"cannot read the file: {exc}") from exc
    return parse_config(text, file=file)


def _looked_in(file: str) -> str:
    """Where a relative path was looked for (a command run outside the project names only ``federation.yaml``)."""
    if Path(file).is_absolute():
        return ""
    try:
        return f" (looked for in {Path.cwd()}, the current folder)"
    except OSError:  # the current folder was removed
        return " (the current folder no longer exists)"


def environ(name: str) -> str | None:
    """Read one environment variable (the rest of the gateway does not touch ``os.environ``)."""
    return os.environ.get(name)


def passed_environment(pass_env: Iterable[str], env: Mapping[str, str]) -> dict[str, str]:
    """A spawned program's environment: the variables ``pass_env`` names that the gateway has (``NAME*``: every one
    starting with NAME), then ``env``, which wins."""
    passed: dict[str, str] = {}
    for name in pass_env:
        if name.endswith("*"):
            passed.update((key, value) for key, value in os.environ.items() if key.startswith(name[:-1]))
        elif (value := os.environ.get(name)) is not None:
            passed[name] = value
    return passed | dict(env)


def add_project_tools(config_file: str, prefix: str) -> str | None:
    """Put the project's ``.tools/bin`` first on ``PATH`` when it is not there yet; the folder added, or None.

    scripts/install puts the programs the default federation names (qmd, graphify, the memory server) in
    ``.tools/bin``, not on the system's PATH, so ``.venv/bin/gateway check`` run by hand would report them "command not
    found". The folder looked for is next to the configuration file, else next to the gateway's own virtualenv
    (``prefix`` is ``sys.prefix``). Spawned programs inherit the changed ``PATH`` (it is passed as ``pass_env``).
    """
    parts = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p]
    for candidate in (Path(config_file).resolve().parent / ".tools" / "bin", Path(prefix).parent / ".tools" / "bin"):
        if candidate.is_dir():
            folder = str(candidate)
            if folder in parts or str(candidate.resolve()) in parts:
                return None
            os.environ["PATH"] = os.pathsep.join([folder, *parts])
            return folder
    return None
