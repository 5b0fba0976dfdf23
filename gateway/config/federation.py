"""The whole of federation.yaml (``Federation``) and the sections that join backends into what clients see: routes
(one published tool served by a ladder of providers), the context gate (``clients:``) and the exposure (every tool,
or a tool search). ``cross_reference_problems`` checks what one section says of another (names unique across
backends, routes and policies naming what is declared, per-caller header values that have a file to come from)."""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from typing import Annotated, Any, Literal

from pydantic import Field, PrivateAttr, field_validator, model_validator

from gateway.config.backends import BACKEND_NAME_RE, CALLER_SECRET_RE, WIKI_TOOLS, Adapter, ServerConfig, Wiki
from gateway.config.base import Model, Problem, check_tool_name
from gateway.config.policies import Policy, limit_policies
from gateway.config.settings import GatewaySettings

__all__ = [
    "AnswerBudget",
    "Clients",
    "Exposure",
    "ExposureMode",
    "Federation",
    "Route",
    "RouteStep",
    "ScoreScale",
    "SearchHitsResult",
]


# --------------------------------------------------------------------------------------------------- routes


class RouteStep(Model):
    provider: str = Field(pattern=r"^[^/]+/[^/]+$")
    """``backend/tool``: a downstream server's tool, an adapter's tool, or the wiki's tool (by their own names)."""
    arguments: dict[str, Any] | None = None
    """What this provider is sent, as a template over the served tool's arguments: a string that is exactly
    ``"{name}"`` becomes that argument's value (any type; the key is dropped when the argument is absent), other
    values are sent as written. Absent: the caller's arguments pass through unchanged."""
    when: dict[str, tuple[Any, ...]] = {}
    """Use this provider only for calls whose argument has one of these values (an absent argument counts as its
    schema default), e.g. ``when: {mode: [keyword]}``. Other calls skip it without counting it as a failure."""

    @field_validator("when", mode="before")
    @classmethod
    def _when_values(cls, value: Any) -> Any:
        if isinstance(value, dict):  # `when: {mode: keyword}` means the same as `when: {mode: [keyword]}`
            return {k: v if isinstance(v, list | tuple) else [v] for k, v in value.items()}
        return value

    @model_validator(mode="before")
    @classmethod
    def _from_string(cls, value: Any) -> Any:
        return {"provider": value} if isinstance(value, str) else value


ScoreScale = Literal["bm25", "bm25_raw", "cosine", "rerank", "rrf", "unspecified"]
"""What a provider's ``score`` means (gateway/core/results.py says how each is brought onto a 0..1 scale)."""


class SearchHitsResult(Model):
    """A route's declared result shape (core/results.py): every provider's answer becomes the same JSON array of
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


class Route(Model):
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


class AnswerBudget(Model):
    """What an answer and the catalog may take of a client's context window (gateway/core/answers.py)."""

    answer_share: float = Field(default=0.1, gt=0, le=1)
    """The largest answer a call may return: this share of the client's declared window, in tokens."""
    answer_tokens: int | None = Field(default=None, ge=200)
    """A fixed cap on every answer instead (the smaller of the two applies when both are set)."""
    unknown_window: int | None = Field(default=None, gt=0)
    """The window assumed for a client that declares none; absent: such a client's answers are not budgeted."""
    exempt_large: bool = True
    """Clients at or above ``large_context_tokens`` get no answer budget (they see no change)."""
    catalog_share: float = Field(default=0.1, gt=0, le=1)
    """The share of a client's window its tools/list may take: over it, an ``exposure: auto`` client gets the tool
    search instead of the list."""
    keep_s: float = Field(default=900.0, gt=0, le=86400)
    """How long the rest of a cut answer stays readable as a resource."""
    keep_bytes: int = Field(default=64 * 1024 * 1024, ge=1024)
    """The most every kept answer takes together (the oldest leave first)."""


class Clients(Model):
    """The context gate: which tools only large-context clients may list and call (gateway/core/gate.py)."""

    large_context_tokens: int = Field(default=150_000, gt=0)
    """A client whose declared context window is at least this many tokens counts as large."""
    large_context_tools: tuple[str, ...] = ("wiki_read_all",)
    """Published tool names listed and callable only for large clients."""
    context_header: str = Field(default="X-Context-Window", min_length=1)
    """A request header in which a client (or a proxy in front of it) declares its context window, in tokens."""
    known: dict[str, int] = {}
    """clientInfo ``name`` (or ``name@version``) glob patterns, case-insensitive -> context window in tokens."""
    min_context: dict[str, Annotated[int, Field(gt=0)]] = {}
    """Any published tool -> the context window (tokens) a client must declare to list and call it (the tools of
    ``large_context_tools`` need ``large_context_tokens``; a tool named in both needs the figure given here)."""
    budget: AnswerBudget | None = None
    """Token budgets by the declared window (gateway/core/answers.py); absent: answers are not budgeted."""


# --------------------------------------------------------------------------------------------------- exposure


ExposureMode = Literal["all", "search", "auto"]


class Exposure(Model):
    """How the catalog is shown to clients: every tool, or a tool search (gateway/front/exposure.py)."""

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

    _check_names = field_validator("search_tool", "call_tool")(check_tool_name)

    @field_validator("pinned")
    @classmethod
    def _pinned_names(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        for name in value:
            check_tool_name(name)
        return value

    @model_validator(mode="after")
    def _distinct(self) -> Exposure:
        if self.search_tool == self.call_tool:
            raise ValueError(f"search_tool and call_tool must differ (both are {self.search_tool!r})")
        return self


# --------------------------------------------------------------------------------------------------- the whole file


class Federation(Model):
    """The whole of federation.yaml, as read (``source``); built by config/loading.py, which also reports every
    ``cross_reference_problems`` as a configuration error."""

    version: Literal[1] = 1
    gateway: GatewaySettings = GatewaySettings()
    servers: dict[str, ServerConfig] = {}
    adapters: dict[str, Adapter] = {}
    wiki: Wiki | None = None
    routes: dict[str, Route] = {}
    clients: Clients = Clients()
    policies: dict[str, Policy] = {}
    """Who sees and may call what, first match wins; none: every caller sees everything (gateway/core/policies.py)."""
    exposure: Exposure = Exposure()
    _source: str = PrivateAttr(default="<memory>")
    _limit_policies: dict[str, Policy] = PrivateAttr(default_factory=dict)
    _limit_problems: list[Problem] = PrivateAttr(default_factory=list)

    @property
    def source(self) -> str:
        """The file this federation was read from."""
        return self._source

    @property
    def limit_policies(self) -> Mapping[str, Policy]:
        """The policies whose ``limits`` limit each caller, first match wins: ``policies``, with the deprecated
        ``gateway.auth.caller_limits`` rewritten into them (config/policies.py ``limit_policies``). Their ``limits``
        know the key they were written at and their /metrics label. They decide limits only, never what is seen."""
        return self._limit_policies

    @field_validator("servers", "adapters")
    @classmethod
    def _backend_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for name in value:
            if not BACKEND_NAME_RE.fullmatch(name):
                raise ValueError(f"backend name {name!r} is invalid: use 1 to 48 characters from A-Z a-z 0-9 _ -")
        return value

    @field_validator("routes")
    @classmethod
    def _route_names(cls, value: dict[str, Route]) -> dict[str, Route]:
        for name in value:
            check_tool_name(name)
        return value

    @model_validator(mode="after")
    def _one_way_to_limit(self) -> Federation:
        self._limit_policies, self._limit_problems = limit_policies(self.policies, self.gateway.auth.caller_limits)
        return self

    def cross_reference_problems(self) -> list[Problem]:
        """Every reference between sections that does not resolve, as (key path, message); empty when all do."""
        seen: dict[str, str] = {}
        problems = list(self._unique_backend_names(seen))
        problems += self._route_problems(seen)
        for name, policy in self.policies.items():
            for listed in (*(policy.backends.include or ()), *policy.backends.exclude):
                if not any(ch in listed for ch in "*?[") and listed not in seen:
                    message = f"policy {name!r} names backend {listed!r}, which is not declared"
                    problems.append((("policies", name, "backends"), message))
        problems += self._header_problems()
        return problems + self._limit_problems

    def _unique_backend_names(self, seen: dict[str, str]) -> Iterator[Problem]:
        """Names used twice across servers, adapters and wiki; ``seen`` gets each name's section."""
        sections: list[tuple[str, list[str]]] = [
            ("servers", list(self.servers)),
            ("adapters", list(self.adapters)),
            ("wiki", [self.wiki.name] if self.wiki else []),
        ]
        for section, names in sections:
            for name in names:
                if name not in seen:
                    seen[name] = section
                    continue
                path = ("wiki", "name") if section == "wiki" else (section, name)
                unique = "names must be unique across servers, adapters and wiki"
                yield path, f"backend name {name!r} is already used in `{seen[name]}`: {unique}"

    def _route_problems(self, backends: Mapping[str, str]) -> Iterator[Problem]:
        """The first provider of each route that names a backend or a tool that is not declared."""
        for route, spec in self.routes.items():
            for step in spec.providers:
                backend, tool = step.provider.split("/", 1)
                known = self._static_tools(backend)
                if backend not in backends:
                    yield ("routes", route), f"route {route!r} names backend {backend!r}, which is not declared"
                elif known is not None and tool not in known:
                    has = f"{backend!r} has no tool {tool!r} (it has {sorted(known)})"
                    yield ("routes", route), f"route {route!r} names {step.provider!r}, but {has}"
                else:
                    continue
                break

    def _header_problems(self) -> Iterator[Problem]:
        """Per-caller header values that are misspelt, or that have no file of secrets to come from."""
        for name, server in self.servers.items():
            for header, value in getattr(server, "headers", {}).items():
                path = ("servers", name, "headers", header)
                if "${caller." in value and not CALLER_SECRET_RE.search(value):
                    yield (
                        path,
                        "a per-caller value is written ${caller.secret:NAME} (NAME: 1 to 64 of A-Z a-z 0-9 _ . -)",
                    )
                elif CALLER_SECRET_RE.search(value) and self.gateway.auth.caller_secrets is None:
                    needs = "gateway.auth.caller_secrets, the file the per-caller values come from"
                    yield path, f"${{caller.secret:...}} needs {needs}"

    def _static_tools(self, backend: str) -> tuple[str, ...] | None:
        """The tools of an adapter or the wiki, known from configuration; None for a server (known when connected)."""
        if backend in self.adapters:
            return tuple(self.adapters[backend].tools)
        if self.wiki is not None and backend == self.wiki.name:
            return WIKI_TOOLS
        return None
