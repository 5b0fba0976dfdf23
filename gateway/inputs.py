"""What a caller's input must be before the gateway acts on it, and how it is said back when it is not.

``problem`` holds every request to three rules, so nothing downstream (a UTF-8 encoder, pydantic's serializer, an
argv, a path join, the ledger) meets input it cannot write: strings are valid Unicode (no lone surrogate), numbers are
finite, nesting is at most ``MAX_DEPTH`` deep. ``ArgumentValidator`` holds a tool's arguments to its published input
schema (JSON Schema, compiled once, no remote ``$ref`` ever fetched) and refuses them with ``InvalidArguments``
naming the argument in words a client can act on; ``PublishedSchemas`` keeps one per published tool for the router.
``did_you_mean`` is the gateway's one guess at a misspelt name.
Client input is echoed into a message only cut to ``ECHO_CHARS`` (``quote``, errors.py).
"""

from __future__ import annotations

import copy
import json
import math
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import referencing
import referencing.exceptions
from jsonschema import exceptions as jsonschema_errors  # type: ignore[import-untyped]
from jsonschema import validators as jsonschema_validators

from gateway.errors import ECHO_CHARS, InvalidArguments, did_you_mean, quote

__all__ = [
    "ECHO_CHARS",
    "MAX_DEPTH",
    "ArgumentValidator",
    "InvalidSchema",
    "PublishedSchemas",
    "argument_problem",
    "did_you_mean",
    "problem",
    "quote",
]

MAX_DEPTH = 64
"""Nesting levels an argument value may have (``{"a": {"b": 1}}`` is 2 deep); far above what any tool schema uses,
far below the few hundred where pydantic's serializer and ``json`` give up."""

_MESSAGE_CHARS = 500  # a message jsonschema words itself is cut here
_LISTED = 20  # names or values listed in a message before the rest are counted


# --------------------------------------------------------------------------------------------------- the three rules


def _lone_surrogate(text: str) -> int | None:
    """The index of the first lone surrogate in ``text``, or None when it is valid text (the common case is one
    C-level encode, no Python loop)."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return exc.start
    return None


def problem(value: Any, max_depth: int = MAX_DEPTH) -> tuple[tuple[str, ...], str] | None:
    """The first part of ``value`` (decoded JSON) that the gateway will not pass on, as (its path of keys, the
    reason), or None."""
    stack: list[tuple[Any, tuple[str, ...]]] = [(value, ())]
    while stack:
        item, where = stack.pop()
        if isinstance(item, str):
            at = _lone_surrogate(item)
            if at is not None:
                return where, _surrogate_reason(item, at)
            continue
        if isinstance(item, float) and not math.isfinite(item):
            return where, f"it is {item!r}, which JSON cannot carry (it would reach the tool as null)"
        if isinstance(item, dict):
            children: Any = item.items()
        elif isinstance(item, list):
            children = ((str(i), v) for i, v in enumerate(item))
        else:
            continue
        if len(where) >= max_depth:
            return where, f"the value is nested more than {max_depth} levels deep (the limit)"
        for key, child in children:
            key = str(key)
            at = _lone_surrogate(key)
            if at is not None:
                return (*where, key), f"its key: {_surrogate_reason(key, at)}"
            stack.append((child, (*where, key)))
    return None


def argument_problem(arguments: Any, max_depth: int = MAX_DEPTH) -> tuple[str, str] | None:
    """``problem`` for a tool's arguments, as (the argument's name, the reason, saying where when deeper)."""
    found = problem(arguments, max_depth)
    if found is None:
        return None
    path, reason = found
    if len(path) > 1:
        reason = f"at {quote('.'.join(path))}, {reason}"
    return (path[0] if path else ""), reason


def _surrogate_reason(text: str, at: int) -> str:
    return (
        f"it holds a lone surrogate (U+{ord(text[at]):04X} at character {at}), which is not valid Unicode text "
        "and cannot be sent on"
    )


# --------------------------------------------------------------------------------------------------- the schema


class InvalidSchema(ValueError):
    """A tool's input schema is not a valid JSON Schema; the message says where and why."""


class ArgumentValidator:
    """One tool's input schema, compiled once: ``check`` refuses the arguments it does not describe.

    The schema's ``$schema`` picks the JSON Schema draft (2020-12 when it names none). A ``$ref`` is resolved within
    the schema only: a remote one is never fetched (the call is refused, saying so).

    Args:
        schema: the published input schema.
        lenient: a ``$ref`` it cannot resolve lets the arguments pass instead of refusing them.

    Raises:
        InvalidSchema: ``schema`` is not a valid JSON Schema.
    """

    __slots__ = ("_defaults", "_integers", "_lenient", "_nullable", "_optional", "_validator", "schema")

    def __init__(self, schema: Mapping[str, Any], *, lenient: bool = False) -> None:
        cls = jsonschema_validators.validator_for(schema, default=jsonschema_validators.Draft202012Validator)
        try:
            cls.check_schema(schema)
        except jsonschema_errors.SchemaError as exc:
            raise InvalidSchema(f"not a valid JSON Schema: {exc.message}") from None
        self.schema = schema
        self._lenient = lenient  # an unresolvable $ref lets the call pass (its provider judges it)
        self._validator = cls(schema, registry=referencing.Registry())
        properties = schema.get("properties")
        properties = properties if isinstance(properties, Mapping) else {}
        subs = {key: sub for key, sub in properties.items() if isinstance(sub, Mapping)}
        self._defaults = {key: sub["default"] for key, sub in subs.items() if "default" in sub}
        self._integers = frozenset(key for key, sub in subs.items() if sub.get("type") == "integer")
        required = schema.get("required")
        required = frozenset(required) if isinstance(required, list) else frozenset()
        self._optional = frozenset(key for key in properties if key not in required)
        self._nullable = frozenset(key for key in self._optional if key in subs and self._accepts_null(subs[key]))

    def _accepts_null(self, sub: Mapping[str, Any]) -> bool:
        try:
            return bool(self._validator.evolve(schema=sub).is_valid(None))
        except referencing.exceptions.Unresolvable:
            return False

    def _settled(self, arguments: Mapping[str, Any]) -> Mapping[str, Any]:
        """``arguments`` less each ``null`` sent for an optional property whose schema does not take null: such a
        null stands for "not given" (models often send one), as a server that reads it so would take it."""
        if not any(arguments.get(key, 0) is None for key in self._optional):
            return arguments
        return {k: v for k, v in arguments.items() if v is not None or k not in self._optional or k in self._nullable}

    def check(self, tool: str, arguments: object) -> None:
        """Refuse ``arguments`` unless they are an object the schema accepts, ``null`` for an optional property
        taken as absent (the provider sees it as sent and judges it, as it would without the gateway).

        Raises:
            InvalidArguments: naming the offending argument (a dotted path, "" for the whole) and what it must be.
        """
        if not isinstance(arguments, Mapping):
            raise InvalidArguments(tool, "", f"must be an object, got {_described(arguments)}")
        try:
            error = jsonschema_errors.best_match(self._validator.iter_errors(self._settled(arguments)), key=_RELEVANCE)
        except referencing.exceptions.Unresolvable as exc:
            if self._lenient:
                return
            unresolved = f"the tool's input schema refers to {quote(exc.ref)}, which the gateway cannot resolve"
            raise InvalidArguments(tool, "", f"cannot be checked: {unresolved}") from None
        if error is not None:
            raise InvalidArguments(tool, *_explained(error))

    def prepare(self, tool: str, arguments: object) -> dict[str, Any]:
        """``check``, then the arguments a provider that acts on them itself receives: a copy without the ``null``
        of an optional property whose schema does not take null, each absent top-level property's ``default`` filled
        in, and an integral number an ``integer`` property was sent as a float (``10.0``: JSON does not tell it from
        ``10``) as an int.

        Raises:
            InvalidArguments: as ``check``.
        """
        self.check(tool, arguments)
        assert isinstance(arguments, Mapping)
        prepared = dict(self._settled(arguments))
        for key, default in self._defaults.items():
            if key not in prepared:
                prepared[key] = copy.deepcopy(default)
        for key in self._integers:
            value = prepared.get(key)
            if isinstance(value, float):
                prepared[key] = int(value)
        return prepared


class PublishedSchemas:
    """The input schema of every published tool, as the router holds a call to it before any provider: compiled on
    the tool's first call and kept while the catalog publishes that same schema (the same object). A schema the
    gateway cannot compile, or a ``$ref`` it cannot resolve, checks nothing: the provider judges such a call."""

    __slots__ = ("_compiled", "_most")

    def __init__(self, most: int = 10_000) -> None:
        self._compiled: dict[str, tuple[Mapping[str, Any], ArgumentValidator | None]] = {}
        self._most = most

    def problem(self, tool: str, schema: Mapping[str, Any], arguments: Mapping[str, Any]) -> InvalidArguments | None:
        """Why ``arguments`` break ``tool``'s published ``schema`` (naming the argument), or None."""
        held = self._compiled.get(tool)
        if held is None or held[0] is not schema:
            try:
                validator: ArgumentValidator | None = ArgumentValidator(schema, lenient=True)
            except InvalidSchema:
                validator = None
            if len(self._compiled) >= self._most:
                self._compiled.clear()  # tools come and go with reloads: what is no longer called is compiled anew
            held = self._compiled[tool] = (schema, validator)
        if held[1] is None:
            return None
        try:
            held[1].check(tool, arguments)
        except InvalidArguments as exc:
            return exc
        return None


_RELEVANCE: Callable[[Any], Any] = jsonschema_errors.by_relevance(strong=frozenset({"additionalProperties"}))
"""jsonschema's ranking (the shallowest error first), but an unknown argument before a missing one at the same level:
a misspelt name explains both, and is the one to name."""

_A_TYPE = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "boolean": "a boolean",
    "array": "an array",
    "object": "an object",
    "null": "null",
}


def _explained(error: Any) -> tuple[str, str]:
    """(dotted path of the offending argument, what it must be) for a jsonschema ``ValidationError``."""
    path = [str(part) for part in error.absolute_path]
    keyword, expected, schema, value = error.validator, error.validator_value, error.schema, error.instance
    if keyword == "required" and isinstance(value, Mapping):
        missing = [key for key in expected if key not in value]
        if missing:
            return ".".join([*path, str(missing[0])]), "is required"
    if keyword == "additionalProperties" and isinstance(value, Mapping):
        unknown = _unknown(value, schema)
        if unknown:
            return ".".join([*path, unknown[0]]), _unknown_message(unknown[0], value, schema, nested=bool(path))
    where = ".".join(path)
    if keyword == "type":
        wanted = expected if isinstance(expected, list) else [expected]
        kinds = " or ".join(_A_TYPE.get(str(kind), f"of type {kind}") for kind in wanted)
        return where, f"must be {kinds}, got {_described(value)}"
    if keyword == "const":
        return where, f"must be {_shown(expected)}, got {_shown(value)}"
    if keyword == "enum":
        return where, f"must be one of {_listing([_shown(item) for item in expected])}; got {_shown(value)}"
    bound = _bound(keyword, expected, schema, value)
    if bound is not None:
        return where, bound
    return where, _own_words(error)


def _unknown(value: Mapping[str, Any], schema: Mapping[str, Any]) -> list[str]:
    declared = schema.get("properties", {})
    patterns = schema.get("patternProperties", {})
    return [str(key) for key in value if key not in declared and not any(re.search(p, str(key)) for p in patterns)]


def _unknown_message(name: str, value: Mapping[str, Any], schema: Mapping[str, Any], *, nested: bool) -> str:
    noun = "key" if nested else "argument"
    declared = [str(key) for key in schema.get("properties", {})]
    close = did_you_mean(name, [key for key in declared if key not in value], by_words=True)
    if close:
        return f"unknown {noun}; did you mean {quote(close[0])}?"
    if not declared:
        return f"unknown {noun} (none is expected)"
    return f"unknown {noun} (expected: {_listing(declared)})"


def _bound(keyword: str, expected: Any, schema: Mapping[str, Any], value: Any) -> str | None:
    """How a bound the value broke is said (with the value sent), or None for another keyword."""
    if keyword in ("minimum", "maximum") and "minimum" in schema and "maximum" in schema:
        return f"must be between {schema['minimum']:,} and {schema['maximum']:,}, got {_shown(value)}"
    words = {
        "minimum": "at least",
        "maximum": "at most",
        "exclusiveMinimum": "greater than",
        "exclusiveMaximum": "less than",
    }.get(keyword)
    if words is not None:
        return f"must be {words} {expected:,}, got {_shown(value)}"
    if keyword == "minLength":
        return "must not be empty" if expected == 1 else f"must be at least {expected:,} characters, got {len(value):,}"
    if keyword == "maxLength":
        return f"must be at most {expected:,} characters, got {len(value):,}"
    if keyword in ("minItems", "maxItems"):
        return f"must have {'at least' if keyword == 'minItems' else 'at most'} {expected:,} items, got {len(value):,}"
    if keyword == "pattern":
        return f"must match the pattern `{expected}`, got {_shown(value)}"
    return None


def _own_words(error: Any) -> str:
    """jsonschema's message for a rarer keyword, the value it quotes shown as the client wrote it (JSON, cut)."""
    message = str(error.message)
    value = error.instance
    if message.startswith(repr(value)):
        message = _shown(value) + message[len(repr(value)) :]
    return message if len(message) <= _MESSAGE_CHARS else message[:_MESSAGE_CHARS] + "…"


def _shown(value: Any) -> str:
    """``value`` as JSON, the way the client wrote it, cut to ``ECHO_CHARS`` characters with the full length said."""
    text = json.dumps(value, ensure_ascii=False, default=repr)
    if _lone_surrogate(text) is not None:
        text = json.dumps(value, default=repr)
    return text if len(text) <= ECHO_CHARS else f"{text[:ECHO_CHARS]}… ({len(text):,} characters)"


def _described(value: Any) -> str:
    """``value``'s JSON type and the value itself (``string "ten"``, ``boolean true``, ``null``)."""
    if value is None:
        return "null"
    kind = next((name for cls, name in _JSON_TYPES if isinstance(value, cls)), None)
    return f"{kind} {_shown(value)}" if kind is not None else type(value).__name__


_JSON_TYPES: tuple[tuple[type | tuple[type, ...], str], ...] = (
    (bool, "boolean"),  # before int: a bool is an int in Python
    (int, "integer"),
    (float, "number"),
    (str, "string"),
    ((list, tuple), "array"),
    (Mapping, "object"),
)


def _listing(items: Sequence[str]) -> str:
    shown = ", ".join(items[:_LISTED])
    return shown if len(items) <= _LISTED else f"{shown}, … ({len(items):,} in all)"
