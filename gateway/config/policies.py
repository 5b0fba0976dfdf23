"""The ``policies:`` section: who (callers, claims, scopes) sees and may call what, and at what rate; and the rules
of ``gateway.auth.caller_limits``, which limit callers by name and claims."""

from __future__ import annotations

from pydantic import Field, model_validator

from gateway.config.base import Model

__all__ = ["CallerLimit", "Policy", "PolicyLimits", "Selection"]


def _check_numbers(requests_per_s: float | None, burst: int | None, concurrent_calls: int | None, what: str) -> None:
    if requests_per_s is None and concurrent_calls is None:
        raise ValueError(f"{what} requests_per_s, concurrent_calls or both")
    if burst is not None and requests_per_s is None:
        raise ValueError("burst is the size of the requests_per_s bucket: set requests_per_s too")


class Selection(Model):
    """Names (or URIs) a policy lets its callers see, as globs (``*``, ``?``, ``[...]``): ``include`` (default:
    everything), then ``exclude``."""

    include: tuple[str, ...] | None = None
    exclude: tuple[str, ...] = ()


class PolicyLimits(Model):
    """What each of a policy's callers may do at ``/mcp``; every caller has its own bucket and its own count."""

    requests_per_s: float | None = Field(default=None, gt=0)
    """The sustained rate of JSON-RPC requests to /mcp (a token bucket); unset: no rate limit."""
    burst: int | None = Field(default=None, ge=1)
    """The bucket's size: requests allowed at once after a quiet spell; default: ``requests_per_s`` rounded up."""
    concurrent_calls: int | None = Field(default=None, ge=1)
    """``tools/call`` requests of one caller in flight at once; unset: no limit."""

    @model_validator(mode="after")
    def _limits_something(self) -> PolicyLimits:
        _check_numbers(self.requests_per_s, self.burst, self.concurrent_calls, "limits need")
        return self


class Policy(Model):
    """Who (``callers``, ``claims``, ``scopes``: all must hold) sees and may call what (``backends``, ``tools``,
    ``resources``, ``prompts``), and how often (``limits``). The first policy whose conditions hold for a caller is
    its policy (gateway/core/policies.py)."""

    callers: tuple[str, ...] = ("*",)
    """Caller-name globs: static token names (``GATEWAY_TOKENS="alice=..."``) or ``ISSUER-NAME:SUBJECT`` of a JWT."""
    claims: dict[str, str] = {}
    """JWT claims the caller's token must carry with these values (a list claim must contain it; a ``scope`` or
    ``scp`` string, one of its scopes)."""
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
    """The request rate and concurrent calls allowed each of this policy's callers; unset: not limited."""


class CallerLimit(Model):
    """A rule of the deprecated ``gateway.auth.caller_limits``: ``PolicyLimits`` for the callers it matches."""

    name: str | None = None
    """How /metrics labels what this rule refuses; default: ``rule-N`` (its position, from 1)."""
    callers: tuple[str, ...] = ("*",)
    """Caller-name globs (``alice``, ``corp:*``): static token names, or ``ISSUER-NAME:SUBJECT`` for OAuth."""
    claims: dict[str, str] = {}
    """JWT claims the caller's token must carry with these values (a list claim must contain it)."""
    requests_per_s: float | None = Field(default=None, gt=0)
    burst: int | None = Field(default=None, ge=1)
    concurrent_calls: int | None = Field(default=None, ge=1)

    @model_validator(mode="after")
    def _limits_something(self) -> CallerLimit:
        _check_numbers(self.requests_per_s, self.burst, self.concurrent_calls, "a caller limit needs")
        return self
