"""What a caller's input must be before the gateway acts on it, and how it is quoted back in an error.

Three rules hold at the edge of every request, so nothing downstream (a pipe's UTF-8 encoder, pydantic's serializer,
an argv, a path join, the ledger) ever meets input it cannot handle:
  * every string, key or value, is valid Unicode text: a lone surrogate (JSON ``"\\ud800"``, which Python's ``json``
    accepts) cannot be encoded as UTF-8 and would fail wherever the value is next written;
  * numbers are finite: ``NaN`` and ``Infinity`` (which ``json`` and pydantic accept) are not JSON, and would reach
    the tool as ``null``;
  * nesting is bounded (``MAX_DEPTH`` by default; ``gateway.edge.max_argument_depth``): pydantic refuses to serialise
    beyond a few hundred levels, ``json`` beyond the recursion limit.

``problem(value)`` finds the first breach as (path, reason); ``argument_problem`` names the argument, and the router
refuses a ``tools/call`` with it as invalid params. ``quote(text)`` (errors.py) is the one way client input is echoed
into an error message: cut to ``ECHO_CHARS`` characters, so an error can never be as large as the request behind it.
"""

from __future__ import annotations

import math
from typing import Any

from gateway.errors import ECHO_CHARS, quote

__all__ = ["ECHO_CHARS", "MAX_DEPTH", "argument_problem", "problem", "quote"]

MAX_DEPTH = 64
"""Nesting levels an argument value may have (``{"a": {"b": 1}}`` is 2 deep); far above what any tool schema uses,
far below the few hundred where pydantic's serializer and ``json`` give up."""


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
