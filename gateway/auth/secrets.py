"""Per-caller secrets for a server's headers: ``Authorization: Bearer ${caller.secret:github}``.

The source is one YAML file, ``gateway.auth.caller_secrets``, mapping each caller's name (a static token's name, or
``ISSUER-NAME:SUBJECT`` for a JWT) to its secrets by name::

    alice: {github: ghp_alice...}
    "corp:5f1c...": {github: ghp_bob...}
    "*": {github: ghp_readonly...}     # the gateway's own session (it lists the tools); optional

The file must not be readable by group or others, and is read again when it changes (a new per-caller session
takes the new value; open ones keep theirs until they end). Every value is registered with the log redactor the
moment it is read, and none is ever put into a reason, a status, a ledger row or an error: those name the caller
and the secret's name only. A caller without the secret a server needs is refused a session to it
(``MissingSecret``), never given another caller's.
"""

from __future__ import annotations

import stat
from collections.abc import Mapping
from pathlib import Path

import yaml

from gateway.config import CALLER_SECRET_RE
from gateway.errors import ConfigError
from gateway.observe.logs import redactor

__all__ = ["GATEWAY_CALLER", "CallerSecrets", "MissingSecret", "uses_caller_secrets"]

GATEWAY_CALLER = "*"
"""The entry whose secrets the gateway's own session to a server uses."""


class MissingSecret(Exception):
    """The caller has no secret of this name: it gets no session to the server (the message holds no value)."""


def uses_caller_secrets(headers: Mapping[str, str]) -> bool:
    return any(CALLER_SECRET_RE.search(value) for value in headers.values())


class CallerSecrets:
    """The per-caller secrets file, read when it changes (see the module docstring)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._stamp: tuple[float, int] | None = None
        self._table: dict[str, dict[str, str]] = {}
        self.refresh()

    def refresh(self) -> None:
        """Read the file again if it changed since it was last read (blocking: a stat, and a read when it moved).

        Raises:
            ConfigError: it is missing, readable by group or others, or not a mapping of mappings of strings.
        """
        file = Path(self.path)
        try:
            info = file.stat()
        except OSError as exc:
            raise ConfigError(self.path, "", None, f"cannot read the caller secrets file: {exc.strerror}") from None
        if info.st_mode & (stat.S_IRWXG | stat.S_IRWXO):
            raise ConfigError(
                self.path, "", None, "the caller secrets file is readable by group or others: chmod 600 it"
            )
        stamp = (info.st_mtime, info.st_size)
        if stamp == self._stamp:
            return
        try:
            data = yaml.safe_load(file.read_text(encoding="utf-8"))
        except (OSError, UnicodeDecodeError) as exc:
            raise ConfigError(self.path, "", None, f"cannot read the caller secrets file: {exc}") from None
        except yaml.YAMLError as exc:
            mark = getattr(exc, "problem_mark", None)
            line = mark.line + 1 if mark is not None else None
            raise ConfigError(self.path, "", line, "YAML syntax error in the caller secrets file") from None
        table: dict[str, dict[str, str]] = {}
        for caller, secrets in (data or {}).items() if isinstance(data, dict) else [(None, None)]:
            if not isinstance(caller, str) or not isinstance(secrets, dict):
                raise ConfigError(
                    self.path, str(caller or ""), None, "expected a mapping of caller -> {secret name: value}"
                )
            for name, value in secrets.items():
                if not isinstance(name, str) or not isinstance(value, str) or not value:
                    raise ConfigError(
                        self.path, f"{caller}.{name}", None, "a secret's value must be a non-empty string"
                    )
            table[caller] = dict(secrets)
        redactor.add(value for secrets in table.values() for value in secrets.values())
        self._table, self._stamp = table, stamp

    def headers_for(self, caller: str | None, headers: Mapping[str, str], *, gateway: bool = False) -> dict[str, str]:
        """``headers`` with every ``${caller.secret:NAME}`` replaced by ``caller``'s secret NAME. For the gateway's
        own session (``gateway=True``) a header whose secret its ``"*"`` entry lacks is left out.

        Raises:
            MissingSecret: ``caller`` has no such secret (naming the caller and the secret, never a value).
        """
        own = self._table.get(GATEWAY_CALLER if gateway else (caller or ""), {})
        out: dict[str, str] = {}
        for header, value in headers.items():
            missing = [n for n in CALLER_SECRET_RE.findall(value) if n not in own]
            if missing and gateway:
                continue
            if missing:
                raise MissingSecret(
                    f"caller {caller or 'anonymous'} has no secret {missing[0]!r} in the caller secrets file, which "
                    f"header {header} of this server needs"
                )
            out[header] = CALLER_SECRET_RE.sub(lambda m: own[m.group(1)], value)
        return out
