"""The backends a federation declares: downstream MCP servers (``servers:``, one model per transport), command-line
programs served as tools (``adapters:``) and the built-in wiki (``wiki:``)."""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, field_validator, model_validator

from gateway.config.base import Model, PinMode, SecretsMode, check_tool_name, resolve, resolve_env_paths
from gateway.config.downstream_auth import DownstreamAuth, TokenExchange

__all__ = [
    "ADAPTER_PASS_ENV",
    "BACKEND_NAME_RE",
    "CALLER_SECRET_RE",
    "NETWORK_ENV",
    "PACKAGE_RUNNERS",
    "SERVER_PASS_ENV",
    "WIKI_TOOLS",
    "Adapter",
    "AdapterTool",
    "ExitCodes",
    "HttpServer",
    "Rewrite",
    "ServerConfig",
    "SseServer",
    "StdioServer",
    "ThinWhen",
    "ToolFilter",
    "Variant",
    "VariantProbe",
    "Wiki",
]

BACKEND_NAME_RE = re.compile(r"^[A-Za-z0-9_-]{1,48}$")
"""A backend's name, the same rule for servers, adapters and the wiki."""
WIKI_TOOLS = (
    "wiki_index",
    "files_read",
    "files_neighbors",
    "wiki_read_all",
    "wiki_search",
    "wiki_vector_search",
    "wiki_hybrid_search",
)
"""The built-in wiki's tools (backends/wiki/ serves them)."""
CALLER_SECRET_RE = re.compile(r"\$\{caller\.secret:([A-Za-z0-9_.-]{1,64})\}")
"""``${caller.secret:NAME}`` in a server's header value: the calling caller's secret NAME (gateway/auth/secrets.py)."""
NETWORK_ENV = (
    *("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "no_proxy", "all_proxy"),
    *("SSL_CERT_FILE", "SSL_CERT_DIR", "NODE_EXTRA_CA_CERTS", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"),
    *("npm_config_*", "NPM_CONFIG_*", "PIP_*", "UV_*"),
)
"""Where a program that fetches (npx, uvx, pip, a model hub's client) finds its proxy, its certificate authorities
and its registry: passed by default, so a program behind a TLS-inspecting proxy starts as it does from a shell."""
SERVER_PASS_ENV = ("HOME", "LOGNAME", "PATH", "SHELL", "TERM", "USER", *NETWORK_ENV)
"""A stdio server's ``pass_env`` default: what the SDK passes (``get_default_environment``), and ``NETWORK_ENV``."""
ADAPTER_PASS_ENV = ("PATH", "HOME", "LANG", "LC_ALL", "TMPDIR", *NETWORK_ENV)
"""An adapter's ``pass_env`` default."""
PACKAGE_RUNNERS = frozenset({"npx", "uvx", "pipx", "bunx", "pnpx", "pnpm", "yarn", "docker", "podman"})
"""Commands that fetch the server they run (a package, an image) when it is not in their cache yet."""


def _pass_env(value: tuple[str, ...]) -> tuple[str, ...]:
    for name in value:
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*\*?", name):
            raise ValueError(
                f"pass_env: {name!r} is not a variable name (or a name ending in * for every one it begins)"
            )
    return value


# --------------------------------------------------------------------------------------------------- servers


class ToolFilter(Model):
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
            check_tool_name(target)
        return value


class _Backend(Model):
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
    max_tools: int = Field(default=5_000, ge=1)
    """The most tools taken from this server: a server that lists more fails, saying so, and is not served."""
    max_list_bytes: int = Field(default=16 * 1024 * 1024, gt=0)
    """The largest any one of its lists (tools, resources, templates, prompts) may be, as JSON; past it the server
    fails, saying so."""
    min_uptime_s: float = Field(default=30.0, ge=0)
    """How long a session must have stayed up before a reconnect starts the backoff again from its first step; a
    server that dies sooner (e.g. right after its handshake) is restarted with growing waits (0.5 s doubling to
    30 s), so a flapping server costs a few spawns per minute, not a tight loop."""
    router: bool = False
    tools: ToolFilter = ToolFilter()
    unlisted_tools: tuple[Annotated[str, AfterValidator(check_tool_name)], ...] = ()
    """Tools this server serves without listing them in ``tools/list`` (its own names): not published, but a
    ``tools/call`` of one (under the name the naming rule gives it) is routed here like a listed tool's. An explicit
    escape hatch: unknown names are never forwarded blindly. A listed tool of the same name wins."""
    session: Literal["shared", "per_client"] = "shared"
    """``shared``: one session serves every client. ``per_client``: a client that can answer the server's own
    requests (sampling, elicitation, roots) gets its own session (for stdio, its own process), opened at its first
    call, so those requests reach exactly that client even when several call at once (see backends/mcp/relay.py)."""
    pin: PinMode | None = None
    """Tool definitions this server changes or adds after approval: ``off``, ``warn`` or ``enforce`` (held back until
    ``gateway pins approve``); unset: ``gateway.pin`` (gateway/core/pins.py)."""
    secrets: SecretsMode | None = None
    """Credentials in this server's arguments and answers: ``record``, ``redact``, ``block`` or ``off``; unset:
    ``gateway.secrets`` (docs/security.md, "Credentials in flight")."""
    protocol: Literal["auto", "handshake", "2026-07-28"] = "auto"
    """The eras the gateway speaks to this server. ``auto``: learnt at connect (``server/discover`` and the
    handshake), and each client is served in its own era where the server speaks it (a 2026-07-28 client over
    stateless requests, a 2025 one over the handshake session), bridged where it does not. ``handshake``
    (``initialize``, 2025-11-25 and older) or ``2026-07-28`` (stateless, ``server/discover``): that era only, every
    client bridged to it."""


class StdioServer(_Backend):
    transport: Literal["stdio"]
    command: str = Field(min_length=1)
    args: tuple[str, ...] = ()
    env: dict[str, str] = {}
    """Variables set for the server. Nothing else from the gateway's environment passes, except ``pass_env``."""
    pass_env: tuple[str, ...] = SERVER_PASS_ENV
    """Variables passed on from the gateway's own environment when set (``NAME*``: every one starting with NAME)."""
    secret_env: tuple[str, ...] = ()
    """Names in ``env`` or ``pass_env`` whose values are secrets (redacted from logs and the ledger), besides those
    whose name already says so (``*TOKEN*``, ``*SECRET*``, ``*PASSWORD*``, ``*_KEY``, ...)."""
    cwd: str | None = None

    _resolve_cwd = field_validator("cwd")(resolve)
    _check_pass_env = field_validator("pass_env")(_pass_env)
    _resolve_env = field_validator("env")(resolve_env_paths)


class _Pooled(_Backend):
    """A streamable HTTP server's own connections (backends/mcp/pool.py)."""

    max_connections: int = Field(default=32, ge=1)
    """Calls sent to this server at once, over connections of its own; more wait (at most ``connect_timeout_s``,
    and half of ``timeout_s``) and then fail as ``saturated``, never as the server's failure."""
    max_connections_per_caller: int | None = Field(default=None, ge=1)
    """Of those, what one caller may hold at once (default: half of ``max_connections``), so one caller's flood
    leaves room for the others."""


class HttpServer(_Pooled):
    transport: Literal["streamable_http"]
    url: str = Field(pattern=r"^https?://")
    allow_private: bool = False
    """Whether this server may be reached at a private address (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7);
    link-local and metadata addresses never, loopback always (gateway/backends/mcp/egress.py)."""
    headers: dict[str, str] = {}
    secret_headers: tuple[str, ...] = ()
    """Names in ``headers`` whose values are secrets, besides ``Authorization``, ``Cookie``, ``X-Api-Key`` and
    other names that already say so."""
    token_exchange: TokenExchange | None = None
    """Each caller's session carries ``Authorization: Bearer`` a token exchanged for the caller's own (RFC 8693)."""
    auth: DownstreamAuth | None = None
    """``{oauth: {...}}``: the gateway signs in to this server as an OAuth client, per caller or as itself."""

    @model_validator(mode="after")
    def _one_credential(self) -> HttpServer:
        if self.auth is None:
            return self
        if self.token_exchange is not None:
            raise ValueError("auth.oauth and token_exchange both set the Authorization header: keep one")
        if any(name.lower() == "authorization" for name in self.headers):
            raise ValueError("auth.oauth sets the Authorization header: remove it from headers")
        if self.session == "per_client":
            raise ValueError("auth.oauth with session: per_client is not supported: use the shared session")
        return self


class SseServer(_Backend):
    transport: Literal["sse"]
    url: str = Field(pattern=r"^https?://")
    allow_private: bool = False
    """Whether this server may be reached at a private address (10/8, 172.16/12, 192.168/16, 100.64/10, fc00::/7);
    link-local and metadata addresses never, loopback always (gateway/backends/mcp/egress.py)."""
    headers: dict[str, str] = {}
    secret_headers: tuple[str, ...] = ()
    """As for ``streamable_http``."""


ServerConfig = Annotated[StdioServer | HttpServer | SseServer, Field(discriminator="transport")]


# --------------------------------------------------------------------------------------------------- adapters


class ThinWhen(Model):
    """When an answer counts as a failure worth degrading (e.g. qmd vsearch without embeddings)."""

    empty: bool = True
    """The parsed output is empty (``[]``, ``{}``, blank text)."""
    stderr_contains: str | None = None
    """... and stderr contains this text (when set)."""
    stdout_contains: str | None = None
    """... and stdout contains this text (when set), e.g. graphify's "No path found between"."""


class VariantProbe(Model):
    """How the adapter finds out, at start and on each re-check, whether a variant can run (backends/cli/)."""

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


class Variant(Model):
    argv: tuple[str, ...]
    timeout_s: float = Field(default=30.0, gt=0)
    thin_when: ThinWhen | None = None
    probe: VariantProbe | None = None
    """Whether this variant can run here (e.g. its models are installed); a variant found not ready is skipped at
    once by the ladder, the reason in the answer's ``_meta``. Absent: the variant is always tried."""


class ExitCodes(Model):
    ok: tuple[int, ...] = (0,)
    no_result: tuple[int, ...] = ()
    """Codes that mean "nothing found": an ordinary answer (not an error) carrying the program's output."""
    thin: tuple[int, ...] = ()
    """Codes that mean "nothing found" as a thin answer: the step fails as ``thin`` with the program's words as the
    reason, so the route degrades to its next provider, or answers ``isError`` when none is left."""


class Rewrite(Model):
    """A rewrite of a program's text output before it is answered: ``pattern`` (a Python regular expression)
    replaced by ``replace`` (``\\1`` names a group), e.g. a hint naming the program's own option rewritten to the
    published argument, or dropped."""

    pattern: str = Field(min_length=1)
    replace: str = ""

    @field_validator("pattern")
    @classmethod
    def _pattern(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"{value!r} is not a regular expression: {exc}") from None
        return value


class AdapterTool(Model):
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
    rewrite: tuple[Rewrite, ...] = ()
    """Applied in order to the text of an ``output: text`` answer (hints that name what the client cannot send)."""

    @model_validator(mode="after")
    def _shape(self) -> AdapterTool:
        if self.rewrite and self.output != "text":
            raise ValueError("`rewrite` applies to `output: text` only (a JSON answer is parsed, not reworded)")
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


class Adapter(Model):
    command: str = Field(min_length=1)
    enabled: bool = True
    disabled_reason: str | None = None
    env: dict[str, str] = {}
    """Variables set for the program. Nothing else from the gateway's environment passes, except `pass_env`."""
    pass_env: tuple[str, ...] = ADAPTER_PASS_ENV
    """As a server's ``pass_env`` (``NAME*`` for every variable starting with NAME)."""
    secret_env: tuple[str, ...] = ()
    """Names in ``env`` or ``pass_env`` whose values are secrets, besides those whose name already says so."""
    cwd: str | None = None
    max_output_bytes: int = Field(default=50 * 1024 * 1024, gt=0)
    max_stderr_bytes: int = Field(default=1024 * 1024, gt=0)
    concurrency: int = Field(default=4, ge=1)
    secrets: SecretsMode | None = None
    """As a server's ``secrets``: credentials in this adapter's arguments and output; unset: ``gateway.secrets``."""
    probe: tuple[str, ...] | None = None
    """A health probe argv (e.g. ``[--version]``); by default only the command's presence is checked."""
    tools: dict[str, AdapterTool]

    _resolve_cwd = field_validator("cwd")(resolve)
    _resolve_env = field_validator("env")(resolve_env_paths)
    _check_pass_env = field_validator("pass_env")(_pass_env)

    @field_validator("tools")
    @classmethod
    def _tool_names(cls, value: dict[str, AdapterTool]) -> dict[str, AdapterTool]:
        for name in value:
            check_tool_name(name)
        return value


# --------------------------------------------------------------------------------------------------- wiki


class Wiki(Model):
    name: str = Field(default="wiki", pattern=BACKEND_NAME_RE.pattern)
    root: str = "./docs"
    enabled: bool = True
    disabled_reason: str | None = None
    tools: tuple[str, ...] | None = None
    router: tuple[str, ...] = ("wiki_index", "files_read", "files_neighbors", "wiki_read_all")
    read_all_max_bytes: int = Field(default=1_000_000, gt=0)
    default_max_bytes: int = Field(default=50_000, gt=0)

    _resolve_root = field_validator("root")(resolve)

    @field_validator("tools", "router")
    @classmethod
    def _known_tools(cls, value: tuple[str, ...] | None) -> tuple[str, ...] | None:
        unknown = [name for name in value or () if name not in WIKI_TOOLS]
        if unknown:
            raise ValueError(f"unknown wiki tool(s) {unknown}: the wiki offers {list(WIKI_TOOLS)}")
        return value
