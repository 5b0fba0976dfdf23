"""What the models refuse, said in plain words: pydantic's error types as sentences about the key ("must be one of
never, conditional, always"), and the guesses at a misspelling ("did you mean `stdio`?") for an unknown key, an
enum value and a transport. ``plain`` words one error; ``keys_at`` knows which keys the schema allows where, by
walking the models (``Federation`` down to the location). Values are not quoted here: loading.py adds what was
written, never a value taken from the environment."""

from __future__ import annotations

import re
import types
import typing
from collections.abc import Collection, Sequence
from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel

from gateway.errors import did_you_mean

__all__ = ["guess", "keys_at", "plain"]

_QUOTED = re.compile(r"'([^']*)'")
_PATTERNS = {
    "^https?://": "must be an http:// or https:// URL",
    "^[^/]+/[^/]+$": "must be written `backend/tool`",
    "^[A-Za-z0-9_-]{1,48}$": "must be 1 to 48 characters from A-Z a-z 0-9 _ -",
}
"""Patterns the models use, as what they mean."""
_PLAIN = {
    "bool_parsing": "must be true or false",
    "bool_type": "must be true or false",
    "int_parsing": "must be a whole number",
    "int_type": "must be a whole number",
    "int_from_float": "must be a whole number",
    "float_parsing": "must be a number",
    "float_type": "must be a number",
    "string_type": "must be text",
    "dict_type": "must be a mapping (`key: value` lines)",
    "model_type": "must be a mapping (`key: value` lines)",
    "model_attributes_type": "must be a mapping (`key: value` lines)",
    "list_type": "must be a list (`[a, b]`)",
    "tuple_type": "must be a list (`[a, b]`)",
    "set_type": "must be a list (`[a, b]`)",
}
"""Error types whose whole meaning is the type the key must have."""


def choices(expected: str) -> list[str]:
    """The quoted values of pydantic's ``'a', 'b' or 'c'`` (a lone unquoted value, such as ``1``, as it is)."""
    found = _QUOTED.findall(expected)
    return found or [expected]


def plain(err: Any) -> tuple[str, list[str]] | None:
    """``err`` (one of pydantic's errors) as a sentence about its key, and the values it may take (for a guess at a
    misspelling; empty when they are not a short list); None when pydantic's own words are the plainest."""
    kind, ctx = err["type"], err.get("ctx") or {}
    if kind in _PLAIN:
        return _PLAIN[kind], []
    if kind == "literal_error":
        allowed = choices(str(ctx.get("expected", "")))
        return (f"must be {allowed[0]}" if len(allowed) == 1 else f"must be one of {', '.join(allowed)}"), allowed
    if kind == "union_tag_invalid":
        allowed = choices(str(ctx.get("expected_tags", "")))
        return f"unknown transport: use one of {', '.join(allowed)}", allowed
    if kind == "greater_than":
        return f"must be greater than {_number(ctx.get('gt'))}", []
    if kind == "greater_than_equal":
        return f"must be at least {_number(ctx.get('ge'))}", []
    if kind == "less_than":
        return f"must be less than {_number(ctx.get('lt'))}", []
    if kind == "less_than_equal":
        return f"must be at most {_number(ctx.get('le'))}", []
    if kind == "string_too_short":
        least = ctx.get("min_length", 1)
        return ("must not be empty" if least == 1 else f"must be at least {least} characters long"), []
    if kind == "string_too_long":
        return f"must be at most {ctx.get('max_length')} characters long", []
    if kind == "too_short":
        least = ctx.get("min_length", 1)
        return f"must have at least {least} item{'' if least == 1 else 's'}", []
    if kind == "too_long":
        return f"must have at most {ctx.get('max_length')} items", []
    if kind == "string_pattern_mismatch":
        pattern = str(ctx.get("pattern", ""))
        return _PATTERNS.get(pattern, f"must match the pattern {pattern}"), []
    return None


def _number(value: Any) -> Any:
    """A bound as written in a file: ``0``, not ``0.0``."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def guess(written: object, allowed: Collection[str]) -> str:
    """``; did you mean `X`?`` when ``written`` looks like a misspelling of one of ``allowed``, else ""."""
    if not isinstance(written, str) or not allowed:
        return ""
    close = did_you_mean(written, allowed)
    return f"; did you mean `{close[0]}`?" if close else ""


def keys_at(loc: Sequence[int | str], root: type[BaseModel]) -> list[str]:
    """The keys the schema allows in the mapping at ``loc`` (a pydantic error location, union tags included), below
    ``root``; empty when that mapping's keys are free (``env``, ``servers``) or the location is not a model's."""
    annotation: Any = root
    for part in loc:
        annotation = _step(annotation, str(part))
        if annotation is None:
            return []
    model = _model(annotation)
    return list(model.model_fields) if model is not None else []


def _step(annotation: Any, part: str) -> Any:
    """The annotation one key (or index, or union tag) below ``annotation``; None when there is none."""
    model = _model(annotation)
    if model is not None:
        field = model.model_fields.get(part)
        return field.annotation if field is not None else None
    annotation = _unwrapped(annotation)
    origin = get_origin(annotation)
    if origin is dict:
        return get_args(annotation)[1]
    if origin in (tuple, list, set, frozenset):
        return get_args(annotation)[0]
    if origin in (typing.Union, types.UnionType):
        for member in get_args(annotation):  # a discriminated union: the member whose tag is ``part``
            tagged = _model(member)
            if tagged is not None and any(_tags(f.annotation) == (part,) for f in tagged.model_fields.values()):
                return tagged
    return None


def _tags(annotation: Any) -> tuple[Any, ...]:
    return get_args(annotation) if get_origin(annotation) is Literal else ()


def _unwrapped(annotation: Any) -> Any:
    """``annotation`` without ``Annotated`` and without ``None`` in an optional."""
    while True:
        origin = get_origin(annotation)
        if origin is typing.Annotated:
            annotation = get_args(annotation)[0]
        elif origin in (typing.Union, types.UnionType):
            members = [a for a in get_args(annotation) if a is not type(None)]
            if len(members) != 1:
                return annotation
            annotation = members[0]
        else:
            return annotation


def _model(annotation: Any) -> type[BaseModel] | None:
    annotation = _unwrapped(annotation)
    return annotation if isinstance(annotation, type) and issubclass(annotation, BaseModel) else None
