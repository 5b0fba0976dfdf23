"""What every section of federation.yaml is built on: a frozen model that refuses unknown keys, and the checks of
values several sections share (tool names, URLs, paths relative to the file's folder)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import BaseModel, BeforeValidator, ConfigDict, ValidationInfo

__all__ = [
    "TOOL_NAME_RE",
    "Model",
    "Problem",
    "PinMode",
    "SecretsMode",
    "check_tool_name",
    "check_url",
    "resolve",
    "resolve_env_paths",
]

Problem = tuple[tuple[str, ...], str]
"""What is wrong and where: (the key path, as a tuple of keys; a sentence)."""

TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""Published tool names: SEP-986 characters, at most 64 long (the limit several model APIs enforce)."""

SecretsMode = Annotated[
    Literal["off", "record", "redact", "block"], BeforeValidator(lambda value: "off" if value is False else value)
]
"""What the gateway does with a credential in a call's arguments or answer (gateway/core/leaks.py); YAML reads a bare
``off`` as false, which means ``off`` here."""
PinMode = Annotated[
    Literal["off", "warn", "enforce"], BeforeValidator(lambda value: "off" if value is False else value)
]
"""What an unapproved tool definition of a server does (gateway/core/pins.py); a bare ``off`` as for SecretsMode."""


class Model(BaseModel):
    """A section of federation.yaml: immutable once read, and an unknown key is an error, never ignored."""

    model_config = ConfigDict(frozen=True, extra="forbid")


def check_tool_name(name: str) -> str:
    if not TOOL_NAME_RE.fullmatch(name):
        raise ValueError(
            f"tool name {name!r} is invalid: use 1 to 64 characters from A-Z a-z 0-9 _ . - (it has {len(name)})"
        )
    return name


def check_url(value: str, what: str) -> str:
    """An absolute http(s) URL without fragment; plain http only for a loopback host (a token or a key fetched in
    the clear from anywhere else could be swapped on the way)."""
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"{what} must be an absolute https URL without user info or fragment (got {value!r})")
    if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"{what} must use https unless its host is loopback (got {value!r})")
    return value


def resolve(value: str | None, info: ValidationInfo) -> str | None:
    """A path as written, ``~`` expanded, made absolute against the file's folder (when read from a file)."""
    if value is None:
        return None
    base = (info.context or {}).get("base_dir")
    path = Path(value).expanduser()
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    return str(path)


def resolve_env_paths(value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    """Environment values written as relative paths (``./x``, ``../x``) resolve against the file's folder.

    A program may resolve a relative path against anything (npm's server-memory uses its own install folder), so
    the gateway hands it an absolute path: ``MEMORY_FILE_PATH: ./.cache/memory.jsonl`` means next to federation.yaml.
    """
    if (info.context or {}).get("base_dir") is None:
        return value  # no file to be relative to (a configuration built in memory): as written
    return {k: (resolve(v, info) or v) if v.startswith(("./", "../")) else v for k, v in value.items()}
