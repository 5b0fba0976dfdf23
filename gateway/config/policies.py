"""The ``policies:`` section: who (callers, claims, scopes) sees and may call what, and how often (``limits``).

``policies.NAME.limits`` is the one way to limit a caller. ``gateway.auth.caller_limits`` is a deprecated alias:
``limit_policies`` rewrites its rules into the ordered policies that decide each caller's limits, so that every
caller is limited exactly as before, and reports each rule no policy can say exactly as a ``Problem`` (the loader
refuses the file) rather than approximate it.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

import yaml
from pydantic import Field, PrivateAttr, model_validator

from gateway.config.base import Model, Problem

__all__ = [
    "CallerBudget",
    "CallerLimit",
    "Policy",
    "PolicyLimits",
    "Selection",
    "caller_limits_advice",
    "limit_policies",
]

RULES = ("gateway", "auth", "caller_limits")
"""Where the deprecated rules are written."""


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
    _label: str = PrivateAttr(default="")
    _written_at: str = PrivateAttr(default="")

    @model_validator(mode="after")
    def _limits_something(self) -> PolicyLimits:
        _check_numbers(self.requests_per_s, self.burst, self.concurrent_calls, "limits need")
        return self

    @property
    def label(self) -> str:
        """How /metrics labels the requests these limits refuse: ``policy:NAME``, or a deprecated rule's name."""
        return self._label

    @property
    def written_at(self) -> str:
        """The key the file wrote them at, which a refusal names (``policies.NAME.limits``)."""
        return self._written_at

    def placed(self, label: str, written_at: str) -> PolicyLimits:
        """These limits, knowing their label and the key they were written at."""
        copy = self.model_copy()
        copy._label, copy._written_at = label, written_at
        return copy


class CallerBudget(Model):
    """Tokens a policy's callers may receive; each caller has its own daily count."""

    answer_tokens: int | None = Field(default=None, ge=200)
    """The largest answer a call may return, in tokens (with a client's own budget, the smaller applies)."""
    daily_tokens: int | None = Field(default=None, ge=1)
    """Tokens of answers a caller may receive per day (UTC); over it, calls are refused until midnight UTC."""


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
    budget: CallerBudget | None = None
    """Tokens each of this policy's callers may receive: per answer, and per day (gateway/core/answers.py)."""


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

    def limits(self, index: int) -> PolicyLimits:
        numbers = self.model_dump(include={"requests_per_s", "burst", "concurrent_calls"})
        return PolicyLimits(**numbers).placed(self.name or f"rule-{index + 1}", f"gateway.auth.caller_limits[{index}]")


# ------------------------------------------------------------------------------------- the deprecated rules, rewritten


def limit_policies(
    policies: Mapping[str, Policy], rules: tuple[CallerLimit, ...]
) -> tuple[dict[str, Policy], list[Problem]]:
    """The policies that decide each caller's limits, first match wins, and the rules that cannot be rewritten.

    A caller's limits used to be its policy's ``limits`` when it set them, else the first ``caller_limits`` rule
    matching it. The same, as one ordered list: each policy with limits as it is; before each policy without, every
    rule's conditions joined to the policy's (with the rule's limits); the policy itself (not limited); and after
    them all, the rules alone. Only the conditions and ``limits`` of these policies count: what a caller sees is
    still decided by ``policies`` as written.
    """
    rewritten: dict[str, Policy] = {}
    problems: list[Problem] = []
    rules_as_policies: list[tuple[int, Policy]] = []
    for index, rule in enumerate(rules):
        scoped = [claim for claim in rule.claims if claim in ("scope", "scp")]
        if scoped:
            problems.append(((*RULES, str(index), "claims", scoped[0]), _SCOPE_CLAIM.format(scoped[0])))
            continue
        rules_as_policies.append((index, Policy(callers=rule.callers, claims=rule.claims, limits=rule.limits(index))))
    for name, policy in policies.items():
        if policy.limits is not None:
            limits = policy.limits.placed(f"policy:{name}", f"policies.{name}.limits")
            _add(rewritten, name, policy.model_copy(update={"limits": limits}))
            continue
        for index, alias in rules_as_policies:
            callers = _both_callers(policy.callers, alias.callers)
            if callers == ():
                continue  # no caller matches both
            claims = _both_claims(policy.claims, alias.claims)
            if callers is None or claims is None:
                problems.append(((*RULES, str(index)), _inexact(name, policy, alias, callers is None)))
            else:
                both = Policy(callers=callers, claims=claims, scopes=policy.scopes, limits=alias.limits)
                _add(rewritten, f"{name} and caller_limits[{index}]", both)
        _add(rewritten, name, policy)
    for index, alias in rules_as_policies:
        _add(rewritten, f"caller_limits[{index}]", alias)
    return rewritten, problems


_SCOPE_CLAIM = (
    "gateway.auth.caller_limits (deprecated) compared a `{}` claim as one whole string; a policy reads the scopes "
    "in it one by one, so the rule cannot be rewritten exactly: write it as a policy with `scopes: [...]` and "
    "`limits` (docs/configuration.md, 2.2.2)"
)


def _inexact(name: str, policy: Policy, rule: Policy, callers: bool) -> str:
    differ = (
        f"no list of globs names exactly the callers both {list(policy.callers)} and {list(rule.callers)} match"
        if callers
        else f"its claims {rule.claims} and the policy's {policy.claims} ask one claim for two values"
    )
    return (
        f"gateway.auth.caller_limits (deprecated) cannot be rewritten exactly into policy {name!r}, whose callers it "
        f"limits while the policy sets no limits of its own: {differ}. Give policy {name!r} its own `limits` "
        "(docs/configuration.md, 2.2.2)"
    )


def _add(policies: dict[str, Policy], name: str, policy: Policy) -> None:
    """Add under ``name``, or a name not yet taken (the names here only have to differ)."""
    while name in policies:
        name += "'"
    policies[name] = policy


_WILD = re.compile(r"[*?\[]")


def _literal(pattern: str) -> bool:
    return _WILD.search(pattern) is None


def _disjoint(a: str, b: str) -> bool:
    """Whether no name can match both globs, told by the text they must start and end with."""
    heads = [_WILD.split(p, maxsplit=1)[0] for p in (a, b)]
    tails = [re.split(r"[*?\]]", p)[-1] for p in (a, b)]
    return not (heads[0].startswith(heads[1]) or heads[1].startswith(heads[0])) or not (
        tails[0].endswith(tails[1]) or tails[1].endswith(tails[0])
    )


def _both_callers(a: tuple[str, ...], b: tuple[str, ...]) -> tuple[str, ...] | None:
    """Globs that match exactly the names matching one of ``a`` and one of ``b``; None when none can say it."""
    if "*" in a:
        return b
    if "*" in b:
        return a
    both: dict[str, None] = {}
    for x in a:
        for y in b:
            if _literal(x) or _literal(y):
                name, glob = (x, y) if _literal(x) else (y, x)
                if fnmatchcase(name, glob):
                    both[name] = None
            elif x == y:
                both[x] = None
            elif not _disjoint(x, y):
                return None
    return tuple(both)


def _both_claims(a: Mapping[str, str], b: Mapping[str, str]) -> dict[str, str] | None:
    """The claims both ask for; None when they ask one claim for two values (a list claim may hold both)."""
    both = dict(a)
    for claim, value in b.items():
        if both.setdefault(claim, value) != value:
            return None
    return both


def caller_limits_advice(rules: tuple[CallerLimit, ...], policies: Mapping[str, Policy]) -> str:
    """How to write the deprecated rules now, as a sentence (with the ``policies:`` to write, when there are none)."""
    if policies:
        return (
            "move each rule's numbers into the `limits` of the policies whose callers it limits (policies.NAME.limits; "
            "docs/configuration.md, 2.2.2)"
        )
    written: dict[str, Any] = {}
    for index, rule in enumerate(rules):
        entry: dict[str, Any] = {} if rule.callers == ("*",) else {"callers": list(rule.callers)}
        if rule.claims:
            entry["claims"] = dict(rule.claims)
        entry["limits"] = rule.model_dump(include={"requests_per_s", "burst", "concurrent_calls"}, exclude_none=True)
        written[_free(written, rule.name or f"rule-{index + 1}")] = entry
    if not any("*" in rule.callers and not rule.claims for rule in rules):
        written[_free(written, "everyone")] = {}  # every other caller keeps seeing everything, unlimited
    flow = yaml.safe_dump({"policies": written}, default_flow_style=True, sort_keys=False, width=1 << 20).strip()
    return (
        f"write them as policies, `{flow}`: a policy also decides what its callers see, and the last one, without "
        "conditions, lets every other caller see everything (docs/configuration.md, 2.2.2)"
    )


def _free(taken: Mapping[str, Any], name: str) -> str:
    while name in taken:
        name += "-2"
    return name
