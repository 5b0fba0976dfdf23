"""The ``gateway:`` section: how the gateway listens, whom it accepts (tokens, OAuth issuers), what it records
(ledger, tracing), and the limits and timings of its edge (connections, sessions, bodies, call budget, replicas)."""

from __future__ import annotations

import re
from typing import Literal
from urllib.parse import urlsplit

from pydantic import Field, field_validator, model_validator

from gateway.config.base import TOOL_NAME_RE, Model, PinMode, SecretsMode, check_url, resolve
from gateway.config.policies import CallerLimit

__all__ = [
    "AuditSettings",
    "Auth",
    "CallBudget",
    "CircuitBreaker",
    "ContinuationSettings",
    "EdgeSettings",
    "GatewaySettings",
    "Limits",
    "Listen",
    "Naming",
    "OAuth",
    "OAuthIssuer",
    "SharedSettings",
    "TracingSettings",
]


class Listen(Model):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


_ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


class OAuthIssuer(Model):
    """One trusted authorization server whose JWT access tokens the gateway accepts."""

    issuer: str
    """The issuer identifier, exactly as the tokens' ``iss`` claim and the server's metadata carry it."""
    jwks_uri: str | None = None
    """Where its signing keys are; default: discovered from its metadata (RFC 8414, then OpenID Connect)."""
    audience: str | None = None
    """The ``aud`` its tokens must carry; default: ``gateway.auth.oauth.resource`` (RFC 8707). Only for a server
    that cannot put the resource URI there (it must still be a value that names this gateway alone)."""
    caller_claim: str = Field(default="sub", min_length=1)
    """The claim that names the caller (with the issuer's name: ``NAME:VALUE`` in the ledger and sessions)."""

    @field_validator("issuer")
    @classmethod
    def _issuer_url(cls, value: str) -> str:
        return check_url(value, "the issuer")

    @field_validator("jwks_uri")
    @classmethod
    def _jwks_url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, "jwks_uri")


class OAuth(Model):
    """The gateway as an OAuth 2.1 resource server (MCP authorization; RFC 9728, RFC 6750, RFC 8707)."""

    resource: str
    """The gateway's canonical resource URI (e.g. ``https://gateway.example.com/mcp``): tokens' ``aud`` must name
    it, and its Protected Resource Metadata is served at ``/.well-known/oauth-protected-resource`` + its path."""
    issuers: dict[str, OAuthIssuer] = Field(min_length=1)
    """Trusted authorization servers by name (1 to 32 characters from A-Z a-z 0-9 _ . -)."""
    required_scopes: tuple[str, ...] = ()
    """Scopes every token must carry (``scope`` or ``scp`` claim); a token without them is answered 403."""
    scopes_supported: tuple[str, ...] | None = None
    """Advertised in the metadata; default: ``required_scopes``."""
    algorithms: tuple[str, ...] = ("RS256", "PS256", "ES256", "EdDSA")
    """Signature algorithms accepted (asymmetric only: ``none`` and the HMAC ones are never accepted)."""
    leeway_s: float = Field(default=30.0, ge=0, le=300)
    """Clock skew allowed on ``exp``, ``nbf`` and ``iat``."""
    jwks_ttl_s: float = Field(default=3600.0, gt=0)
    """How long fetched keys are used before they are fetched again."""
    jwks_refresh_min_s: float = Field(default=30.0, ge=0)
    """A token naming an unknown key refetches the issuer's keys at most once per this many seconds."""
    fetch_timeout_s: float = Field(default=5.0, gt=0, le=60)
    """The longest a request waits for an issuer's metadata or keys."""
    token_cache_s: float = Field(default=60.0, ge=0, le=300)
    """How long a verified token is remembered (by its SHA-256 digest), so its next requests skip the signature
    check; never past its ``exp``, and forgotten when its key leaves the issuer's JWKS. 0: every request verifies."""
    token_cache_size: int = Field(default=4096, ge=1, le=1_000_000)
    """The most verified tokens remembered at once; the least recently used is forgotten first."""

    @field_validator("resource")
    @classmethod
    def _resource_url(cls, value: str) -> str:
        check_url(value, "resource")
        if urlsplit(value).query:
            raise ValueError(f"resource must not have a query (got {value!r})")
        return value

    @field_validator("issuers")
    @classmethod
    def _issuer_names(cls, value: dict[str, OAuthIssuer]) -> dict[str, OAuthIssuer]:
        for name in value:
            if not re.fullmatch(r"[A-Za-z0-9_.-]{1,32}", name):
                raise ValueError(f"issuer name {name!r} is invalid: use 1 to 32 characters from A-Z a-z 0-9 _ . -")
        seen = [spec.issuer for spec in value.values()]
        if len(set(seen)) != len(seen):
            raise ValueError("two issuers have the same `issuer` URL: a token could not say which one it is")
        return value

    @field_validator("algorithms")
    @classmethod
    def _asymmetric(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for alg in value:
            if alg not in _ASYMMETRIC_ALGORITHMS:
                raise ValueError(
                    f"algorithm {alg!r} is not accepted: use one of {', '.join(_ASYMMETRIC_ALGORITHMS)} (keys come "
                    "from the issuer's JWKS, so symmetric algorithms and 'none' are refused)"
                )
        if not value:
            raise ValueError("at least one algorithm is required")
        return value


class Auth(Model):
    tokens_env: str = "GATEWAY_TOKENS"
    """The environment variable holding the accepted bearer tokens, comma-separated."""
    metrics_requires_token: bool | None = None
    """Whether /metrics needs the bearer token; default: yes unless bound to loopback."""
    oauth: OAuth | None = None
    """JWT access tokens from trusted issuers, accepted beside the static tokens (see docs/security.md)."""
    caller_limits: tuple[CallerLimit, ...] = ()
    """Deprecated: per-caller limits are written ``policies.NAME.limits``. Read as an alias (config/policies.py
    ``limit_policies``): the first rule that matches a caller whose policy sets no ``limits`` applies."""
    caller_secrets: str | None = None
    """A YAML file of per-caller secrets, ``{CALLER: {NAME: VALUE}}``, that ``${caller.secret:NAME}`` in a server's
    headers takes its value from (caller ``"*"``: the gateway's own session, which lists the tools). Read at start and
    again when it changes; it must not be readable by group or others (docs/security.md)."""

    connect_url: str | None = None
    """The gateway's address as a browser reaches it (e.g. ``https://gateway.example.com``): sign-in links to
    OAuth-protected servers (``/connect/<server>``) and their callback (``/connect/callback``) are made under it.
    Default: ``http://`` the listen address."""

    operators: tuple[str, ...] = ()
    """Callers (static token names or ``ISSUER-NAME:SUBJECT``, globs) the status page shows everything: every backend,
    tool, policy and caller's calls. Any other caller sees there what its policy shows it, and its own calls only."""

    _resolve_secrets = field_validator("caller_secrets")(resolve)

    @field_validator("connect_url")
    @classmethod
    def _connect_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        check_url(value, "connect_url")
        if urlsplit(value).query:
            raise ValueError(f"connect_url must not have a query (got {value!r})")
        return value.rstrip("/")


class AuditSettings(Model):
    enabled: bool = True
    path: str = "audit.db"
    retention_days: float | None = Field(default=None, gt=0)
    url: str | None = None
    """A PostgreSQL ledger (a libpq URL, ``postgresql://user@host:port/db``) instead of the SQLite file at ``path``;
    its password is never shown (better: leave it to ``PGPASSWORD``/``~/.pgpass``, or write ``${VAR}``)."""
    spool_path: str | None = None
    """With ``url``: the local SQLite file rows wait in while PostgreSQL is unreachable; default ``<path>.spool``."""

    _resolve_path = field_validator("path", "spool_path")(resolve)

    @field_validator("url")
    @classmethod
    def _postgresql_url(cls, value: str | None) -> str | None:
        # A value_error: the message never echoes the value, which may hold a password.
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a PostgreSQL URL, postgresql://user@host:port/database (the value is not shown)")
        return value


class TracingSettings(Model):
    """OpenTelemetry tracing of calls and provider steps. Off by default; see docs/operations.md, "Tracing"."""

    exporter: Literal["none", "otlp", "console"] = "none"
    """``otlp``: OTLP over HTTP/protobuf to ``endpoint``; ``console``: spans as JSON on stderr; ``none``: off."""
    endpoint: str | None = Field(default=None, pattern=r"^https?://")
    """The OTLP traces URL (e.g. ``http://127.0.0.1:4318/v1/traces``); default: the exporter's own default, which
    honours ``OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`` / ``OTEL_EXPORTER_OTLP_ENDPOINT``."""
    headers: dict[str, str] = {}
    """Sent with every export (e.g. a collector's API key); every value is redacted from the logs."""
    service_name: str | None = None
    """The ``service.name`` resource attribute; default: ``gateway.name``."""
    sample_ratio: float = Field(default=1.0, ge=0.0, le=1.0)
    """The share of calls traced (parent-based: a call whose client sent a sampled trace context is traced)."""


class CircuitBreaker(Model):
    """Stop calling a backend whose calls keep failing; try it again after a cooldown (gateway/core/breakers.py)."""

    failure_threshold: int = Field(default=5, ge=1)
    """Consecutive provider failures (timeouts, crashes, transport errors) that open the circuit."""
    cooldown_s: float = Field(default=30.0, gt=0)
    """How long an open circuit skips the backend before one trial call; doubled after each failed trial."""
    max_cooldown_s: float = Field(default=300.0, gt=0)


class EdgeSettings(Model):
    """What one caller's requests may make the gateway accept and hold (docs/operations.md, "What one caller can and
    cannot do to another: input and answers")."""

    max_body_bytes: int = Field(default=32 * 1024 * 1024, ge=1024)
    """The largest POST body ``/mcp`` accepts; a larger one is refused with HTTP 413 before it is read whole."""
    max_argument_depth: int = Field(default=64, ge=1, le=200)
    """Nesting levels a request's values may have; deeper is refused as invalid params (pydantic cannot serialise
    much past 250)."""
    replay_bytes: int = Field(default=32 * 1024 * 1024, ge=0)
    """Bytes of recent SSE events kept in memory, across all streams, so a client can resume a broken stream."""
    replay_stream_bytes: int = Field(default=4 * 1024 * 1024, ge=0)
    """Bytes of recent events kept for any one stream; an event larger than this is sent but not kept."""
    client_buffer_bytes: int = Field(default=1024 * 1024, ge=1024)
    """Bytes of a request's log messages waiting for a client that does not read its stream (its progress is
    coalesced to the latest meanwhile); beyond them the request is given up for that client (front/outbox.py)."""
    send_buffer_bytes: int | None = Field(default=256 * 1024, ge=4096)
    """The kernel's send buffer of each client connection (``SO_SNDBUF``; Linux keeps twice this for its own
    bookkeeping); None leaves it to the kernel, which grows it to 4 MiB. What it holds is what a client that stops
    reading can make the gateway send before the gateway knows (front/outbox.py): bounded, a never-read flood of
    progress is given up in seconds, not tens of them. A client 100 ms away still gets about 5 MB/s."""
    client_stall_s: float = Field(default=30.0, gt=0)
    """How long a client may leave a notification of its request unread while more come; then the request is given
    up for that client, and its downstream work cancelled."""


class Naming(Model):
    mode: Literal["never", "conditional", "always"] = "conditional"
    separator: str = Field(default="__", min_length=1, max_length=4)

    @field_validator("separator")
    @classmethod
    def _separator_chars(cls, value: str) -> str:
        if not TOOL_NAME_RE.fullmatch(value):
            raise ValueError("the separator may only use the characters A-Z a-z 0-9 _ . -")
        return value


class Limits(Model):
    """What one caller can hold at the HTTP edge, so that it cannot starve the others: connections (enforced by
    ``gateway/front/http/connections.py``, the uvicorn protocol) and MCP sessions (``gateway/front/http/app.py``).
    docs/operations.md, "What one caller can and cannot do to another" (connections and sessions), explains each
    limit."""

    max_connections: int = Field(default=512, ge=1)
    """Open HTTP connections at once. At the cap a new connection evicts the oldest one still waiting for a request
    head; if none is waiting, it is answered 503 and closed. Keep it well below the open-files limit."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """From a connection's opening (or its previous response) to a complete request head; else 408 and closed."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """From a complete request head to the end of its body; else the connection is closed."""
    keep_alive_s: float = Field(default=5.0, gt=0)
    """How long a connection may be silent while no request is on it (before the first, and between requests)."""
    max_sessions: int = Field(default=1000, ge=1)
    """Open MCP sessions across all callers; beyond it ``initialize`` answers 503."""
    sessions_per_caller: int = Field(default=64, ge=1)
    """Open MCP sessions of one caller (one bearer token). At the cap its least-recently-used idle session is
    closed to make room; if all of them are busy, ``initialize`` answers 429 naming the cap."""
    session_idle_s: float = Field(default=300.0, gt=0)
    """A session with no request in flight (and no open GET stream) for this long is closed."""

    @model_validator(mode="after")
    def _shares_fit(self) -> Limits:
        if self.sessions_per_caller > self.max_sessions:
            raise ValueError(
                f"sessions_per_caller ({self.sessions_per_caller}) is larger than max_sessions ({self.max_sessions}):"
                " one caller could then take every session"
            )
        return self


class CallBudget(Model):
    """One deadline per call, shared by every rung it tries (gateway/core/budget.py; docs/configuration.md)."""

    total_s: float = Field(default=50.0, gt=0)
    """The longest a call may take, all its steps together; below the 60 s many clients give up after."""
    floor_s: float = Field(default=5.0, ge=0)
    """Time kept for the rungs after the current one: a step that is not the last one left to try runs for at most
    what remains of ``total_s`` minus this, so a slow rung never eats the time the floor needs to answer."""

    @model_validator(mode="after")
    def _floor_fits(self) -> CallBudget:
        if self.floor_s >= self.total_s:
            raise ValueError(f"floor_s ({self.floor_s:g}) must be smaller than total_s ({self.total_s:g})")
        return self


class ContinuationSettings(Model):
    """The signed ``requestState`` of multi-round-trip requests (MCP 2026-07-28, SEP-2322; front/continuation.py).

    The key seals what the client carries between rounds (which backend asked, for whom, until when), so it must be
    the same in every replica and survive a restart: set ``key_env``. Without it the gateway keeps a random key in a
    file beside the audit ledger (``<audit.path>.state-key``, mode 0600), or, with the ledger off, one per process."""

    key_env: str = "GATEWAY_STATE_KEY"
    """The environment variable holding the key (at least 32 characters of secret randomness); several keys,
    comma-separated, for a rotation: the first seals, every one opens."""
    ttl_s: float = Field(default=600.0, gt=0)
    """How long a client may take to answer one round's input requests before its retry is refused."""
    bridge_ttl_s: float = Field(default=60.0, gt=0)
    """How long a handshake-era downstream's ``elicitation/create`` / ``sampling/createMessage`` / ``roots/list``,
    turned into an input-required result for a stateless (2026-07-28) client, waits in this process for the
    client's retry; then the downstream gets an error and the retry is refused as an expired ``requestState``."""
    bridge_max_pending: int = Field(default=256, gt=0)
    """The most such waiting downstream requests this process holds at once; beyond it the downstream's request
    is refused at once (as when no client can be asked)."""
    bridge_max_per_caller: int = Field(default=16, gt=0)
    """The most of them one caller holds at once (a caller that never retries uses up its own share, never the
    others'); beyond it that caller's next one is refused at once."""


class SharedSettings(Model):
    """What several replicas behind one balancer share (docs/deployment.md, "Several replicas").

    Sessions need nothing here: a session-era client's session travels sealed in its ``Mcp-Session-Id`` under the
    ``gateway.continuation`` key (gateway/front/http/sessions.py), so every replica that holds the key serves it. The
    per-caller rate limits (``policies.NAME.limits``) are counted per replica unless ``redis_url`` is set."""

    redis_url: str | None = None
    """A Redis server (``redis://[:password@]host:port/db``, or ``rediss://``) where the per-caller request rates are
    counted, so N replicas enforce one limit, and where ended sessions are recorded, so a DELETE ends a session on
    every replica (gateway/front/http/shared.py); its password is never shown (write ``${VAR}``). Concurrent tool calls
    stay per replica."""
    redis_timeout_s: float = Field(default=0.25, gt=0, le=10)
    """The longest one request waits for Redis (connect and answer); then ``redis_down`` decides."""
    redis_down: Literal["open", "closed"] = "open"
    """When Redis cannot answer within ``redis_timeout_s``: ``open`` serves the request (counted by this replica
    alone until Redis answers again; a session served without knowing whether another replica ended it), ``closed``
    refuses it with HTTP 503."""
    session_max_age_s: float = Field(default=86400.0, gt=0)
    """How long a sealed session id is accepted after its ``initialize``, on any replica; then it answers 404 and
    the client initializes again. Without ``redis_url`` a DELETE ends a session only on the replica that served it,
    so this bounds how long an ended session's id could be revived elsewhere; with it, a DELETE ends it everywhere."""

    @field_validator("redis_url")
    @classmethod
    def _redis_url(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("redis://", "rediss://", "unix://")):
            raise ValueError("must be a Redis URL, redis://host:port/db (the value is not shown)")
        return value


class GatewaySettings(Model):
    name: str = "mcp-gateway"
    listen: Listen = Listen()
    auth: Auth = Auth()
    audit: AuditSettings = AuditSettings()
    naming: Naming = Naming()
    pin: PinMode = "off"
    """Pinned tool definitions for every server without its own ``pin``: ``off``, ``warn`` or ``enforce``."""
    secrets: SecretsMode = "record"
    """Credentials in calls' arguments and answers, for every backend without its own ``secrets``: ``record`` (the
    ledger row names kind and place, never the value), ``redact``, ``block`` or ``off`` (gateway/core/leaks.py)."""
    circuit_breaker: CircuitBreaker = CircuitBreaker()
    edge: EdgeSettings = EdgeSettings()
    drain_s: float = Field(default=5.0, gt=0)
    """How long calls in progress may take to finish when the gateway stops (SIGTERM), or, on reload, when their
    backend is removed or changed; then they are cancelled. Well under the usual 10 s before SIGKILL."""
    allow_no_backends: bool = False
    """Whether an edit of the file that leaves no backend at all (no server, adapter or wiki) applies on reload. By
    default it is refused (the configuration in effect keeps serving): an empty or truncated save is far more often
    an editor's accident than a wish to serve nothing. Starting with no backends is always allowed."""
    tracing: TracingSettings = TracingSettings()
    instructions: str | None = None
    """Sent to clients at initialize."""
    router_note: str | None = None
    """Appended to the description of every tool marked ``router: true`` (``router_note_in: each``)."""
    router_note_in: Literal["each", "once"] = "each"
    """``each``: every routed tool's description carries the note. ``once``: the instructions carry it, and one
    routed tool (``router_note_tool``) does, for clients that do not show instructions to the model."""
    router_note_tool: str | None = None
    """With ``router_note_in: once``, the published tool whose description carries the note; default: the first
    routed tool, in the catalog's order."""
    allowed_hosts: tuple[str, ...] = ()
    """Extra Host header values accepted besides loopback names (e.g. a reverse proxy's public name)."""
    allowed_origins: tuple[str, ...] = ()
    """Extra Origin values accepted besides loopback ones (exhaustive off loopback), and the only origins a
    browser-based client may talk to ``/mcp`` from across origins (CORS; docs/security.md)."""
    limits: Limits = Limits()
    """Connection and session limits at the HTTP edge."""
    costs_refresh_s: float = Field(default=60.0, gt=0)
    """How often the measured figures behind ``{cost:TOOL}`` placeholders are refreshed from the ledger and wiki."""
    call_budget: CallBudget = CallBudget()
    """Every call's total deadline, shared by its rungs (see ``CallBudget``)."""
    continuation: ContinuationSettings = ContinuationSettings()
    """The key and lifetime of the ``requestState`` the gateway hands a client between rounds (SEP-2322)."""
    shared: SharedSettings = SharedSettings()
    """What replicas behind one balancer share: sealed sessions' lifetime, per-caller rate limits in Redis."""
