"""Teaching the log redactor a configuration's secrets, before anything is logged: shared by every command that reads
federation.yaml (``audit`` too), so it imports only the configuration, the tokens and the redactor, never the server."""

from __future__ import annotations

from gateway.auth.tokens import Tokens
from gateway.config import Federation, environ
from gateway.observe.logs import config_secrets, redactor

__all__ = ["register_secrets"]


def register_secrets(config: Federation) -> None:
    """Teach the log redactor every secret the configuration carries (the rules: ``logs.config_secrets``) and
    every bearer token, before anything is logged."""
    secrets = config_secrets(config)
    tokens = environ(config.gateway.auth.tokens_env)
    if tokens:
        secrets += Tokens(tokens).secrets
    redactor.add(secrets)
