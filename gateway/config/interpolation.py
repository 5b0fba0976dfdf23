"""``${VAR}`` and ``${VAR:-default}`` in federation.yaml's string values, taken from the environment, and the
record of what they put in, so that no error message ever shows a value that came from the environment: wherever a
message would echo one, it reads as written in the file (``${DS_TOKEN}``). A switched-off backend's variables need
not be set: ``switched_off`` finds those backends, and ``stand_in`` is the value checked in place of one that cannot
be checked as written (a ``url: ${URL}``)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from gateway.config.base import Problem

__all__ = ["UNSET_STAND_IN", "Expansions", "interpolate", "stand_in", "switched_off"]

_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")
_FALSE = frozenset({"false", "f", "no", "n", "off", "0"})  # what pydantic reads as false in a string
UNSET_STAND_IN = "http://unset.invalid"
"""What a switched-off backend's unset ``${VAR}`` is checked as, when its text as written is refused: it fits a URL
and a string, and names no real host."""


class Expansions:
    """What interpolation put into the document, so that no error message shows it.

    An error message may echo a value: pydantic's own (``Input tag 'x' found ...``), the ``(got ...)`` the loader
    adds, a validator's (``tool name 'x' is invalid``). ``redact`` puts back, for each value taken from the
    environment and each string value it was part of, the text written in the file: at the error's key path (and
    below it) what was written there; elsewhere every form that produced the value (two variables may hold the
    same text: ``${A} or ${B}``, never only the one read first). A value of fewer than ``_MASK_ANYWHERE``
    characters is replaced only where it stands quoted, so that ``greater than 0`` keeps its 0.
    """

    _MASK_ANYWHERE = 4

    def __init__(self) -> None:
        self.written: dict[str, dict[str, None]] = {}
        """expanded text -> the forms written for it (``${NAME}`` for a variable's value; ``Bearer ${NAME}`` for
        a whole value), in the order read"""
        self.at: dict[str, dict[str, dict[str, None]]] = {}
        """dotted key path -> expanded text -> the forms written for it at that key"""

    def add(self, expanded: str, written: str, path: tuple[str, ...]) -> None:
        if expanded and expanded != written:
            self.written.setdefault(expanded, {})[written] = None
            self.at.setdefault(".".join(path), {}).setdefault(expanded, {})[written] = None

    def _near(self, at: str | None) -> dict[str, str]:
        if at is None:
            return {}
        near: dict[str, dict[str, None]] = {}
        for path, values in self.at.items():
            if path == at or path.startswith(f"{at}."):
                for expanded, forms in values.items():
                    near.setdefault(expanded, {}).update(forms)
        return {expanded: " or ".join(forms) for expanded, forms in near.items()}

    def as_written(self, value: object, at: str | None = None) -> object:
        """The value as the file wrote it (at key path ``at``, when given), when interpolation produced it."""
        if not isinstance(value, str):
            return value
        near = self._near(at)
        if value in near:
            return near[value]
        forms = self.written.get(value)
        return " or ".join(forms) if forms else value

    def redact(self, text: str, at: str | None = None) -> str:
        """``text`` with every expanded value put back as written (preferring what key path ``at`` wrote)."""
        near = self._near(at)
        mapping = {expanded: " or ".join(forms) for expanded, forms in self.written.items()} | near
        for expanded in sorted(mapping, key=len, reverse=True):
            written = mapping[expanded]
            if len(expanded) >= self._MASK_ANYWHERE:
                text = text.replace(expanded, written)
            else:
                for quote in ("'", '"'):
                    text = text.replace(f"{quote}{expanded}{quote}", f"{quote}{written}{quote}")
        return text


def interpolate(
    value: Any, env: Mapping[str, str], expansions: Expansions, problems: list[Problem], path: tuple[str, ...] = ()
) -> Any:
    """``value`` (a parsed document) with every reference in its strings replaced from ``env``, recorded in
    ``expansions``. A variable that is not set (and has no default) is a problem at the key that references it;
    that string stays as written."""
    if isinstance(value, dict):
        return {k: interpolate(v, env, expansions, problems, (*path, str(k))) for k, v in value.items()}
    if isinstance(value, list):
        return [interpolate(v, env, expansions, problems, (*path, str(i))) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value
    missing: list[str] = []

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        found = env.get(name)
        if default is not None and not found:  # like the shell's ${VAR:-default}: an empty value takes the default
            return default
        if found is None:
            missing.append(name)
            return match.group(0)
        expansions.add(found, f"${{{name}}}", path)
        return found

    expanded = _ENV_REF.sub(replace, value)
    if missing:
        problems.append((path, f"environment variable {missing[0]} is not set (referenced as ${{{missing[0]}}})"))
        return value
    expansions.add(expanded, value, path)
    return expanded


def stand_in(value: str) -> str:
    """``value`` with each reference replaced by ``UNSET_STAND_IN``."""
    return _ENV_REF.sub(UNSET_STAND_IN, value)


def switched_off(data: Mapping[str, Any]) -> list[tuple[str, ...]]:
    """The key paths of the backends a document switches off (``enabled: false``): a server, an adapter, the wiki."""
    found: list[tuple[str, ...]] = []
    for section in ("servers", "adapters"):
        entries = data.get(section)
        if isinstance(entries, Mapping):
            found += [(section, str(name)) for name, entry in entries.items() if _off(entry)]
    if _off(data.get("wiki")):
        found.append(("wiki",))
    return found


def _off(entry: Any) -> bool:
    if not isinstance(entry, Mapping):
        return False
    enabled = entry.get("enabled", True)
    if isinstance(enabled, str):
        return enabled.strip().lower() in _FALSE
    return enabled is False or (type(enabled) is int and enabled == 0)
