"""One way to limit a caller (``gateway/config/policies.py``): ``policies.NAME.limits``. The deprecated
``gateway.auth.caller_limits`` is rewritten by the loader into the policies that decide limits, limits every caller
exactly as it did, is announced by one warning naming the file, the key, the line and how to write it now, and a
combination no policy can say exactly is refused with a config error."""

from __future__ import annotations

import json
from collections.abc import Mapping
from fnmatch import fnmatchcase
from typing import Any

import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from structlog.testing import capture_logs

from gateway.calls import Caller
from gateway.config import Federation, parse_config
from gateway.core.policies import policy_for
from gateway.errors import ConfigError

FILE = "conf/federation.yaml"


def parse(doc: Mapping[str, Any]) -> Federation:
    return parse_config(json.dumps(doc), file=FILE, env={})  # JSON is YAML


def limited_by(fed: Federation, identity: Caller) -> str | None:
    """Where the limits applied to ``identity`` are written, as a refusal names them; None: not limited."""
    policy = fed.limit_policies.get(policy_for(fed.limit_policies, identity))
    return policy.limits.written_at if policy is not None and policy.limits is not None else None


def limited_before(
    doc: Mapping[str, Any], caller: str, claims: Mapping[str, Any] | None, scopes: frozenset[str]
) -> str | None:
    """How front/http/limits.py chose a caller's limits before there was one way: its policy's ``limits`` when it
    set them, else the first ``gateway.auth.caller_limits`` rule whose callers and claims match."""
    fed = Federation.model_validate({"policies": doc.get("policies", {})})
    if fed.policies:
        name = policy_for(fed.policies, Caller(caller, scopes, claims) if claims is not None else Caller(caller))
        policy = fed.policies.get(name)
        if policy is not None and policy.limits is not None:
            return f"policies.{name}.limits"
    for index, rule in enumerate(doc.get("gateway", {}).get("auth", {}).get("caller_limits", [])):
        wanted = rule.get("claims", {})
        held = all(
            claims is not None and (claims.get(k) == v or (isinstance(claims.get(k), list) and v in claims[k]))
            for k, v in wanted.items()
        )
        if any(fnmatchcase(caller, glob) for glob in rule.get("callers", ["*"])) and held:
            return f"gateway.auth.caller_limits[{index}]"
    return None


globs = st.lists(st.sampled_from(["*", "a", "b", "ab", "a*", "*b", "c?", "[ab]x"]), min_size=1, max_size=2, unique=True)
claim_maps = st.just({}) | st.dictionaries(st.sampled_from(["group", "team"]), st.sampled_from(["x", "y"]), max_size=2)
policy_docs = st.fixed_dictionaries(
    {"callers": globs, "claims": claim_maps},
    optional={"scopes": st.lists(st.sampled_from(["s", "t"]), max_size=1), "limits": st.just({"concurrent_calls": 1})},
)
rule_docs = st.fixed_dictionaries({"callers": globs, "claims": claim_maps, "requests_per_s": st.just(1.0)})
token_claims = st.none() | st.dictionaries(
    st.sampled_from(["group", "team"]), st.sampled_from(["x", "y", ["x", "y"], ["y"]]), max_size=2
)


@settings(max_examples=400)
@given(
    policies=st.dictionaries(st.sampled_from(["p", "q", "r"]), policy_docs, max_size=3),
    rules=st.lists(rule_docs, max_size=3),
    caller=st.sampled_from(["a", "b", "ab", "ax", "bx", "c1", "cb"]),
    claims=token_claims,
    scopes=st.frozensets(st.sampled_from(["s", "t"])),
)
def test_every_caller_is_limited_exactly_as_before_whichever_spelling_the_file_uses(
    policies: dict[str, Any],
    rules: list[dict[str, Any]],
    caller: str,
    claims: dict[str, Any] | None,
    scopes: frozenset[str],
) -> None:
    doc = {"gateway": {"auth": {"caller_limits": rules}}, "policies": policies}
    try:
        fed = parse(doc)
    except ConfigError as exc:
        # Refused only where a rule limits the callers of a policy without limits and no policy says it exactly.
        assert "cannot be rewritten exactly" in str(exc), str(exc)
        assume(False)
        raise
    identity = Caller(caller, scopes, claims) if claims is not None else Caller(caller)
    assert limited_by(fed, identity) == limited_before(doc, caller, claims, scopes)
    assert fed.policies == parse({"policies": policies}).policies  # what each caller sees is as written


def test_the_deprecated_rules_are_announced_once_with_the_file_the_line_and_the_policies_to_write() -> None:
    text = (
        "gateway:\n"
        "  name: g\n"
        "  auth:\n"
        "    caller_limits:\n"
        "      - {name: slow-lane, callers: [alice], requests_per_s: 0.1, burst: 3}\n"
        "      - {callers: ['corp:*'], claims: {team: ops}, concurrent_calls: 2}\n"
    )
    with capture_logs() as logs:
        fed = parse_config(text, file=FILE, env={})
    warnings = [entry for entry in logs if entry["log_level"] == "warning"]
    assert [entry["event"] for entry in warnings] == ["config.deprecated"]
    assert warnings[0]["message"] == (
        f"{FILE}:4: gateway.auth.caller_limits is deprecated (read as the policies' limits, every caller limited as "
        "before): write them as policies, `{policies: {slow-lane: {callers: [alice], limits: {requests_per_s: 0.1, "
        "burst: 3}}, rule-2: {callers: ['corp:*'], claims: {team: ops}, limits: {concurrent_calls: 2}}, everyone: "
        "{}}}`: a policy also decides what its callers see, and the last one, without conditions, lets every other "
        "caller see everything (docs/configuration.md, 2.2.2)"
    )
    assert fed.policies == {}  # read as limits only: every caller still sees everything
    alice = fed.limit_policies[next(iter(fed.limit_policies))].limits
    assert alice is not None
    assert (alice.label, alice.written_at, alice.requests_per_s, alice.burst) == (
        "slow-lane",
        "gateway.auth.caller_limits[0]",
        0.1,
        3,
    )


def test_the_advice_written_as_policies_limits_every_caller_as_the_rules_did() -> None:
    rules = [{"name": "slow-lane", "callers": ["alice"], "requests_per_s": 0.1}, {"concurrent_calls": 2}]
    with capture_logs() as logs:
        old = parse({"gateway": {"auth": {"caller_limits": rules}}})
    advice = logs[0]["message"].split("`")[1]
    new = parse_config(advice, file=FILE, env={})
    for caller in ("alice", "bob"):
        was, now = (fed.limit_policies[policy_for(fed.limit_policies, Caller(caller))].limits for fed in (old, new))
        assert was is not None and now is not None
        assert (was.requests_per_s, was.burst, was.concurrent_calls) == (
            now.requests_per_s,
            now.burst,
            now.concurrent_calls,
        )


def test_a_file_without_the_deprecated_key_is_not_warned_about_and_its_policies_limits_are_named() -> None:
    with capture_logs() as logs:
        fed = parse({"policies": {"alpha": {"callers": ["a*"], "limits": {"requests_per_s": 5}}, "rest": {}}})
    assert logs == []
    alpha = fed.limit_policies["alpha"].limits
    assert alpha is not None and (alpha.label, alpha.written_at) == ("policy:alpha", "policies.alpha.limits")
    assert fed.limit_policies["rest"].limits is None
    assert limited_by(fed, Caller("bob")) is None


@pytest.mark.parametrize(
    ("policies", "rule", "key_path", "needle"),
    [
        ({}, "{callers: ['*'], claims: {scope: admin}, concurrent_calls: 1}", "claims.scope", "`scope` claim"),
        ({}, "{claims: {scp: admin}, concurrent_calls: 1}", "claims.scp", "`scp` claim"),
        (
            {"p": {"callers": ["a*"]}},
            "{callers: ['*b'], concurrent_calls: 1}",
            "",
            "no list of globs names exactly the callers both ['a*'] and ['*b'] match",
        ),
        (
            {"p": {"claims": {"team": "x"}}},
            "{claims: {team: y}, concurrent_calls: 1}",
            "",
            "ask one claim for two values",
        ),
    ],
    ids=["scope-claim", "scp-claim", "overlapping-globs", "one-claim-two-values"],
)
def test_a_rule_no_policy_can_say_exactly_is_refused_at_its_line(
    policies: dict[str, Any], rule: str, key_path: str, needle: str
) -> None:
    text = f"policies: {json.dumps(policies)}\ngateway:\n  auth:\n    caller_limits:\n      - {rule}\n"
    with pytest.raises(ConfigError) as info:
        parse_config(text, file=FILE, env={})
    err = info.value
    assert (err.key_path, err.line) == ("gateway.auth.caller_limits.0" + (f".{key_path}" if key_path else ""), 5)
    assert needle in err.message, err.message


def test_a_rule_over_callers_a_policy_with_its_own_limits_never_sees_is_not_refused() -> None:
    # ['a*'] and ['b*'] share no caller; a policy with limits keeps them, whatever the rules say.
    fed = parse(
        {
            "policies": {"p": {"callers": ["a*"]}, "q": {"callers": ["*b"], "limits": {"concurrent_calls": 3}}},
            "gateway": {"auth": {"caller_limits": [{"callers": ["b*"], "concurrent_calls": 1}]}},
        }
    )
    assert limited_by(fed, Caller("ab")) is None  # p, no limits
    assert limited_by(fed, Caller("bb")) == "policies.q.limits"
    assert limited_by(fed, Caller("bc")) == "gateway.auth.caller_limits[0]"  # no policy: the rule, as before


def test_a_caller_of_a_policy_without_limits_that_no_rule_matches_is_not_limited_by_a_later_policy() -> None:
    fed = parse(
        {
            "policies": {"p": {"callers": ["a*"]}, "q": {"limits": {"concurrent_calls": 3}}},
            "gateway": {"auth": {"caller_limits": [{"callers": ["ab"], "concurrent_calls": 1}]}},
        }
    )
    assert limited_by(fed, Caller("ab")) == "gateway.auth.caller_limits[0]"
    assert limited_by(fed, Caller("ax")) is None  # its policy is p: q's limits were never its
    assert limited_by(fed, Caller("bx")) == "policies.q.limits"


def test_a_rule_joined_to_a_policy_keeps_the_policys_scopes() -> None:
    fed = parse(
        {
            "policies": {"p": {"scopes": ["admin"]}, "q": {"limits": {"concurrent_calls": 3}}},
            "gateway": {"auth": {"caller_limits": [{"concurrent_calls": 1}]}},
        }
    )
    assert limited_by(fed, Caller("ann", frozenset({"admin"}), {})) == "gateway.auth.caller_limits[0]"
    assert limited_by(fed, Caller("ann", frozenset(), {})) == "policies.q.limits"  # not p's caller: q's
