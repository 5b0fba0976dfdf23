"""Three gateway replicas on real engines (tests/replicas.py): a real HAProxy balancing round-robin without affinity,
a real PostgreSQL ledger, a real Redis for the shared limits, all on loopback. Under load from session-era and
stateless clients, one replica is SIGKILLed and later PostgreSQL is stopped for ``OUTAGE_S``: every call that was
not in flight on the killed replica is answered, the session-era clients go on at the other replicas without a new
``initialize``, and PostgreSQL ends up with exactly one row per answered call (the calls in flight on the killed
replica may or may not have one: their answers were lost, not necessarily their rows)."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

import anyio
import pytest

from gateway.ledger.engines import open_reader
from gateway.ledger.readers import Filters
from gateway.ledger.records import args_hash
from tests.engines import PostgresServer, RedisServer
from tests.replicas import Load, Outcome, deployment, kill_replica

pytestmark = pytest.mark.anyio

SESSIONS = 4
STATELESS = 2
STEP = 40
"""Answered calls between one event and the next."""
OUTAGE_S = 20.0
"""How long PostgreSQL is down while the load goes on (the issue's figure)."""


async def test_three_replicas_behind_haproxy_lose_no_call_and_no_row_to_a_replica_kill_and_a_postgres_outage(
    tmp_path: Path, own_postgres: PostgresServer, redis_server: RedisServer
) -> None:
    pg_url = own_postgres.create_database("ledger")
    with deployment(tmp_path, 3, pg_url=pg_url, redis_url=redis_server.url) as (replicas, balancer):
        load = Load(balancer.url())
        with anyio.fail_after(OUTAGE_S + 90):
            async with anyio.create_task_group() as tg:
                for index in range(SESSIONS):
                    tg.start_soon(load.session_client, index)
                for index in range(STATELESS):
                    tg.start_soon(load.stateless_client, index)
                await load.wait_answered(STEP)

                killed_at = time.monotonic()
                await anyio.to_thread.run_sync(kill_replica, replicas[0])
                await load.wait_answered(STEP)

                down_at = time.monotonic()
                await anyio.to_thread.run_sync(own_postgres.stop)
                before_outage = load.answered
                await anyio.sleep(OUTAGE_S)  # the outage's length is the subject here, not a synchronisation
                during_outage = load.answered - before_outage
                await anyio.to_thread.run_sync(own_postgres.start)
                up_at = time.monotonic()
                await load.wait_answered(STEP)
                load.stop.set()

            answered = [o for o in load.outcomes if o.ok]
            failed = [o for o in load.outcomes if not o.ok]
            # Only calls in flight on the killed replica when it died failed: started before the kill, ended after.
            for outcome in failed:
                assert outcome.started <= killed_at + 0.5 and outcome.ended >= killed_at, outcome
            assert len(failed) <= SESSIONS + STATELESS, "\n".join(
                f"{o.started - killed_at:+.3f} {o.ended - killed_at:+.3f} {o.kind} {o.replica} {o.detail[-300:]}"
                for o in failed
            )  # one call in flight per client at most
            assert load.initializes == SESSIONS  # no session-era client initialized again
            after_kill = [o for o in answered if o.started > killed_at + 1]
            assert {o.kind for o in after_kill} == {"session", "stateless"}
            assert {o.replica for o in after_kill} == {"r1", "r2"}
            assert {o.replica for o in answered if o.ended < killed_at} == {"r0", "r1", "r2"}  # round robin
            assert during_outage >= STEP  # calls were served while PostgreSQL was down
            assert up_at - down_at >= OUTAGE_S

            print(
                f"replicas: {len(answered)} answered, {len(failed)} lost in flight on the killed replica, "
                f"{during_outage} during the {OUTAGE_S:g} s PostgreSQL outage; session-era interruption at the kill: "
                f"{interruption(load.outcomes, killed_at) * 1000:.0f} ms at most"
            )
            wanted = Counter(args_hash({"text": o.text}) for o in answered)
            lost = {args_hash({"text": o.text}) for o in failed}

            def rows() -> Counter[str]:
                return Counter(
                    row.args_hash
                    for row in open_reader(pg_url).query(Filters(tool="echo"), limit=None)
                    if row.status == "ok"
                )

            # The replicas replay their spools once PostgreSQL is back: wait (bounded) until every answer has a row.
            with anyio.fail_after(60):
                while True:
                    have = await anyio.to_thread.run_sync(rows)
                    if all(have[h] >= n for h, n in wanted.items()):
                        break
                    await anyio.sleep(0.2)  # polling another process's writes, bounded above
    extra = set(have) - set(wanted)
    assert extra <= lost, f"rows for calls never made: {sorted(extra - lost)[:5]}"
    assert all(n == 1 for n in have.values())  # no row twice
    assert sum(have[h] for h in wanted) == len(answered)


def interruption(outcomes: list[Outcome], at: float) -> float:
    """The longest a session-era client went without an answer across ``at``: from its last answer before to its
    first answer after."""
    worst = 0.0
    for client in {o.client for o in outcomes if o.kind == "session"}:
        mine = [o for o in outcomes if o.kind == "session" and o.client == client and o.ok]
        before = max((o.ended for o in mine if o.ended <= at), default=None)
        after = min((o.ended for o in mine if o.ended > at), default=None)
        if before is not None and after is not None:
            worst = max(worst, after - before)
    return worst
