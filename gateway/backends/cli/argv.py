"""A command line from a tool's argv template and a call's arguments, built so no value can become an option.

``build_argv`` expands a template (the rules are in its docstring); ``unknown_placeholder`` checks at start that a
template names only the tool's declared arguments. Nothing here spawns: the result is an argv list, never a string a
shell would read.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping, Sequence
from typing import Any

from gateway.config import AdapterTool
from gateway.errors import InvalidArguments, quote

__all__ = ["build_argv", "unknown_placeholder"]

_PLACEHOLDER = re.compile(r"\{([A-Za-z_][A-Za-z0-9_-]*)\}")
_COMPOSED = ("$ref", "allOf", "anyOf", "oneOf", "if", "dependentSchemas")
"""Schema keywords past which the declared properties are not the whole list (placeholders are then not checked)."""
_PREVIEW_CHARS = 60


def build_argv(tool: str, template: Sequence[str], arguments: Mapping[str, Any]) -> list[str]:
    """Expand an argv template with a call's (validated, defaults filled) arguments.

    Rules, in order:
      1. An element without ``{name}`` placeholders is a literal, passed as is. Braces that do not form
         ``{identifier}`` are literal too.
      2. ``{name}`` is replaced by the argument's value: strings as they are, booleans as ``true``/``false``,
         integers (and integral floats) as digits, other numbers with ``str()``, objects and lists embedded in
         text as compact JSON.
      3. An element that is exactly ``{name}`` with a list value expands to one argv element per item.
      4. An element naming an argument that is absent or None (or, for an exact element, an empty list) is
         dropped. When the element is exactly ``{name}``, the element before it is dropped too if that one is a
         literal option (starts with ``-`` and is not ``--``): ``[-n, "{limit}"]`` vanishes as a pair, so an
         optional argument takes its flag with it.
      5. A value that would begin an argv element with ``-`` is refused unless a literal ``--`` comes earlier in the
         template: the program would read it as an option, so a search query could become ``--help`` or
         ``--index=/elsewhere``. Templates put ``--`` before free-text values (``[search, --json, -n, "{limit}",
         --, "{query}"]``) to let such values through as plain text. This applies after a flag too
         (``-n "{limit}"`` with ``-5``), because parsers disagree on whether that is a value.
      6. A value containing a NUL character is refused: argv cannot carry it.

    Raises:
        InvalidArguments: rule 5 or 6, naming the argument.
    """
    out: list[str] = []
    after_double_dash = False
    previous_was_option = False  # the last element appended came from a literal option such as ``-n``
    for element in template:
        names = _PLACEHOLDER.findall(element)
        if not names:
            out.append(element)
            previous_was_option = element.startswith("-") and element != "--"
            after_double_dash = after_double_dash or element == "--"
            continue
        exact = _PLACEHOLDER.fullmatch(element)
        if exact is not None:
            name = exact.group(1)
            value = arguments.get(name)
            items = value if isinstance(value, list) else ([] if value is None else [value])
            if not items and previous_was_option:
                out.pop()
            for item in items:
                text = _render(tool, name, item)
                _check_leading_dash(tool, name, text, after_double_dash)
                out.append(text)
        elif all(arguments.get(name) is not None for name in names):
            out.append(_substitute(tool, element, arguments, after_double_dash))
        previous_was_option = False
    return out


def unknown_placeholder(tool: str, spec: AdapterTool) -> str | None:
    """Why a template of ``spec`` cannot be filled: a placeholder that names no property of its input schema (checked
    when the schema lists its properties plainly); None when every one is declared."""
    schema = spec.input_schema
    properties = schema.get("properties")
    if not isinstance(properties, dict) or any(key in schema for key in _COMPOSED):
        return None
    templates = [spec.argv or ()] + [v.argv for v in spec.variants.values()]
    for template in templates:
        for element in template:
            for name in _PLACEHOLDER.findall(element):
                if name not in properties:
                    return f"tool {tool!r}: argv names {{{name}}}, which is not a property of its input_schema"
    return None


def _substitute(tool: str, element: str, arguments: Mapping[str, Any], after_double_dash: bool) -> str:
    parts: list[str] = []
    position = 0
    for match in _PLACEHOLDER.finditer(element):
        parts.append(element[position : match.start()])
        name = match.group(1)
        text = _render(tool, name, arguments[name])
        if not "".join(parts):  # this value starts the element
            _check_leading_dash(tool, name, text, after_double_dash)
        parts.append(text)
        position = match.end()
    parts.append(element[position:])
    return "".join(parts)


def _render(tool: str, name: str, value: Any) -> str:
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, str):
        text = value
    elif isinstance(value, int):
        text = str(value)
    elif isinstance(value, float):
        text = str(int(value)) if value.is_integer() else str(value)
    else:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    if "\x00" in text:
        raise InvalidArguments(tool, name, "contains a NUL character, which a command line cannot carry")
    return text


def _check_leading_dash(tool: str, name: str, text: str, after_double_dash: bool) -> None:
    if text.startswith("-") and not after_double_dash:
        raise InvalidArguments(
            tool,
            name,
            f"the value {quote(text, _PREVIEW_CHARS)} starts with '-', which the program would read as an option "
            "(the adapter's argv template has no '--' before it)",
        )
