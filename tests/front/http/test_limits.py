"""Per-caller limits at ``/mcp`` (``front/http/limits.py``), over a real gateway process on loopback: a caller over its
request rate or its concurrent tool calls is answered HTTP 429 with ``Retry-After`` and a JSON-RPC error naming the
limit, leaves a ``refused`` ledger row and a count in ``/metrics``, while other callers are untouched; and the rules
match callers by name glob and by JWT claim."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import anyio
import httpx2
import pytest

from gateway.calls import Caller
from gateway.config import parse_config
from gateway.errors import ConfigError
from gateway.front.http.limits import CallerLimits
from gateway.ledger.engines import open_reader
from tests.fixtures.gateway_proc import PYTHON, echo_argv, run_gateway
from tests.fixtures.raw_http import headers, messages, open_session, post_and_drop
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.anyio

TOKENS = "alice=tok-alice,bob=tok-bob"
N = 40


def config(limits: str) -> str:
    return f"""
gateway:
  audit: {{path: audit.db}}
  auth:
    caller_limits: {limits}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
"""


async def call(
    http: httpx2.AsyncClient, url: str, token: str, session: str, tool: str = "echo", *, rid: int = 7, **arguments: Any
) -> httpx2.Response:
    request = {"jsonrpc": "2.0", "id": rid, "method": "tools/call", "params": {"name": tool, "arguments": arguments}}
    return await http.post(url, json=request, headers=headers(token, session))


@pytest.mark.spawns
async def test_a_caller_over_its_request_rate_gets_429_with_retry_after_and_others_are_untouched(
    tmp_path: Path,
) -> None:
    limits = "[{name: slow-lane, callers: [alice], requests_per_s: 0.1, burst: 3}]"
    with run_gateway(config(limits), tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        with anyio.fail_after(30):
            async with httpx2.AsyncClient(timeout=10) as http:
                alices = await open_session(http, url, "tok-alice")  # 1 of alice's 3
                assert (await call(http, url, "tok-alice", alices, text="a")).status_code == 200  # 2
                assert (await call(http, url, "tok-alice", alices, text="b")).status_code == 200  # 3
                refused = await call(http, url, "tok-alice", alices, text="secret argument")
                bobs = await open_session(http, url, "tok-bob")
                for n in range(5):
                    assert (await call(http, url, "tok-bob", bobs, text=str(n))).status_code == 200
                metrics = (await http.get(gateway.url("/metrics"))).text

    assert refused.status_code == 429
    assert 1 <= int(refused.headers["retry-after"]) <= 10  # one token per 10 s
    answer = refused.json()
    assert answer["id"] == 7 and answer["error"]["code"] == -32000
    assert answer["error"]["message"].startswith(
        "Too many requests for caller alice: the limit is 0.1 per second (burst 3, gateway.auth.caller_limits[0])"
    )
    assert answer["error"]["data"]["limit"] == "rate"
    assert 'mcp_gateway_caller_limited_total{limit="rate",rule="slow-lane"} 1.0' in metrics

    rows = [
        (row.caller, row.status, row.chain[0].outcome) for row in open_reader(tmp_path / "audit.db").query(limit=None)
    ]
    assert rows.count(("alice", "refused", "limited")) == 1
    assert rows.count(("alice", "ok", "ok")) == 2 and rows.count(("bob", "ok", "ok")) == 5
    ledger = await anyio.to_thread.run_sync(lambda: b"".join(p.read_bytes() for p in tmp_path.glob("audit.db*")))
    assert b"secret argument" not in ledger  # a refused call's arguments are only hashed


@pytest.mark.spawns
async def test_under_a_concurrent_burst_a_caller_gets_exactly_its_bucket_and_a_bystander_all_its_calls(
    tmp_path: Path,
) -> None:
    limits = "[{callers: [alice], requests_per_s: 0.01, burst: 10}]"  # no refill within the test
    with run_gateway(config(limits), tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        statuses: dict[str, list[int]] = {"alice": [], "bob": []}
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=30, limits=httpx2.Limits(max_connections=200)) as http:
                alices = await open_session(http, url, "tok-alice")  # spends 1 of alice's 10
                bobs = await open_session(http, url, "tok-bob")

                async def one(who: str, session: str, n: int) -> None:
                    # concurrent requests of one session need distinct ids (the SDK pairs answers by id)
                    response = await call(http, url, f"tok-{who}", session, rid=100 + n, text=f"{who}-{n}")
                    statuses[who].append(response.status_code)

                async with anyio.create_task_group() as tg:
                    for n in range(N):
                        tg.start_soon(one, "alice", alices, n)
                        tg.start_soon(one, "bob", bobs, n)
    assert sorted(statuses["alice"]) == [200] * 9 + [429] * (N - 9)
    assert statuses["bob"] == [200] * N


@pytest.mark.spawns
async def test_a_caller_at_its_concurrent_calls_is_refused_until_one_ends_and_others_are_untouched(
    tmp_path: Path,
) -> None:
    with run_gateway(config('[{callers: ["*"], concurrent_calls: 1}]'), tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        with anyio.fail_after(40):
            async with httpx2.AsyncClient(timeout=20) as http:
                alices = await open_session(http, url, "tok-alice")
                bobs = await open_session(http, url, "tok-bob")
                slow = {
                    "jsonrpc": "2.0",
                    "id": 9,
                    "method": "tools/call",
                    "params": {"name": "slow", "arguments": {"seconds": 2, "steps": 2}, "_meta": {"progressToken": 1}},
                }
                async with http.stream("POST", url, json=slow, headers=headers("tok-alice", alices)) as stream:
                    assert stream.status_code == 200
                    lines = stream.aiter_lines()
                    async for line in lines:  # the first progress notice: the call is in flight
                        if line.startswith("data:") and "notifications/progress" in line:
                            break
                    refused = await call(http, url, "tok-alice", alices, text="quick")
                    assert (await call(http, url, "tok-bob", bobs, text="mine")).status_code == 200
                    rest = [line async for line in lines]
                assert any('"done 2"' in line for line in rest)

                async def alice_is_served() -> bool:
                    return (await call(http, url, "tok-alice", alices, text="again")).status_code == 200

                await eventually(alice_is_served)  # the slow call has ended: room again

    assert refused.status_code == 429
    assert refused.headers["retry-after"] == "1"
    assert refused.json()["error"]["data"] == {"limit": "concurrency", "retry_after_s": 1}
    assert "Too many concurrent tool calls for caller alice: 1 in flight" in refused.json()["error"]["message"]


def test_a_caller_limit_must_limit_something_and_its_burst_needs_a_rate() -> None:
    with pytest.raises(ConfigError) as empty:
        parse_config("gateway:\n  auth:\n    caller_limits:\n      - callers: [alice]\n", file="f.yaml")
    assert str(empty.value) == (
        "f.yaml:4: gateway.auth.caller_limits.0: a caller limit needs requests_per_s, concurrent_calls or both"
    )
    with pytest.raises(ConfigError) as burst:
        parse_config("gateway: {auth: {caller_limits: [{burst: 3, concurrent_calls: 1}]}}\n", file="f.yaml")
    assert "burst is the size of the requests_per_s bucket" in str(burst.value)


def test_the_first_rule_matching_the_callers_name_and_its_tokens_claims_applies() -> None:
    rules = [
        {"name": "batch", "callers": ["corp:*"], "claims": {"client_id": "batch"}, "concurrent_calls": 1},
        {"name": "admins", "claims": {"groups": "admins"}, "requests_per_s": 100},
        {"name": "corp", "callers": ["corp:*"], "requests_per_s": 5},
        {"name": "ops", "callers": ["ops"], "concurrent_calls": 4},
    ]
    fed = parse_config(json.dumps({"gateway": {"auth": {"caller_limits": rules}}}))  # JSON is YAML
    limits = CallerLimits(app=None, gateway=None, policies=lambda: fed.limit_policies)  # type: ignore[arg-type]

    def principal(subject: str, **claims: Any) -> Caller:
        return Caller(f"corp:{subject}", frozenset(), {"sub": subject, **claims}, "https://idp", subject)

    def rule(caller: str, who: Caller | None) -> str | None:
        found = limits._limits(dataclasses.replace(who, name=caller) if who is not None else Caller(caller))
        return found.label if found is not None else None  # the name /metrics counts its refusals under

    assert rule("corp:svc", principal("svc", client_id="batch")) == "batch"
    assert rule("corp:ada", principal("ada", groups=["staff", "admins"])) == "admins"  # a list claim contains it
    assert rule("corp:bob", principal("bob", client_id="web")) == "corp"
    assert rule("ops", None) == "ops"
    assert rule("alice", None) is None  # no rule: no limit
    assert rule("ops:x", principal("x", groups="admins")) == "admins"


@pytest.mark.spawns
async def test_a_caller_that_drops_its_connections_never_has_more_than_its_concurrent_calls_running_downstream(
    tmp_path: Path, downstream: Any
) -> None:
    faults = downstream("faults", "streamable_http", own=True)  # counts the sleep calls it runs at once
    settings = f"""
gateway:
  auth:
    caller_limits: [{{callers: [alice], concurrent_calls: 2}}]
servers:
  a: {json.dumps(faults.settings())}
"""
    with run_gateway(settings, tmp_path, tokens=TOKENS) as gateway:
        url = gateway.url()
        with anyio.fail_after(40):
            async with httpx2.AsyncClient(timeout=20) as http:
                alices = await open_session(http, url, "tok-alice")
                bobs = await open_session(http, url, "tok-bob")
                sleep = {"name": "sleep", "arguments": {"seconds": 8}}
                statuses = [
                    await post_and_drop(
                        gateway.port,
                        "tok-alice",
                        alices,
                        {"jsonrpc": "2.0", "id": 10 + n, "method": "tools/call", "params": sleep},
                    )
                    for n in range(8)
                ]
                admitted = statuses.count(200)

                async def running() -> tuple[int, int]:
                    answer = messages(await call(http, url, "tok-bob", bobs, "running", rid=99))[-1]
                    now, peak = answer["result"]["content"][0]["text"].split()
                    return int(now), int(peak)

                async def all_admitted_run() -> bool:
                    return (await running())[0] >= admitted

                await eventually(all_admitted_run)  # the calls that were let in have reached the downstream
                now, peak = await running()

    assert peak <= 2, f"{peak} of alice's calls ran at once downstream (her limit is 2); statuses {statuses}"
    assert statuses[:2] == [200, 200] and statuses[2:] == [429] * 6
