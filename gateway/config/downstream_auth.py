"""How the gateway authenticates to a downstream server beyond static headers: RFC 8693 token exchange
(``token_exchange:``) and the gateway as an OAuth client (``auth: {oauth: ...}``: per caller, or its own identity by
``client_credentials``, ``cross_app`` or a workload token)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

import jwt
from pydantic import Field, ValidationInfo, field_validator, model_validator

from gateway.config.base import Model, check_url, resolve

__all__ = [
    "CrossApp",
    "DownstreamAuth",
    "DownstreamOAuth",
    "SigningAlgorithm",
    "TokenExchange",
    "check_signing_key",
    "one_of_value_or_file",
]


class TokenExchange(Model):
    """OAuth 2.0 Token Exchange (RFC 8693): each caller's own downstream token, minted from the caller's access
    token by the identity provider (gateway/auth/exchange.py)."""

    token_endpoint: str = Field(pattern=r"^https?://")
    """The authorization server's token endpoint (``https``; plain ``http`` only on loopback)."""
    client_id: str = Field(min_length=1)
    client_secret: str = Field(min_length=1)
    """The gateway's own client secret at the token endpoint (write ``${VAR}``; never logged)."""
    audience: str | None = None
    """The ``audience`` asked for (the downstream's name at the provider)."""
    resource: str | None = None
    """The ``resource`` asked for (RFC 8707: the downstream's URI)."""
    scope: str | None = None
    timeout_s: float = Field(default=10.0, gt=0, le=60)

    @field_validator("token_endpoint")
    @classmethod
    def _endpoint_url(cls, value: str) -> str:
        return check_url(value, "token_endpoint")  # a caller's token must not travel in the clear


SigningAlgorithm = Literal["RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA"]
"""The asymmetric JWS algorithms a client assertion may be signed with (never ``none`` or a MAC)."""


def check_signing_key(pem: str, algorithm: str) -> None:
    """That ``pem`` is a private key ``algorithm`` signs with (its text never in the message).

    Raises:
        ValueError: it is not a PEM private key, or not one of that algorithm's kind.
    """
    try:
        jwt.encode({"check": True}, pem, algorithm=algorithm)
    except (ValueError, TypeError, jwt.PyJWTError) as exc:
        kind = "not a PEM private key" if "-----BEGIN" not in pem else f"not a key {algorithm} signs with"
        raise ValueError(f"the client assertion key is {kind} ({type(exc).__name__})") from None


def one_of_value_or_file(model: Model, key: str, *, required: bool) -> None:
    """``key`` given as a value (write ``${VAR}``) or as ``{key}_file`` (a file read afresh at each use: platforms
    rotate such files), not both; with ``required``, one of them; a file must be readable now.

    Raises:
        ValueError: both, or neither when ``required``, or the file cannot be read (never its content).
    """
    value, path = getattr(model, key), getattr(model, f"{key}_file")
    if value is not None and path is not None:
        raise ValueError(f"give {key} or {key}_file, not both")
    if required and value is None and path is None:
        raise ValueError(f"give {key} (write ${{VAR}}) or {key}_file (a file read afresh at each use)")
    if path is not None:
        try:
            with Path(path).open("rb"):
                pass
        except OSError as exc:
            raise ValueError(f"{key}_file {path} cannot be read ({type(exc).__name__})") from None


class CrossApp(Model):
    """Cross App Access (SEP-990, Enterprise-Managed Authorization): the gateway's token at a server, obtained
    from the enterprise identity provider's ID token instead of a user's consent (backends/mcp/cross_app.py)."""

    token_endpoint: str
    """The identity provider's token endpoint, where the ID token is exchanged for an ID-JAG (RFC 8693)."""
    client_id: str = Field(min_length=1)
    """The gateway's client id at the identity provider."""
    client_secret: str | None = Field(default=None, min_length=1)
    """Its secret there, when the identity provider wants one (write ``${VAR}``; never logged)."""
    id_token: str | None = Field(default=None, min_length=1)
    """The ID token the identity provider issued to the gateway (write ``${VAR}``; never logged)."""
    id_token_file: str | None = None
    """The same, read from a file at each exchange (a path, relative to the configuration's folder)."""
    issuer: str | None = None
    """The server's authorization server (its issuer), fixed: the server's resource metadata is then not asked, so
    it cannot send the ID-JAG and the client secret elsewhere. Default: the one that metadata names."""

    @field_validator("token_endpoint", "issuer")
    @classmethod
    def _endpoint_url(cls, value: str | None, info: ValidationInfo) -> str | None:
        # an ID token, an ID-JAG or a secret must not travel in the clear
        return None if value is None else check_url(value, str(info.field_name))

    _resolve_id_token_file = field_validator("id_token_file")(resolve)

    @model_validator(mode="after")
    def _id_token(self) -> CrossApp:
        one_of_value_or_file(self, "id_token", required=True)
        return self


class DownstreamOAuth(Model):
    """The gateway as an OAuth client of a streamable HTTP server (MCP authorization; backends/mcp/signin.py).

    ``per: caller``: each caller signs in with their own account at ``/connect/<server>`` (authorization code with
    PKCE and ``resource``; the client is registered by Client ID Metadata Document, else Dynamic Client Registration,
    else ``client_id``/``client_secret``), and their calls go on their own session with their own token.
    ``per: gateway``: the gateway's own service identity (``client_credentials`` with ``client_id`` and
    ``client_secret``, or a client assertion signed with ``private_key``/``private_key_file``; an ID-JAG by
    ``cross_app``; a workload token) serves every caller."""

    per: Literal["caller", "gateway"] = "caller"
    client_id: str | None = Field(default=None, min_length=1)
    """A client registered with the server's authorization server beforehand (needed for ``per: gateway``)."""
    client_secret: str | None = Field(default=None, min_length=1)
    """Its secret (write ``${VAR}``; never logged)."""
    client_metadata_url: str | None = None
    """An https URL where the gateway's client metadata document is published (CIMD), used as the client id by an
    authorization server that supports it."""
    private_key: str | None = Field(default=None, min_length=1)
    """``per: gateway``: a PEM private key the gateway signs its client assertion with at the token endpoint
    (``private_key_jwt``, RFC 7523) instead of a secret (write ``${VAR}``; never logged)."""
    private_key_file: str | None = None
    """The same, read from a PEM file (a path, relative to the configuration's folder)."""
    signing_algorithm: SigningAlgorithm = "RS256"
    """The assertion's ``alg``; it must fit the key (an EC P-256 key: ``ES256``)."""
    scope: str | None = None
    """The scopes asked for; default: those the server's challenge or metadata names."""
    allow_http: bool = False
    """Whether metadata, registration and token endpoints may be plain ``http`` on a loopback host (tests only);
    otherwise every URL learned from the server must be ``https``."""
    timeout_s: float = Field(default=10.0, gt=0, le=60)
    """The longest each discovery, registration or token request may take."""
    cross_app: CrossApp | None = None
    """``per: gateway``: the token comes from the identity provider's ID token (an ID-JAG presented to the server's
    authorization server with the ``jwt-bearer`` grant, authenticated with ``client_id``/``client_secret``)."""
    workload_token: str | None = Field(default=None, min_length=1)
    """``per: gateway``: a JWT the platform issued to the gateway's workload (a Kubernetes service account token, a
    cloud workload identity token), presented as a public client with the ``jwt-bearer`` grant (RFC 7523, workload
    identity federation, SEP-1933) instead of a client secret (write ``${VAR}``; never logged)."""
    workload_token_file: str | None = None
    """The same, read from a file at each grant (platforms rotate it; a path, relative to the configuration's
    folder)."""

    @field_validator("client_metadata_url")
    @classmethod
    def _cimd_url(cls, value: str | None) -> str | None:
        if value is not None and (not value.startswith("https://") or value.rstrip("/").count("/") < 3):
            raise ValueError(f"client_metadata_url must be an https URL with a path (got {value!r})")
        return value

    _resolve_files = field_validator("private_key_file", "workload_token_file")(resolve)

    @model_validator(mode="after")
    def _client(self) -> DownstreamOAuth:
        if self.client_secret is not None and self.client_id is None:
            raise ValueError("client_secret needs client_id")
        one_of_value_or_file(self, "workload_token", required=False)
        if self.workload_token is not None or self.workload_token_file is not None:
            return self._workload()
        keys = [k for k in ("client_secret", "private_key", "private_key_file") if getattr(self, k) is not None]
        if self.per == "gateway" and (self.client_id is None or len(keys) != 1):
            raise ValueError(
                "per: gateway signs in with client_credentials: give client_id and one of client_secret, "
                f"private_key or private_key_file (given: {', '.join(keys) or 'none'})"
            )
        if self.per == "caller" and (self.private_key or self.private_key_file):
            raise ValueError("private_key and private_key_file are for per: gateway (client_credentials)")
        if self.cross_app is not None and (self.per != "gateway" or self.client_secret is None):
            raise ValueError(
                "cross_app is the gateway's own identity: it needs per: gateway with client_id and client_secret "
                "(the authorization server authenticates the ID-JAG's client with client_secret_basic)"
            )
        if self.signing_key() is not None:
            check_signing_key(self.signing_key() or "", self.signing_algorithm)
        return self

    def _workload(self) -> DownstreamOAuth:
        if self.per != "gateway":
            raise ValueError("workload_token and workload_token_file are the gateway's own identity: use per: gateway")
        others = [k for k in ("client_secret", "private_key", "private_key_file", "cross_app") if getattr(self, k)]
        if others:
            raise ValueError(
                "a workload token is presented as a public client (the token is the credential): remove "
                + ", ".join(others)
            )
        return self

    def signing_key(self) -> str | None:
        """The PEM text of ``private_key`` or ``private_key_file`` (None: neither is set).

        Raises:
            ValueError: the file cannot be read.
        """
        if self.private_key_file is None:
            return self.private_key
        try:
            return Path(self.private_key_file).read_text()
        except (OSError, UnicodeDecodeError) as exc:
            raise ValueError(
                f"private_key_file {self.private_key_file} cannot be read ({type(exc).__name__})"
            ) from None


class DownstreamAuth(Model):
    """How the gateway authenticates to a downstream server beyond static headers."""

    oauth: DownstreamOAuth
