"""federation.yaml -> frozen, validated models. The only module that reads ``os.environ``.

``load_config(path)`` parses the file once, interpolates ``${VAR}`` / ``${VAR:-default}`` in string values from the
environment, validates everything (unknown keys are errors), resolves relative paths against the file's folder and
returns a ``Federation``. Any problem raises ``ConfigError`` naming the file, the key path and the line, so a broken
file never starts a half-configured gateway. A value that came from the environment never appears in an error's
message (which ``gateway check``, ``/status`` and the log show): wherever the message would echo it, it reads as
written in the file (``${DS_TOKEN}``), see ``_Expansions``.
"""

from __future__ import annotations

import difflib
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal
from urllib.parse import urlsplit

import yaml
from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    PrivateAttr,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from gateway.errors import ConfigError

__all__ = [
    "Adapter",
    "Clients",
    "Exposure",
    "AdapterTool",
    "CallBudget",
    "CallerLimit",
    "Federation",
    "Policy",
    "PolicyLimits",
    "Selection",
    "TokenExchange",
    "HttpServer",
    "OAuth",
    "OAuthIssuer",
    "RouteStep",
    "ScoreScale",
    "SearchHitsResult",
    "ServerConfig",
    "SseServer",
    "StdioServer",
    "TOOL_NAME_RE",
    "TracingSettings",
    "add_project_tools",
    "VariantProbe",
    "load_config",
]

TOOL_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{1,64}$")
"""Published tool names: SEP-986 characters, at most 64 long (the limit several model APIs enforce)."""

_BACKEND_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
WIKI_TOOLS = (
    "wiki_index",
    "files_read",
    "files_neighbors",
    "wiki_read_all",
    "wiki_search",
    "wiki_vector_search",
    "wiki_hybrid_search",
)
"""The built-in wiki's tools (backends/wiki.py serves them)."""
_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


class _Model(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


def _check_tool_name(name: str) -> str:
    if not TOOL_NAME_RE.fullmatch(name):
        raise ValueError(
            f"tool name {name!r} is invalid: use 1 to 64 characters from A-Z a-z 0-9 _ . - (it has {len(name)})"
        )
    return name


def _resolve_env_paths(value: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    """Environment values written as relative paths (``./x``, ``../x``) resolve against the file's folder.

    A program may resolve a relative path against anything (npm's server-memory uses its own install folder), so
    the gateway hands it an absolute path: ``MEMORY_FILE_PATH: ./.cache/memory.jsonl`` means next to federation.yaml.
    """
    if (info.context or {}).get("base_dir") is None:
        return value  # no file to be relative to (a configuration built in memory): as written
    return {k: (_resolve(v, info) or v) if v.startswith(("./", "../")) else v for k, v in value.items()}


def _resolve(value: str | None, info: ValidationInfo) -> str | None:
    if value is None:
        return None
    base = (info.context or {}).get("base_dir")
    path = Path(value).expanduser()
    if base is not None and not path.is_absolute():
        path = Path(base) / path
    return str(path)


# --------------------------------------------------------------------------------------------------- gateway


class Listen(_Model):
    host: str = "127.0.0.1"
    port: int = Field(default=8080, ge=0, le=65535)


_ASYMMETRIC_ALGORITHMS = ("RS256", "RS384", "RS512", "PS256", "PS384", "PS512", "ES256", "ES384", "ES512", "EdDSA")


def _check_url(value: str, what: str) -> str:
    """An absolute http(s) URL without fragment; plain http only for a loopback host (a token or a key fetched in
    the clear from anywhere else could be swapped on the way)."""
    parts = urlsplit(value)
    if parts.scheme not in ("https", "http") or not parts.hostname or parts.fragment or "@" in parts.netloc:
        raise ValueError(f"{what} must be an absolute https URL without user info or fragment (got {value!r})")
    if parts.scheme == "http" and parts.hostname not in ("127.0.0.1", "localhost", "::1"):
        raise ValueError(f"{what} must use https unless its host is loopback (got {value!r})")
    return value


class OAuthIssuer(_Model):
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
        return _check_url(value, "the issuer")

    @field_validator("jwks_uri")
    @classmethod
    def _jwks_url(cls, value: str | None) -> str | None:
        return None if value is None else _check_url(value, "jwks_uri")


class OAuth(_Model):
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
        _check_url(value, "resource")
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


class CallerLimit(_Model):
    """Limits for the callers a rule matches; each matching caller gets its own bucket and its own count."""

    name: str | None = None
    """How /metrics labels what this rule refuses; default: ``rule-N`` (its position, from 1)."""
    callers: tuple[str, ...] = ("*",)
    """Caller-name globs (``alice``, ``corp:*``): static token names, or ``ISSUER-NAME:SUBJECT`` for OAuth."""
    claims: dict[str, str] = {}
    """JWT claims the caller's token must carry with these values (a list claim must contain it); a static token
    carries none, so a rule with claims never matches one."""
    requests_per_s: float | None = Field(default=None, gt=0)
    """The sustained rate of JSON-RPC requests to /mcp (a token bucket); unset: no rate limit."""
    burst: int | None = Field(default=None, ge=1)
    """The bucket's size: requests allowed at once after a quiet spell; default: ``requests_per_s`` rounded up."""
    concurrent_calls: int | None = Field(default=None, ge=1)
    """``tools/call`` requests of one caller in flight at once; unset: no limit."""

    @model_validator(mode="after")
    def _limits_something(self) -> CallerLimit:
        if self.requests_per_s is None and self.concurrent_calls is None:
            raise ValueError("a caller limit needs requests_per_s, concurrent_calls or both")
        if self.burst is not None and self.requests_per_s is None:
            raise ValueError("burst is the size of the requests_per_s bucket: set requests_per_s too")
        return self


class Auth(_Model):
    tokens_env: str = "GATEWAY_TOKENS"
    """The environment variable holding the accepted bearer tokens, comma-separated."""
    metrics_requires_token: bool | None = None
    """Whether /metrics needs the bearer token; default: yes unless bound to loopback."""
    oauth: OAuth | None = None
    """JWT access tokens from trusted issuers, accepted beside the static tokens (see docs/security.md)."""
    caller_limits: tuple[CallerLimit, ...] = ()
    """Per-caller request rate and concurrent calls; the first rule that matches a caller applies. A caller whose
    policy (``policies:``) sets ``limits`` is limited by those instead."""
    caller_secrets: str | None = None
    """A YAML file of per-caller secrets, ``{CALLER: {NAME: VALUE}}``, that ``${caller.secret:NAME}`` in a server's
    headers takes its value from (caller ``"*"``: the gateway's own session, which lists the tools). Read at start and
    again when it changes; it must not be readable by group or others (docs/security.md)."""

    _resolve_secrets = field_validator("caller_secrets")(_resolve)


class AuditSettings(_Model):
    enabled: bool = True
    path: str = "audit.db"
    retention_days: float | None = Field(default=None, gt=0)
    url: str | None = None
    """A PostgreSQL ledger (a libpq URL, ``postgresql://user@host:port/db``) instead of the SQLite file at ``path``;
    its password is never shown (better: leave it to ``PGPASSWORD``/``~/.pgpass``, or write ``${VAR}``)."""
    spool_path: str | None = None
    """With ``url``: the local SQLite file rows wait in while PostgreSQL is unreachable; default ``<path>.spool``."""

    _resolve_path = field_validator("path", "spool_path")(_resolve)

    @field_validator("url")
    @classmethod
    def _postgresql_url(cls, value: str | None) -> str | None:
        # A value_error: the message never echoes the value, which may hold a password.
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must be a PostgreSQL URL, postgresql://user@host:port/database (the value is not shown)")
        return value


class TracingSettings(_Model):
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


class CircuitBreaker(_Model):
    """Stop calling a backend whose calls keep failing; try it again after a cooldown (gateway/health.py)."""

    failure_threshold: int = Field(default=5, ge=1)
    """Consecutive provider failures (timeouts, crashes, transport errors) that open the circuit."""
    cooldown_s: float = Field(default=30.0, gt=0)
    """How long an open circuit skips the backend before one trial call; doubled after each failed trial."""
    max_cooldown_s: float = Field(default=300.0, gt=0)


class EdgeSettings(_Model):
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


class Naming(_Model):
    mode: Literal["never", "conditional", "always"] = "conditional"
    separator: str = Field(default="__", min_length=1, max_length=4)

    @field_validator("separator")
    @classmethod
    def _separator_chars(cls, value: str) -> str:
        if not TOOL_NAME_RE.fullmatch(value):
            raise ValueError("the separator may only use the characters A-Z a-z 0-9 _ . -")
        return value


class Limits(_Model):
    """What one caller can hold at the HTTP edge, so that it cannot starve the others: connections (enforced by
    ``gateway/connections.py``, the uvicorn protocol) and MCP sessions (``gateway/http.py``). docs/operations.md,
    "What one caller can and cannot do to another" (connections and sessions), explains each limit."""

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


class CallBudget(_Model):
    """One deadline per call, shared by every rung it tries (gateway/budget.py; docs/configuration.md)."""

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


class ContinuationSettings(_Model):
    """The signed ``requestState`` of multi-round-trip requests (MCP 2026-07-28, SEP-2322; gateway/continuation.py).

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


class SharedSettings(_Model):
    """What several replicas behind one balancer share (docs/deployment.md, "Several replicas").

    Sessions need nothing here: a session-era client's session travels sealed in its ``Mcp-Session-Id`` under the
    ``gateway.continuation`` key (gateway/sessions.py), so every replica that holds the key serves it. The per-caller
    rate limits (``gateway.auth.caller_limits``) are counted per replica unless ``redis_url`` is set."""

    redis_url: str | None = None
    """A Redis server (``redis://[:password@]host:port/db``, or ``rediss://``) where the per-caller request rates are
    counted, so N replicas enforce one limit, and where ended sessions are recorded, so a DELETE ends a session on
    every replica (gateway/shared_limits.py); its password is never shown (write ``${VAR}``). Concurrent tool calls
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


class GatewaySettings(_Model):
    name: str = "mcp-gateway"
    listen: Listen = Listen()
    auth: Auth = Auth()
    audit: AuditSettings = AuditSettings()
    naming: Naming = Naming()
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
    """Appended to the description of every tool marked ``router: true``."""
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


# --------------------------------------------------------------------------------------------------- servers


class ToolFilter(_Model):
    """Which downstream tools to publish and how."""

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()
    rename: dict[str, str] = {}
    describe: dict[str, str] = {}
    router: tuple[str, ...] = ()
    """Published names (after rename) that get the router note; ``router: true`` on the server marks them all."""

    @field_validator("rename")
    @classmethod
    def _valid_targets(cls, value: dict[str, str]) -> dict[str, str]:
        for target in value.values():
            _check_tool_name(target)
        return value


class _Backend(_Model):
    enabled: bool = True
    disabled_reason: str | None = None
    timeout_s: float = Field(default=60.0, gt=0)
    """Per-call timeout for this backend's tools."""
    connect_timeout_s: float = Field(default=20.0, gt=0)
    """How long the handshake (process start + initialize) may take before the backend is marked failed."""
    ping_interval_s: float = Field(default=10.0, gt=0)
    """How often a live session is pinged, so a silently dead downstream is noticed before a call fails on it."""
    max_answer_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    """The largest answer (one JSON-RPC message: a stdio line, an SSE event, an HTTP body) taken from this server.
    A larger one fails that call alone, naming its size and this limit; the session keeps serving the others."""
    min_uptime_s: float = Field(default=30.0, ge=0)
    """How long a session must have stayed up before a reconnect starts the backoff again from its first step; a
    server that dies sooner (e.g. right after its handshake) is restarted with growing waits (0.5 s doubling to
    30 s), so a flapping server costs a few spawns per minute, not a tight loop."""
    router: bool = False
    tools: ToolFilter = ToolFilter()
    unlisted_tools: tuple[Annotated[str, AfterValidator(_check_tool_name)], ...] = ()
    """Tools this server serves without listing them in ``tools/list`` (its own names): not published, but a
    ``tools/call`` of one (under the name the naming rule gives it) is routed here like a listed tool's. An explicit
    escape hatch: unknown names are never forwarded blindly. A listed tool of the same name wins."""
    session: Literal["shared", "per_client"] = "shared"
    """``shared``: one session serves every client. ``per_client``: a client that can answer the server's own
    requests (sampling, elicitation, roots) gets its own session (for stdio, its own process), opened at its first
    call, so those requests reach exactly that client even when several call at once (see backends/relay.py)."""
    protocol: Literal["handshake", "2026-07-28"] = "handshake"
    """The era the gateway speaks to this server: ``handshake`` (``initialize``, 2025-11-25 and older) or
    ``2026-07-28`` (stateless, ``server/discover``): a server that answers with input-required results (SEP-2322)
    needs the latter; its input requests are relayed to the calling client as such."""


class StdioServer(_Backend):
    transport: Literal["stdio"]
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    secret_env: tuple[str, ...] = ()
    """Names in ``env`` whose values are secrets (redacted from logs and the ledger), besides those whose name
    already says so (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*_KEY``, ...)."""
    cwd: str | None = None

    _resolve_cwd = field_validator("cwd")(_resolve)
    _resolve_env = field_validator("env")(_resolve_env_paths)


class TokenExchange(_Model):
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
        return _check_url(value, "token_endpoint")  # a caller's token must not travel in the clear


class HttpServer(_Backend):
    transport: Literal["streamable_http"]
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = {}
    secret_headers: tuple[str, ...] = ()
    """Names in ``headers`` whose values are secrets, besides ``Authorization``, ``Cookie``, ``X-Api-Key`` and
    other names that already say so."""
    token_exchange: TokenExchange | None = None
    """Each caller's session carries ``Authorization: Bearer`` a token exchanged for the caller's own (RFC 8693)."""


class SseServer(_Backend):
    transport: Literal["sse"]
    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = {}
    secret_headers: tuple[str, ...] = ()
    """As for ``streamable_http``."""


ServerConfig = Annotated[StdioServer | HttpServer | SseServer, Field(discriminator="transport")]


# --------------------------------------------------------------------------------------------------- adapters


class ThinWhen(_Model):
    """When an answer counts as a failure worth degrading (e.g. qmd vsearch without embeddings)."""

    empty: bool = True
    """The parsed output is empty (``[]``, ``{}``, blank text)."""
    stderr_contains: str | None = None
    """... and stderr contains this text (when set)."""
    stdout_contains: str | None = None
    """... and stdout contains this text (when set), e.g. graphify's "No path found between"."""


class VariantProbe(_Model):
    """How the adapter finds out, at start and on each re-check, whether a variant can run (backends/cli.py)."""

    argv: tuple[str, ...] = Field(min_length=1)
    """Run as ``[command, *argv]`` with the adapter's environment and folder (variants with the same argv share one
    run per check)."""
    timeout_s: float = Field(default=5.0, gt=0)
    """A probe that takes longer makes the variant not ready ("probe timed out")."""
    unready_when: tuple[str, ...] = Field(min_length=1)
    """Regular expressions: a line of the probe's output (stdout, then stderr) matching one of them makes the variant
    not ready, with that line as the detected reason. A probe that exits non-zero makes it not ready too."""

    @field_validator("unready_when")
    @classmethod
    def _patterns(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for pattern in value:
            try:
                re.compile(pattern)
            except re.error as exc:
                raise ValueError(f"unready_when: {pattern!r} is not a regular expression: {exc}") from None
        return value


class Variant(_Model):
    argv: tuple[str, ...]
    timeout_s: float = Field(default=30.0, gt=0)
    thin_when: ThinWhen | None = None
    probe: VariantProbe | None = None
    """Whether this variant can run here (e.g. its models are installed); a variant found not ready is skipped at
    once by the ladder, the reason in the answer's ``_meta``. Absent: the variant is always tried."""


class ExitCodes(_Model):
    ok: tuple[int, ...] = (0,)
    no_result: tuple[int, ...] = ()
    """Codes that mean "nothing found": an ordinary answer (not an error) carrying the program's output."""
    thin: tuple[int, ...] = ()
    """Codes that mean "nothing found" as a thin answer: the step fails as ``thin`` with the program's words as the
    reason, so the route degrades to its next provider, or answers ``isError`` when none is left."""


class AdapterTool(_Model):
    description: str = ""
    router: bool = False
    input_schema: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
    argv: tuple[str, ...] | None = None
    timeout_s: float = Field(default=30.0, gt=0)
    thin_when: ThinWhen | None = None
    """For a tool without variants: when its answer counts as thin (a variant has its own ``thin_when``)."""
    switch: str | None = None
    """The argument whose value picks a variant."""
    variants: dict[str, Variant] = {}
    ladder: dict[str, str] = {}
    """variant -> the cheaper variant to try when it fails; a variant with no entry is a floor."""
    output: Literal["json_array", "json", "text"] = "text"
    exit_codes: ExitCodes = ExitCodes()
    audit: dict[str, Annotated[int, Field(ge=0)]] = {}
    """Argument previews kept in the audit ledger: name -> characters (0 = whole value); the rest only hashed."""

    @model_validator(mode="after")
    def _shape(self) -> AdapterTool:
        if self.switch is None:
            if self.argv is None:
                raise ValueError("give either `argv` or `switch` with `variants`")
            if self.variants or self.ladder:
                raise ValueError("`variants` and `ladder` need `switch` (the argument that picks a variant)")
            return self
        if not self.variants:
            raise ValueError("`switch` needs `variants`")
        if self.thin_when is not None:
            raise ValueError("a tool with `switch` takes `thin_when` on each variant, not on the tool")
        for src, dst in self.ladder.items():
            for name in (src, dst):
                if name not in self.variants:
                    raise ValueError(f"ladder names variant {name!r}, which is not in `variants`")
        seen: set[str] = set()
        for start in self.variants:  # the ladder must end: no cycles
            seen.clear()
            step: str | None = start
            while step is not None:
                if step in seen:
                    raise ValueError(f"the ladder loops through {step!r}")
                seen.add(step)
                step = self.ladder.get(step)
        return self


class Adapter(_Model):
    command: str = Field(min_length=1)
    enabled: bool = True
    disabled_reason: str | None = None
    env: dict[str, str] = {}
    """Variables set for the program. Nothing else from the gateway's environment passes, except `pass_env`."""
    pass_env: tuple[str, ...] = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR")
    secret_env: tuple[str, ...] = ()
    """Names in ``env`` or ``pass_env`` whose values are secrets, besides those whose name already says so."""
    cwd: str | None = None
    max_output_bytes: int = Field(default=50 * 1024 * 1024, gt=0)
    max_stderr_bytes: int = Field(default=1024 * 1024, gt=0)
    concurrency: int = Field(default=4, ge=1)
    probe: tuple[str, ...] | None = None
    """A health probe argv (e.g. ``[--version]``); by default only the command's presence is checked."""
    tools: dict[str, AdapterTool]

    _resolve_cwd = field_validator("cwd")(_resolve)
    _resolve_env = field_validator("env")(_resolve_env_paths)

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, value: dict[str, AdapterTool]) -> dict[str, AdapterTool]:
        for name in value:
            _check_tool_name(name)
        return value


# --------------------------------------------------------------------------------------------------- wiki


class Wiki(_Model):
    name: str = Field(default="wiki", pattern=r"^[A-Za-z0-9_-]{1,48}$")
    root: str = "./docs"
    enabled: bool = True
    disabled_reason: str | None = None
    tools: tuple[str, ...] | None = None
    router: tuple[str, ...] = ("wiki_index", "files_read", "files_neighbors", "wiki_read_all")
    read_all_max_bytes: int = Field(default=1_000_000, gt=0)
    default_max_bytes: int = Field(default=50_000, gt=0)

    _resolve_root = field_validator("root")(_resolve)

    @field_validator("tools", "router")
    @classmethod
    def _known_tools(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        unknown = [name for name in value or () if name not in WIKI_TOOLS]
        if unknown:
            raise ValueError(f"unknown wiki tool(s) {unknown}: the wiki offers {list(WIKI_TOOLS)}")
        return value


# --------------------------------------------------------------------------------------------------- routes


class RouteStep(_Model):
    provider: str = Field(pattern=r"^[^/]+/[^/]+$")
    """``backend/tool``: a downstream server's tool, an adapter's tool, or the wiki's tool (by their own names)."""
    arguments: dict[str, Any] | None = None
    """What this provider is sent, as a template over the served tool's arguments: a string that is exactly
    ``"{name}"`` becomes that argument's value (any type; the key is dropped when the argument is absent), other
    values are sent as written. Absent: the caller's arguments pass through unchanged."""
    when: dict[str, tuple[Any, ...]] = {}

    @field_validator("when", mode="before")
    @classmethod
    def _when_values(cls, value: Any) -> Any:
        if isinstance(value, dict):  # `when: {mode: keyword}` means the same as `when: {mode: [keyword]}`
            return {k: v if isinstance(v, list | tuple) else [v] for k, v in value.items()}
        return value

    """Use this provider only for calls whose argument has one of these values (an absent argument counts as its
    schema default), e.g. ``when: {mode: [keyword]}``. Other calls skip it without counting it as a failure."""

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"provider": value} if isinstance(value, str) else value


ScoreScale = Literal["bm25", "bm25_raw", "cosine", "rerank", "rrf", "unspecified"]
"""What a provider's ``score`` means (gateway/results.py says how each is brought onto a 0..1 scale)."""


class SearchHitsResult(_Model):
    """A route's declared result shape (gateway/results.py): every provider's answer becomes the same JSON array of
    ``{file, title, line, score, snippet}``, its files relative to the wiki root."""

    shape: Literal["search_hits"]
    paths: dict[str, str] = {}
    """A provider's path form -> the wiki root's: a hit's path starting with a key has that prefix replaced by the
    value (the longest key wins), e.g. ``{"qmd://docs/": "", "docs/": ""}`` for a qmd collection named ``docs`` over
    the wiki root. A path matching no key is kept as given."""
    scores: dict[str, ScoreScale] = {}
    """What each provider's score means, by ``backend/tool`` or ``backend/tool[variant]`` (the latter wins);
    an undeclared provider's scores are ``unspecified``."""

    @field_validator("scores")
    @classmethod
    def _labels(cls, value: dict[str, str]) -> dict[str, str]:
        for key in value:
            if not re.fullmatch(r"[^/\[\]]+/[^/\[\]]+(\[[^\[\]]+\])?", key):
                raise ValueError(f"scores: {key!r} is not `backend/tool` or `backend/tool[variant]`")
        return value


class Route(_Model):
    providers: tuple[RouteStep, ...] = Field(min_length=1)
    description: str | None = None
    """Replaces the description taken from the schema's provider."""
    schema_from: str | None = None
    """The provider (``backend/tool``) whose input schema and description the route publishes. Default: the first
    adapter or wiki provider (their schemas are known without a connection), else the first provider."""
    router: bool = False
    audit: dict[str, Annotated[int, Field(ge=0)]] = {}
    """Argument previews kept in the audit ledger (name -> characters, 0 = whole value)."""
    result: SearchHitsResult | None = None
    """The shape every provider's answer is brought to (``shape: search_hits``); absent: answers pass as given."""

    @model_validator(mode="before")
    @classmethod
    def _from_list(cls, value: Any) -> Any:
        return {"providers": value} if isinstance(value, list) else value


# --------------------------------------------------------------------------------------------------- clients


class Clients(_Model):
    """The context gate: which tools only large-context clients may list and call (see gateway/clients.py)."""

    large_context_tokens: int = Field(default=150_000, gt=0)
    """A client whose declared context window is at least this many tokens counts as large."""
    large_context_tools: tuple[str, ...] = ("wiki_read_all",)
    """Published tool names listed and callable only for large clients."""
    context_header: str = Field(default="X-Context-Window", min_length=1)
    """A request header in which a client (or a proxy in front of it) declares its context window, in tokens."""
    known: dict[str, int] = {}
    """clientInfo ``name`` (or ``name@version``) glob patterns, case-insensitive -> context window in tokens."""


# --------------------------------------------------------------------------------------------------- exposure


ExposureMode = Literal["all", "search", "auto"]


class Exposure(_Model):
    """How the catalog is shown to clients: every tool, or a tool search (see gateway/disclosure.py)."""

    mode: ExposureMode = "all"
    """``all``: tools/list has every tool. ``search``: it has the search tool, the call tool and ``pinned``. ``auto``:
    search when the catalog is over ``auto_tools`` tools or ``auto_tokens`` estimated tokens, or the client is below
    the context gate (``clients.large_context_tokens``); all otherwise."""
    clients: dict[str, ExposureMode] = {}
    """clientInfo ``name`` (or ``name@version``) glob patterns, case-insensitive -> mode, overriding ``mode``."""
    auto_tools: int = Field(default=60, gt=0)
    """In ``auto``: a catalog with more tools than this is searched, not listed."""
    auto_tokens: int = Field(default=20_000, gt=0)
    """In ``auto``: a tools/list estimated above this many tokens (bytes / 4) is searched, not listed."""
    pinned: tuple[str, ...] = ()
    """Published tool names listed in search mode besides the search and call tools."""
    search_tool: str = "find_tools"
    """The search tool's name."""
    call_tool: str = "call_tool"
    """The call tool's name."""
    results: int = Field(default=5, ge=1, le=50)
    """How many tools a search returns when the caller does not say."""

    _check_names = field_validator("search_tool", "call_tool")(_check_tool_name)

    @field_validator("pinned")
    @classmethod
    def _pinned_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            _check_tool_name(name)
        return value

    @model_validator(mode="after")
    def _distinct(self) -> Exposure:
        if self.search_tool == self.call_tool:
            raise ValueError(f"search_tool and call_tool must differ (both are {self.search_tool!r})")
        return self


# --------------------------------------------------------------------------------------------------- root


# --------------------------------------------------------------------------------------------------- policies


CALLER_SECRET_RE = re.compile(r"\$\{caller\.secret:([A-Za-z0-9_.-]{1,64})\}")
"""``${caller.secret:NAME}`` in a server's header value: the calling caller's secret NAME (gateway/auth/secrets.py)."""


class Selection(_Model):
    """Names (or URIs) a policy lets its callers see, as globs (``*``, ``?``, ``[...]``): ``include`` (default:
    everything), then ``exclude``."""

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()


class PolicyLimits(_Model):
    """Per-caller limits of a policy's callers (each caller its own bucket and count), as ``CallerLimit``'s."""

    requests_per_s: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)
    concurrent_calls: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _limits_something(self) -> PolicyLimits:
        if self.requests_per_s is None and self.concurrent_calls is None:
            raise ValueError("limits need requests_per_s, concurrent_calls or both")
        if self.burst is not None and self.requests_per_s is None:
            raise ValueError("burst is the size of the requests_per_s bucket: set requests_per_s too")
        return self


class Policy(_Model):
    """Who (``callers``, ``claims``, ``scopes``: all must hold) sees and may call what (``backends``, ``tools``,
    ``resources``, ``prompts``). The first policy whose conditions hold for a caller is its policy."""

    callers: tuple[str, ...] = ("*",)
    """Caller-name globs: static token names (``GATEWAY_TOKENS="alice=..."``) or ``ISSUER-NAME:SUBJECT`` of a JWT."""
    claims: dict[str, str] = {}
    """JWT claims the caller's token must carry with these values (a list claim must contain it)."""
    scopes: tuple[str, ...] = ()
    """Scopes the caller's JWT must all carry."""
    backends: Selection = Selection()
    """Backends whose tools, resources and prompts may be seen (a route: every provider's backend must be)."""
    tools: Selection = Selection()
    """Published tool names."""
    resources: Selection = Selection()
    """Published resource URIs and URI templates."""
    prompts: Selection = Selection()
    """Published prompt names."""
    limits: PolicyLimits | None = None
    """The request rate and concurrent calls allowed each of this policy's callers."""


class Federation(_Model):
    version: Literal[1] = 1
    gateway: GatewaySettings = GatewaySettings()
    servers: dict[str, ServerConfig] = {}
    adapters: dict[str, Adapter] = {}
    wiki: Wiki | None = None
    routes: dict[str, Route] = {}
    clients: Clients = Clients()
    policies: dict[str, Policy] = {}
    """Who sees and may call what, first match wins; none: every caller sees everything (gateway/auth/policies.py)."""
    exposure: Exposure = Exposure()
    _source: str = PrivateAttr(default="<memory>")

    @property
    def source(self) -> str:
        """The file this federation was read from."""
        return self._source

    @field_validator("servers", "adapters")
    @classmethod
    def _backend_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not _BACKEND_NAME_RE.fullmatch(name):
                raise ValueError(f"backend name {name!r} is invalid: use 1 to 48 characters from A-Z a-z 0-9 _ -")
        return value

    @field_validator("routes")
    @classmethod
    def _route_names(cls, value: dict[str, Route]) -> dict[str, Route]:
        for name in value:
            _check_tool_name(name)
        return value

    def cross_reference_problem(self) -> tuple[tuple[str, ...], str] | None:
        """The first reference that does not resolve, as (key path, message); None when all do."""
        seen: dict[str, str] = {}
        sections: list[tuple[str, list[str]]] = [
            ("servers", list(self.servers)),
            ("adapters", list(self.adapters)),
            ("wiki", [self.wiki.name] if self.wiki else []),
        ]
        for section, names in sections:
            for name in names:
                if name in seen:
                    path = ("wiki", "name") if section == "wiki" else (section, name)
                    return path, (
                        f"backend name {name!r} is already used in `{seen[name]}`: names must be unique across "
                        "servers, adapters and wiki"
                    )
                seen[name] = section
        for route, spec in self.routes.items():
            for step in spec.providers:
                backend, tool = step.provider.split("/", 1)
                if backend not in seen:
                    return ("routes", route), f"route {route!r} names backend {backend!r}, which is not declared"
                known = self._static_tools(backend)
                if known is not None and tool not in known:
                    return ("routes", route), (
                        f"route {route!r} names {step.provider!r}, but {backend!r} has no tool {tool!r} "
                        f"(it has {sorted(known)})"
                    )
        for name, policy in self.policies.items():
            for listed in (*(policy.backends.include or ()), *policy.backends.exclude):
                if not any(ch in listed for ch in "*?[") and listed not in seen:
                    return ("policies", name, "backends"), (
                        f"policy {name!r} names backend {listed!r}, which is not declared"
                    )
        for name, server in self.servers.items():
            headers = getattr(server, "headers", {})
            for header, value in headers.items():
                if "${caller." in value and not CALLER_SECRET_RE.search(value):
                    return ("servers", name, "headers", header), (
                        "a per-caller value is written ${caller.secret:NAME} (NAME: 1 to 64 of A-Z a-z 0-9 _ . -)"
                    )
                if CALLER_SECRET_RE.search(value) and self.gateway.auth.caller_secrets is None:
                    return ("servers", name, "headers", header), (
                        "${caller.secret:...} needs gateway.auth.caller_secrets, the file the per-caller values come "
                        "from"
                    )
        return None

    def _static_tools(self, backend: str) -> tuple[str, ...] | None:
        """The tools of an adapter or the wiki, known from configuration; None for a server (known when connected)."""
        if backend in self.adapters:
            return tuple(self.adapters[backend].tools)
        if self.wiki is not None and backend == self.wiki.name:
            return WIKI_TOOLS
        return None

    def backend_names(self) -> list[str]:
        return [*self.servers, *self.adapters] + ([self.wiki.name] if self.wiki else [])


# --------------------------------------------------------------------------------------------------- loading


class _Loader(yaml.SafeLoader):
    """A safe loader that refuses duplicate keys (plain YAML silently keeps the last) and reads every mapping key
    as the text written (plain YAML turns keys such as ``off``, ``yes`` or ``1`` into booleans and numbers)."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        seen: set[str] = set()
        result: dict[Any, Any] = {}
        for key_node, value_node in node.value:
            if not isinstance(key_node, yaml.ScalarNode):
                raise yaml.constructor.ConstructorError(
                    None, None, "a mapping key must be plain text", key_node.start_mark
                )
            key = str(key_node.value)
            if key in seen:
                raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", key_node.start_mark)
            seen.add(key)
            result[key] = self.construct_object(value_node, deep=deep)
        return result


Lines = dict[tuple[str, ...], int]


class _DuplicateKey(Exception):
    def __init__(self, path: tuple[str, ...], line: int) -> None:
        self.path = path
        self.line = line


def _line_map(node: yaml.Node | None, path: tuple[str, ...] = (), out: Lines | None = None) -> Lines:
    """Map every key path to the 1-based line of its key (raising _DuplicateKey on a key given twice)."""
    out = {} if out is None else out
    if node is None:
        return out
    out.setdefault(path, node.start_mark.line + 1)
    if isinstance(node, yaml.MappingNode):
        seen: set[str] = set()
        for key_node, value_node in node.value:
            key = str(key_node.value)
            if key in seen:
                raise _DuplicateKey((*path, key), key_node.start_mark.line + 1)
            seen.add(key)
            _line_map(value_node, (*path, key), out)
            out[(*path, key)] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _line_map(item, (*path, str(index)), out)
    return out


def _locate(loc: tuple[int | str, ...], lines: Lines) -> tuple[str, int | None]:
    """Turn a pydantic error location into (dotted key path, line), skipping union tags that are not keys."""
    matched: tuple[str, ...] = ()
    pending: tuple[str, ...] = ()
    for part in (str(p) for p in loc):
        candidate = (*matched, part)
        if candidate in lines:
            matched = candidate
            pending = ()
        elif part not in ("stdio", "streamable_http", "sse") and not part.startswith("function-"):
            pending = (*pending, part)  # a key that is missing from the file: name it, point at its parent
    key_path = ".".join((*matched, *pending))
    return key_path, lines.get(matched)


class _Expansions:
    """What ``${VAR}`` interpolation put into the document, so that no error message shows it.

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


def _interpolate(
    value: Any, path: tuple[str, ...], env: Mapping[str, str], file: str, lines: Lines, expansions: _Expansions
) -> Any:
    if isinstance(value, dict):
        return {k: _interpolate(v, (*path, str(k)), env, file, lines, expansions) for k, v in value.items()}
    if isinstance(value, list):
        return [_interpolate(v, (*path, str(i)), env, file, lines, expansions) for i, v in enumerate(value)]
    if not isinstance(value, str) or "${" not in value:
        return value

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        value = env.get(name)
        if default is not None and not value:  # like the shell's ${VAR:-default}: an empty value takes the default
            return default
        if value is not None:
            expansions.add(value, f"${{{name}}}", path)
            return value
        raise ConfigError(
            file, ".".join(path), lines.get(path), f"environment variable {name} is not set (referenced as ${{{name}}})"
        )

    expanded = _ENV_REF.sub(replace, value)
    expansions.add(expanded, value, path)
    return expanded


def parse_config(text: str, *, file: str = "<memory>", env: Mapping[str, str] | None = None) -> Federation:
    """Parse and validate federation.yaml text. Relative paths resolve against ``file``'s folder.

    Raises:
        ConfigError: naming the file, the key path and the line of the first problem.
    """
    env = os.environ if env is None else env
    loader = _Loader(text)
    try:
        node = loader.get_single_node()
        try:
            lines = _line_map(node)
        except _DuplicateKey as dup:
            message = f"duplicate key {dup.path[-1]!r} (YAML would silently keep only the last)"
            raise ConfigError(file, ".".join(dup.path), dup.line, message) from None
        data = loader.construct_document(node) if node is not None else None
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        problem = " ".join(filter(None, [exc.context, exc.problem]))
        raise ConfigError(file, "", line, f"YAML syntax error: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(file, "", None, f"YAML error: {exc}") from exc
    finally:
        loader.dispose()

    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise ConfigError(file, "", 1, "the top level must be a mapping (version, gateway, servers, ...)")
    expansions = _Expansions()
    data = _interpolate(data, (), env, file, lines, expansions)
    base_dir = str(Path(file).resolve().parent) if file != "<memory>" else None
    try:
        fed = Federation.model_validate(data, context={"base_dir": base_dir})
    except ValidationError as exc:
        errors = exc.errors(include_url=False)
        err = errors[0]
        loc = tuple(err["loc"])
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            loc = (*loc, "transport")
        key_path, line = _locate(loc, lines)
        message = err["msg"]
        misspelt = _misspelt_key(err, loc, errors)
        if misspelt is not None:
            key_path, line = _locate((*loc[:-1], misspelt), lines)
            message = f"unknown key (not part of the federation.yaml schema; did you mean `{loc[-1]}`?)"
        elif err["type"] == "extra_forbidden":
            message = "unknown key (not part of the federation.yaml schema; check its spelling)"
        elif err["type"] == "missing":
            message = "required key is missing"
        elif err["type"] == "union_tag_not_found":
            message = "required key is missing: `transport` (one of stdio, streamable_http, sse)"
        else:
            message = expansions.redact(message, at=key_path)
            if isinstance(err.get("input"), str | int | float) and err["type"] not in (
                "value_error",
                "assertion_error",
            ):
                # Scalars only (a mapping is not worth printing); as written, so an expanded value is not shown.
                message = f"{message} (got {expansions.as_written(err['input'], at=key_path)!r})"
        if message.startswith("Value error, "):
            message = message.removeprefix("Value error, ")
        raise ConfigError(file, key_path, line, message) from None  # pydantic's own text would echo the input
    unresolved = fed.cross_reference_problem()
    if unresolved is not None:
        where, what = unresolved
        raise ConfigError(file, ".".join(where), lines.get(where), expansions.redact(what, at=".".join(where)))
    fed._source = file
    return fed


def _misspelt_key(err: Any, loc: tuple[Any, ...], errors: list[Any]) -> str | None:
    """The key written beside a missing required one that looks like its misspelling (``comand`` for ``command``).

    A missing ``transport`` leaves no member of the union to check the other keys, so any sibling key may be the
    misspelling; elsewhere only a key the model also refused as unknown may be.
    """
    if err["type"] not in ("missing", "union_tag_not_found") or not isinstance(err.get("input"), dict):
        return None
    wanted = str(loc[-1])
    siblings = [key for key in err["input"] if isinstance(key, str) and key != wanted]
    if err["type"] == "missing":
        parent = loc[:-1]
        unknown = {
            str(e["loc"][-1]) for e in errors if e["type"] == "extra_forbidden" and tuple(e["loc"][:-1]) == parent
        }
        siblings = [key for key in siblings if key in unknown]
    close = difflib.get_close_matches(wanted, siblings, n=1, cutoff=0.75)
    return close[0] if close else None


def load_config(path: str | os.PathLike[str]) -> Federation:
    """Read, interpolate and validate a federation.yaml file.

    Raises:
        ConfigError: the file is missing, unreadable or invalid (names file, key path and line).
    """
    file = str(path)
    try:
        text = Path(file).read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise ConfigError(file, "", None, f"file not found{_looked_in(file)}") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(file, "", None, f"cannot read the file: {exc}") from exc
    return parse_config(text, file=file)


def _looked_in(file: str) -> str:
    """Where a relative path was looked for (a command run outside the project names only ``federation.yaml``)."""
    if Path(file).is_absolute():
        return ""
    try:
        return f" (looked for in {Path.cwd()}, the current folder)"
    except OSError:  # the current folder was removed
        return " (the current folder no longer exists)"


def environ(name: str) -> str | None:
    """Read one environment variable (the rest of the gateway does not touch ``os.environ``)."""
    return os.environ.get(name)


def add_project_tools(config_file: str, prefix: str) -> str | None:
    """Put the project's ``.tools/bin`` first on ``PATH`` when it is not there yet; the folder added, or None.

    scripts/install puts the programs the default federation names (qmd, graphify, the memory server) in
    ``.tools/bin``, not on the system's PATH, so ``.venv/bin/gateway check`` run by hand would report them "command not
    found". The folder looked for is next to the configuration file, else next to the gateway's own virtualenv
    (``prefix`` is ``sys.prefix``). Spawned programs inherit the changed ``PATH`` (it is passed as ``pass_env``).
    """
    parts = [p for p in os.environ.get("PATH", os.defpath).split(os.pathsep) if p]
    for candidate in (Path(config_file).resolve().parent / ".tools" / "bin", Path(prefix).parent / ".tools" / "bin"):
        if candidate.is_dir():
            folder = str(candidate)
            if folder in parts or str(candidate.resolve()) in parts:
                return None
            os.environ["PATH"] = os.pathsep.join([folder, *parts])
            return folder
    return None
