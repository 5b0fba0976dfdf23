"""Per-caller rate limits shared by replicas through a real Redis (``gateway/shared_limits.py``), over real gateway
processes on loopback: two replicas with ``gateway.shared.redis_url`` enforce one bucket per caller between them
(without it, each counts its own); when Redis is killed or hangs, ``redis_down: open`` serves the calls within the
timeout, ``closed`` refuses them with 503 as quickly, and neither ever hangs a call; ``/metrics`` says whether Redis
answers now (probed while no request asks) and counts its failures by a fixed set of reasons, never its URL."""

from __future__ import annotations

import json
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path

import anyio
import httpx2
import pytest
from prometheus_client.parser import text_string_to_metric_families

from gateway.front.http.shared import FAILURE_REASONS
from tests.engines import RedisServer
from tests.fixtures.gateway_proc import PYTHON, echo_argv, run_gateway
from tests.fixtures.procs import RunningServer
from tests.fixtures.raw_http import open_session
from tests.fixtures.waiting import eventually
from tests.front.http.test_sessions import call_echo, echoed

pytestmark = pytest.mark.anyio

TOKENS = "alice=tok-alice,bob=tok-bob"
KEY = "k1-" + "c" * 40
BURST = 6


def config(shared: str) -> str:
    return f"""
gateway:
  audit: {{path: audit.db}}
  auth:
    caller_limits: [{{callers: ["*"], requests_per_s: 0.01, burst: {BURST}}}]
  shared: {{{shared}}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
"""


@contextmanager
def two_replicas(root: Path, shared: str) -> Iterator[list[RunningServer]]:
    with ExitStack() as stack:
        started = []
        for name in ("a", "b"):
            (root / name).mkdir()
            env = {"GATEWAY_STATE_KEY": KEY}
            started.append(stack.enter_context(run_gateway(config(shared), root / name, tokens=TOKENS, env=env)))
        yield started


async def spend(http: httpx2.AsyncClient, replicas: list[RunningServer], token: str, session: str, n: int) -> list[int]:
    """``n`` calls, round-robin over the replicas; their HTTP statuses."""
    statuses = []
    for i in range(n):
        response = await call_echo(http, replicas[i % len(replicas)].url(), token, session, f"c{i}")
        statuses.append(response.status_code)
    return statuses


async def test_two_replicas_with_redis_enforce_one_limit_per_caller(tmp_path: Path, redis_server: RedisServer) -> None:
    with two_replicas(tmp_path, f"redis_url: '{redis_server.url}'") as replicas:
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                alice = await open_session(http, replicas[0].url(), "tok-alice")  # 1 token (initialize)
                # 5 more requests fit the burst of 6, whichever replica serves them; the next is refused.
                assert await spend(http, replicas, "tok-alice", alice, BURST) == [200] * (BURST - 1) + [429]
                refused = await call_echo(http, replicas[0].url(), "tok-alice", alice, "x")
                assert refused.status_code == 429 and "retry-after" in refused.headers
                bob = await open_session(http, replicas[1].url(), "tok-bob")
                assert echoed(await call_echo(http, replicas[0].url(), "tok-bob", bob, "bob's")) == "bob's"


@pytest.mark.spawns
async def test_without_redis_each_replica_counts_its_own_bucket(tmp_path: Path) -> None:
    with two_replicas(tmp_path, "") as replicas:
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                alice = await open_session(http, replicas[0].url(), "tok-alice")
                # a: initialize + 5 calls = its burst; b: 5 calls of its own burst of 6.
                assert await spend(http, replicas, "tok-alice", alice, 10) == [200] * 10
                assert await spend(http, replicas, "tok-alice", alice, 4) == [429, 200, 429, 429]


async def open_serves_and_closed_refuses(
    http: httpx2.AsyncClient, served: RunningServer, shut: RunningServer, session: str
) -> None:
    """With Redis down, twice: ``served`` (``redis_down: open``) answers a call on ``session`` and ``shut``
    (``closed``) refuses one with 503 naming ``gateway.shared.redis_down``, both within the Redis timeout."""
    for _ in range(2):
        started = time.monotonic()
        assert echoed(await call_echo(http, served.url(), "tok-alice", session, "open")) == "open"
        refused = await call_echo(http, shut.url(), "tok-alice", session, "closed")
        assert time.monotonic() - started < 2.0  # two requests, each within its bound
        assert refused.status_code == 503, refused.text
        assert "gateway.shared.redis_down" in refused.json()["error"]["message"]


async def test_with_redis_down_open_serves_and_closed_refuses_and_neither_hangs(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    shared = f"redis_url: '{redis_server.url}', redis_timeout_s: 0.2"
    (tmp_path / "open").mkdir()
    (tmp_path / "closed").mkdir()
    env = {"GATEWAY_STATE_KEY": KEY}
    with (
        run_gateway(config(shared), tmp_path / "open", tokens=TOKENS, env=env) as served,
        run_gateway(config(shared + ", redis_down: closed"), tmp_path / "closed", tokens=TOKENS, env=env) as shut,
    ):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, served.url(), "tok-alice")
                assert echoed(await call_echo(http, shut.url(), "tok-alice", session, "up")) == "up"
                status = (await http.get(shut.url("/status"), headers={"Authorization": "Bearer tok-alice"})).json()
                assert status["shared_limits"] == {"redis": "up", "failures": 0, "on_redis_down": "closed"}

                with redis_server.paused():  # hung: connections stay open, nothing answers
                    await open_serves_and_closed_refuses(http, served, shut, session)

                status = (await http.get(served.url("/status"), headers={"Authorization": "Bearer tok-alice"})).json()
                assert status["shared_limits"]["redis"] == "down" and status["shared_limits"]["failures"] >= 1
                assert status["shared_limits"]["on_redis_down"] == "open"

                redis_server.kill()  # gone: connections refused
                started = time.monotonic()
                assert echoed(await call_echo(http, served.url(), "tok-alice", session, "still")) == "still"
                assert (await call_echo(http, shut.url(), "tok-alice", session, "x")).status_code == 503
                assert time.monotonic() - started < 2.0


async def store_metrics(http: httpx2.AsyncClient, gateway: RunningServer) -> tuple[float, dict[str, float], str]:
    """``mcp_gateway_shared_store_up``, the failures by reason, and the whole scrape, over HTTP."""
    text = (await http.get(gateway.url("/metrics"))).text
    up, failures = -1.0, {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "mcp_gateway_shared_store_up":
                up = sample.value
            elif sample.name == "mcp_gateway_shared_store_failures_total":
                failures[sample.labels["reason"]] = sample.value
    return up, failures, text


async def test_metrics_say_whether_redis_answers_and_count_its_failures_by_reason(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    shared = f"redis_url: '{redis_server.url}', redis_timeout_s: 0.2"
    wrong = redis_server.url.replace(redis_server.password, "not-the-password")
    (tmp_path / "right").mkdir()
    (tmp_path / "wrong").mkdir()
    env = {"GATEWAY_STATE_KEY": KEY}
    zero = dict.fromkeys(FAILURE_REASONS, 0.0)
    with (
        run_gateway(config(shared), tmp_path / "right", tokens=TOKENS, env=env) as gateway,
        run_gateway(config(f"redis_url: '{wrong}'"), tmp_path / "wrong", tokens=TOKENS, env=env) as refused,
    ):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, gateway.url(), "tok-alice")
                up, failures, _ = await store_metrics(http, gateway)
                assert (up, failures) == (1.0, zero)

                # A replica whose password Redis refuses counts it as such, and its scrape holds no URL or password.
                other = await open_session(http, refused.url(), "tok-bob")
                assert echoed(await call_echo(http, refused.url(), "tok-bob", other, "served")) == "served"
                up, failures, text = await store_metrics(http, refused)
                assert (up, failures) == (0.0, zero | {"auth": failures["auth"]}) and failures["auth"] >= 1
                for secret in (redis_server.password, "not-the-password", "redis://"):
                    assert secret not in text

                with redis_server.paused():  # hung: the round trip times out
                    assert echoed(await call_echo(http, gateway.url(), "tok-alice", session, "paused")) == "paused"
                    up, failures, _ = await store_metrics(http, gateway)
                    assert (up, failures) == (0.0, zero | {"timeout": failures["timeout"]}) and failures["timeout"] >= 1

                async def answers_again() -> bool:  # no request asks: the probe sees it back
                    return (await store_metrics(http, gateway))[0] == 1.0

                await eventually(answers_again, within=10)

                redis_server.kill()  # gone: the connection is refused
                assert echoed(await call_echo(http, gateway.url(), "tok-alice", session, "killed")) == "killed"
                up, failures, _ = await store_metrics(http, gateway)
                assert up == 0.0 and failures["connection"] >= 1
                assert failures["auth"] == failures["response"] == failures["other"] == 0.0


def test_the_redis_password_is_a_secret_the_log_never_shows() -> None:
    from gateway.config import parse_config
    from gateway.errors import ConfigError
    from gateway.observe.logs import config_secrets

    config = parse_config(
        "gateway:\n  shared: {redis_url: 'redis://:s3cret-pw@127.0.0.1:6379/0'}\n", file="federation.yaml", env={}
    )
    assert "s3cret-pw" in config_secrets(config)
    with pytest.raises(ConfigError) as refused:
        parse_config("gateway:\n  shared: {redis_url: 'http://x:pw-shown@h'}\n", file="federation.yaml", env={})
    assert "must be a Redis URL" in str(refused.value) and "pw-shown" not in str(refused.value)
