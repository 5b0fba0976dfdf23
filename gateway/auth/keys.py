"""The gateway's state key: what seals ``requestState`` and session ids (front/) and encrypts the tokens it holds for
callers (auth/connections.py), the same in every replica.

``load_key``: the environment variable named by ``gateway.continuation.key_env`` (several, comma-separated, for a
rotation: the first seals, all open); else a random key kept in a file beside the audit ledger
(``<audit.path>.state-key``, created 0600 on first use, so a restart keeps it); else (ledger off) a key of this
process alone.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path

from gateway.errors import ConfigError

__all__ = ["MIN_KEY_CHARS", "load_key"]

MIN_KEY_CHARS = 32
_MIN_KEY_CHARS = MIN_KEY_CHARS


def load_key(env_name: str, env_value: str | None, ledger: str | None, *, file: str = "") -> tuple[list[bytes], str]:
    """The sealing keys (the first seals, every one opens) and where they came from (for the startup log line;
    never a key itself). The environment variable may hold several keys separated by commas, for a rotation: put
    the new key first and keep the old one after it for one ``ttl_s``.

    Raises:
        ConfigError: a key in the environment variable is too short, or the key file cannot be read or made.
    """
    if env_value and env_value.strip(", "):
        keys = [key.strip() for key in env_value.split(",") if key.strip()]
        for index, key in enumerate(keys):
            if len(key) < _MIN_KEY_CHARS:
                which = f"key {index + 1} of {len(keys)} in" if len(keys) > 1 else "the key in"
                raise ConfigError(
                    file,
                    "gateway.continuation.key_env",
                    None,
                    f"{which} the environment variable {env_name} has {len(key)} characters; a requestState key "
                    f"needs at least {_MIN_KEY_CHARS} of secret randomness "
                    '(python -c "import secrets; print(secrets.token_hex(32))")',
                )
        return [key.encode() for key in keys], f"environment variable {env_name}" + (
            f" ({len(keys)} keys, the first seals)" if len(keys) > 1 else ""
        )
    if ledger is None:
        return [os.urandom(32)], "this process only"
    path = Path(ledger).with_name(Path(ledger).name + ".state-key")
    try:
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except FileExistsError:
            key = path.read_text().strip()
        else:
            key = secrets.token_hex(32)
            with os.fdopen(fd, "w") as out:
                out.write(key + "\n")
    except OSError as exc:
        problem = f"the requestState key file {path} cannot be used: {exc.strerror or exc}"
        raise ConfigError(file, "gateway.audit.path", None, problem) from exc
    if len(key) < _MIN_KEY_CHARS:
        problem = f"the requestState key file {path} holds {len(key)} characters, fewer than {_MIN_KEY_CHARS}"
        raise ConfigError(file, "gateway.audit.path", None, problem)
    return [key.encode()], f"file {path.name} beside the audit ledger"
