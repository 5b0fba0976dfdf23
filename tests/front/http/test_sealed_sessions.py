"""Sessions any replica can serve (``gateway/sessions.py``), over real gateway processes on loopback that share the
``GATEWAY_STATE_KEY``: a session opened on one replica goes on at another without a new ``initialize`` (with the
client's info and capabilities from its sealed id), also after the first one is killed; its caller binding holds
there; a tampered id, or one from a deployment with another key, answers 404; a rotated key still opens it; and a
call's back-channel (a sampling request on the call's own POST stream) works on the replica serving the call.

A DELETE ends a session everywhere when the replicas share a Redis (``gateway.shared.redis_url``): the replica that
gets it writes a revocation entry that lives as long as the id would, and every replica looks for it before it
serves a request on a sealed id (held already, or about to be re-created). Without a shared store, another replica
keeps accepting the id until ``session_max_age_s``; with Redis down, ``redis_down`` decides, as for the limits."""

from __future__ import annotations

import json
import signal
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import httpx2
import pytest
from mcp.server.lowlevel import Server

from gateway.front.continuation import Continuations
from gateway.front.http.seal import SessionSeal
from gateway.front.http.sessions import SealedSessions
from gateway.ledger.engines import open_reader
from tests.engines import RedisServer
from tests.fixtures.gateway_proc import FIDELITY, PYTHON, echo_argv, run_gateway
from tests.fixtures.procs import RunningServer
from tests.fixtures.raw_http import ACCEPT, INITIALIZE, VERSION, headers, messages, open_session
from tests.front.http.test_sessions import call_echo, echoed
from tests.front.http.test_shared_limits import open_serves_and_closed_refuses
from tests.replicas import deployment, kill_replica

pytestmark = pytest.mark.anyio

TOKENS = "alice=tok-alice,bob=tok-bob"
KEY = "k1-" + "a" * 40
OTHER_KEY = "k2-" + "b" * 40

CONFIG = f"""
gateway:
  audit: {{path: audit.db}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
  f:
    transport: stdio
    command: {PYTHON}
    args: [{json.dumps(FIDELITY)}, --stdio, --name, f]
"""


@contextmanager
def replicas(root: Path, *keys: str, shared: str = "") -> Iterator[list[RunningServer]]:
    """One gateway process per key (each with its own folder and ledger), all serving CONFIG, with ``shared`` as
    the inside of its ``gateway.shared`` section."""
    config = CONFIG.replace("gateway:\n", f"gateway:\n  shared: {{{shared}}}\n", 1)
    with ExitStack() as stack:
        started = []
        for index, key in enumerate(keys):
            folder = root / f"r{index}"
            folder.mkdir(parents=True)
            started.append(
                stack.enter_context(run_gateway(config, folder, tokens=TOKENS, env={"GATEWAY_STATE_KEY": key}))
            )
        yield started


def _echo(request_id: int) -> dict[str, Any]:
    """A tools/call of the echo tool, its text naming the request."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "echo", "arguments": {"text": f"b{request_id}"}},
    }


def tampered(session: str) -> str:
    middle = len(session) // 2
    return session[:middle] + ("A" if session[middle] != "A" else "B") + session[middle + 1 :]


@pytest.mark.spawns
async def test_a_session_opened_on_one_replica_goes_on_at_another_without_initialize(tmp_path: Path) -> None:
    with replicas(tmp_path, KEY, KEY) as (a, b):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, a.url(), "tok-alice")
                assert session.startswith("v1.")  # sealed, not the SDK's random hex
                assert echoed(await call_echo(http, a.url(), "tok-alice", session, "on a")) == "on a"

                kill_replica(a)  # the replica that opened it dies (SIGKILL)
                answers: list[str] = []

                async def on_b(request_id: int) -> None:
                    response = await http.post(b.url(), json=_echo(request_id), headers=headers("tok-alice", session))
                    assert response.status_code == 200, response.text
                    (answer,) = [m for m in messages(response) if m.get("id") == request_id]
                    answers.append(answer["result"]["content"][0]["text"])

                async with anyio.create_task_group() as tg:  # b's first requests for it, at once: one re-creation
                    for request_id in (1, 2, 3):
                        tg.start_soon(on_b, request_id)
                assert sorted(answers) == ["b1", "b2", "b3"]
                assert echoed(await call_echo(http, b.url(), "tok-alice", session, "again")) == "again"
                async with http.stream("GET", b.url(), headers=headers("tok-alice", session)) as stream:
                    assert stream.status_code == 200  # its GET stream opens on the replica now serving it
                    assert stream.headers["content-type"].startswith("text/event-stream")

                # The caller binding travels inside the id: bob gets 404, as for an unknown session.
                assert (await call_echo(http, b.url(), "tok-bob", session, "x")).status_code == 404
                assert (await call_echo(http, b.url(), "tok-alice", tampered(session), "x")).status_code == 404
                status = (await http.get(b.url("/status"), headers=headers("tok-alice"))).json()
                assert status["sessions"]["revived"] == 1

                assert (await http.delete(b.url(), headers=headers("tok-alice", session))).status_code == 200
                assert (await call_echo(http, b.url(), "tok-alice", session, "ended")).status_code == 404
        b.process.send_signal(signal.SIGTERM)
        b.process.wait(timeout=20)
        log = b.output()

    rows = open_reader(tmp_path / "r1" / "audit.db").query()
    # The client's info came from the sealed id: b never saw its initialize.
    assert [(r.caller, r.tool, r.client_name, r.client_version, r.status) for r in rows] == [
        ("alice", "echo", "raw", "1", "ok")
    ] * 4
    assert session not in log and session[:64] not in log


REVIVALS = 30
"""Sessions re-created by three first requests at once each. Before the fix some of those requests were served on
the transport before its server task had connected it (the SDK's "No read stream writer available", a bare 500):
2 to 13 of 90 to 120 per run here, on either parser. The in-memory test below makes that race certain."""


@pytest.mark.spawns
async def test_every_one_of_concurrent_first_requests_for_a_session_new_to_a_replica_is_answered(
    tmp_path: Path,
) -> None:
    """Three first requests at once for each of many sessions opened on a, sent to b: b re-creates each session once,
    and a request that arrives while that is under way waits for it (before the fix: served on the half-made
    session, 500)."""
    with replicas(tmp_path, KEY, KEY) as (a, b):
        with anyio.fail_after(90):
            async with httpx2.AsyncClient(timeout=20) as http:
                sessions = [await open_session(http, a.url(), "tok-alice") for _ in range(REVIVALS)]
                failed: list[str] = []

                async def first(session: str, request_id: int) -> None:
                    response = await http.post(b.url(), json=_echo(request_id), headers=headers("tok-alice", session))
                    answers = messages(response) if response.status_code == 200 else []
                    texts = [m["result"]["content"][0]["text"] for m in answers if m.get("id") == request_id]
                    if texts != [f"b{request_id}"]:
                        failed.append(f"{response.status_code} {response.text[:80]!r}")

                for session in sessions:
                    async with anyio.create_task_group() as tg:
                        for request_id in (1, 2, 3):
                            tg.start_soon(first, session, request_id)
                status = (await http.get(b.url("/status"), headers=headers("tok-alice"))).json()
        log = b.output()
    assert failed == [], f"{len(failed)} of {3 * REVIVALS} first requests failed: {failed[:3]}"
    assert status["sessions"]["revived"] == REVIVALS
    assert "No read stream writer" not in log


@pytest.mark.spawns
async def test_an_id_from_another_deployment_is_404_and_a_rotated_key_still_opens_old_ids(tmp_path: Path) -> None:
    with replicas(tmp_path, KEY, OTHER_KEY, f"{OTHER_KEY},{KEY}") as (old, other, rotated):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, old.url(), "tok-alice")
                refused = await call_echo(http, other.url(), "tok-alice", session, "x")
                assert refused.status_code == 404, refused.text
                assert refused.json()["error"]["message"] == "Session not found"
                assert echoed(await call_echo(http, rotated.url(), "tok-alice", session, "rotated")) == "rotated"
                # ... and the rotated replica seals with its first key, which the old deployment cannot open.
                fresh = await open_session(http, rotated.url(), "tok-alice")
                assert (await call_echo(http, old.url(), "tok-alice", fresh, "x")).status_code == 404
                assert echoed(await call_echo(http, other.url(), "tok-alice", fresh, "new key")) == "new key"


@pytest.mark.spawns
async def test_a_calls_back_channel_works_on_its_own_post_stream_at_the_replica_serving_it(tmp_path: Path) -> None:
    """The session was opened on a; the call goes to b, whose downstream asks the client for sampling on the
    call's own POST stream; the client's answer goes to b too (it must: a has no such request)."""
    with replicas(tmp_path, KEY, KEY) as (a, b):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=20) as http:
                session = await open_sampling_session(http, a.url())
                assert await sample_through(http, b.url(), session, 9, "from b's client") == (
                    "sampled: from b's client (m)",
                    "",  # no balancer in front, so no replica named
                )


def test_a_sealed_id_opens_only_under_its_keys_and_until_it_expires() -> None:
    now = [1000.0]
    seal = SessionSeal([KEY.encode()], 60, clock=lambda: now[0])
    owner = {"client_id": "alice", "issuer": None, "subject": None}
    minted = seal.mint(owner=owner, protocol_version=VERSION, client_params={"clientInfo": {"name": "c"}})  # type: ignore[arg-type]
    assert minted is not None
    opened = seal.open(minted)
    assert (
        opened is not None
        and opened.protocol_version == VERSION
        and opened.client_params["clientInfo"] == {"name": "c"}
    )
    assert SessionSeal([OTHER_KEY.encode()], 60).open(minted) is None
    assert SessionSeal([OTHER_KEY.encode(), KEY.encode()], 60, clock=lambda: now[0]).open(minted) is not None
    assert seal.open(tampered(minted)) is None
    state = Continuations([KEY.encode()], 60).seal(
        method="tools/call", name="t", arguments={}, backend="b", local="t", caller="alice", state=None
    )
    assert seal.open(state) is None  # a requestState under the same key is never a session id
    now[0] += 61
    assert seal.open(minted) is None


async def open_sampling_session(http: httpx2.AsyncClient, url: str) -> str:
    """A session opened at ``url`` by alice's client, which can sample; its id."""
    init = {**INITIALIZE, "params": {**INITIALIZE["params"], "capabilities": {"sampling": {}}}}  # type: ignore[dict-item]
    opened = await http.post(url, json=init, headers=headers("tok-alice"))
    session = opened.headers["mcp-session-id"]
    done = {"jsonrpc": "2.0", "method": "notifications/initialized"}
    assert (await http.post(url, json=done, headers=headers("tok-alice", session))).status_code == 202
    return session


async def sample_through(
    http: httpx2.AsyncClient, url: str, session: str, request_id: int, text: str
) -> tuple[str, str]:
    """Call the downstream's ``sample`` tool; answer its sampling request with ``text`` by a POST of its own (as the
    SDK's client does); the tool's answer and the replica that served the call (``X-Replica``, set by HAProxy)."""
    call = {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": "sample", "arguments": {"prompt": "p"}},
    }
    async with http.stream("POST", url, json=call, headers=headers("tok-alice", session)) as stream:
        assert stream.status_code == 200
        async for line in stream.aiter_lines():
            if not line.startswith("data:") or not line[5:].strip():
                continue
            message = json.loads(line[5:])
            if message.get("method") == "sampling/createMessage":
                content = {"type": "text", "text": text}
                answer = {"jsonrpc": "2.0", "id": message["id"], "result": {"role": "assistant", "content": content}}
                answer["result"]["model"] = "m"
                posted = await http.post(url, json=answer, headers=headers("tok-alice", session))
                assert posted.status_code == 202, posted.text
            elif message.get("id") == request_id:
                return str(message["result"]["content"][0]["text"]), stream.headers.get("x-replica", "")
    raise AssertionError("the call's stream ended without its answer")


@pytest.mark.spawns
async def test_hashing_on_the_session_id_keeps_a_calls_back_channel_on_its_replica_and_moves_it_when_that_dies(
    tmp_path: Path,
) -> None:
    """HAProxy with ``balance hdr(mcp-session-id)`` (docs/deployment.md): the sampling answer, a POST of its own,
    reaches the replica running the call; when that replica is killed, the session moves to the other one, which
    re-creates it from its id, and the back-channel works there."""
    balance = "balance hdr(mcp-session-id)\n    hash-type consistent"
    with deployment(tmp_path, 2, pg_url=None, redis_url=None, fidelity=True, balance=balance) as (servers, balancer):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=20) as http:
                url = balancer.url()
                session = await open_sampling_session(http, url)
                first = [await sample_through(http, url, session, 10 + i, f"answer {i}") for i in range(3)]
                (replica,) = {served_by for _, served_by in first}  # one replica served them all
                assert [text for text, _ in first] == [f"sampled: answer {i} (m)" for i in range(3)]

                kill_replica(servers[int(replica[1:])])
                after = await sample_through(http, url, session, 20, "after the kill")
                assert after == ("sampled: after the kill (m)", "r1" if replica == "r0" else "r0")


# ----------------------------------------------------------------------------------------------- ending a session


async def test_with_a_shared_redis_a_delete_on_one_replica_ends_the_session_on_every_replica(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    with replicas(tmp_path, KEY, KEY, shared=f"redis_url: '{redis_server.url}'") as (a, b):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                held = await open_session(http, a.url(), "tok-alice")  # a and b will both hold this one
                unseen = await open_session(http, a.url(), "tok-alice")  # b never sees this one before its end
                assert echoed(await call_echo(http, b.url(), "tok-alice", held, "on b")) == "on b"
                # Another caller cannot end it: 404, as for a session that does not exist, and nothing is revoked.
                assert (await http.delete(b.url(), headers=headers("tok-bob", held))).status_code == 404
                assert (await http.delete(a.url(), headers=headers("tok-bob", unseen))).status_code == 404
                assert echoed(await call_echo(http, b.url(), "tok-alice", held, "still")) == "still"

                async with http.stream("GET", b.url(), headers=headers("tok-alice", held)) as stream:
                    assert stream.status_code == 200  # b's open GET stream for it ...
                    for session in (held, unseen):
                        assert (await http.delete(a.url(), headers=headers("tok-alice", session))).status_code == 200
                    ended = await call_echo(http, b.url(), "tok-alice", held, "after the end")
                    assert ended.status_code == 404, ended.text
                    assert ended.json()["error"]["message"] == "Session not found"
                    async for _ in stream.aiter_bytes():  # ... is closed once b learned of the end
                        pass
                assert (await call_echo(http, b.url(), "tok-alice", unseen, "x")).status_code == 404
                assert (await call_echo(http, a.url(), "tok-alice", held, "x")).status_code == 404
                assert (await http.delete(b.url(), headers=headers("tok-alice", held))).status_code == 404
                status = (await http.get(b.url("/status"), headers=headers("tok-alice"))).json()
                assert status["sessions"]["ended_elsewhere"] == 2  # the one it held, and the one it never saw
                # The revocation lives as long as the id would have, and no longer.
                ttl = await redis_ttls(redis_server)
                assert len(ttl) == 2 and all(86_000 < t <= 86_400 for t in ttl), ttl
                fresh = await open_session(http, b.url(), "tok-alice")  # a new session is not affected
                assert echoed(await call_echo(http, a.url(), "tok-alice", fresh, "new")) == "new"


async def redis_ttls(server: RedisServer) -> list[float]:
    """The remaining lifetime, in seconds, of every session revocation in ``server``."""
    import redis.asyncio

    client: Any = redis.asyncio.Redis.from_url(server.url)
    try:
        keys = [key async for key in client.scan_iter(match="mcp-gateway:session-ended:*")]
        return [(await client.pttl(key)) / 1000 for key in keys]
    finally:
        await client.aclose()


@pytest.mark.spawns
async def test_without_a_shared_store_a_delete_ends_the_session_only_on_its_replica(tmp_path: Path) -> None:
    """The documented limit (docs/deployment.md): another replica accepts the id until ``session_max_age_s``."""
    with replicas(tmp_path, KEY, KEY) as (a, b):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, a.url(), "tok-alice")
                assert (await http.delete(a.url(), headers=headers("tok-alice", session))).status_code == 200
                assert (await call_echo(http, a.url(), "tok-alice", session, "x")).status_code == 404
                assert echoed(await call_echo(http, b.url(), "tok-alice", session, "elsewhere")) == "elsewhere"


async def test_with_redis_down_open_serves_a_sealed_session_and_closed_refuses_it_and_neither_hangs(
    tmp_path: Path, redis_server: RedisServer
) -> None:
    shared = f"redis_url: '{redis_server.url}', redis_timeout_s: 0.2"
    with (
        replicas(tmp_path, KEY, KEY, shared=shared) as (served, _),
        replicas(tmp_path / "closed", KEY, shared=shared + ", redis_down: closed") as (shut,),
    ):
        with anyio.fail_after(60):
            async with httpx2.AsyncClient(timeout=10) as http:
                session = await open_session(http, served.url(), "tok-alice")
                assert echoed(await call_echo(http, shut.url(), "tok-alice", session, "up")) == "up"
                with redis_server.paused():  # hung: connections stay open, nothing answers
                    await open_serves_and_closed_refuses(http, served, shut, session)
                    # A DELETE while Redis cannot answer still ends the session where it is sent.
                    assert (await http.delete(served.url(), headers=headers("tok-alice", session))).status_code == 200
                    assert (await call_echo(http, served.url(), "tok-alice", session, "x")).status_code == 404
        assert "sessions.end_not_shared" in served.output()


async def test_a_request_that_arrives_while_its_session_is_being_re_created_waits_until_it_is() -> None:
    """The race of the test above, made certain in memory: a second first request for a sealed id reaches the
    manager once the first one has registered the re-created session and before that session's server task has
    run (asyncio runs every task already ready before the one just started); it waits for the re-creation instead
    of meeting a transport with no connection (the SDK's "No read stream writer available", answered 500)."""
    seal = SessionSeal([KEY.encode()], 60)
    session = seal.mint(owner=None, protocol_version=VERSION, client_params=INITIALIZE["params"])
    assert session is not None
    manager = SealedSessions(Server("t"), seal=seal, json_response=True)
    asgi = httpx2.ASGITransport(app=manager.handle_request)
    async with manager.run(), httpx2.AsyncClient(transport=asgi, base_url="http://127.0.0.1") as http:

        async def ping(request_id: int) -> httpx2.Response:
            body = {"jsonrpc": "2.0", "id": request_id, "method": "ping"}
            return await http.post("/mcp", json=body, headers={"Accept": ACCEPT, "Mcp-Session-Id": session})

        with anyio.fail_after(5):
            first: list[httpx2.Response] = []

            async def opening() -> None:
                first.append(await ping(1))

            async with anyio.create_task_group() as tg:
                tg.start_soon(opening)
                while session not in manager._server_instances:  # registered: its server task is only scheduled
                    await anyio.lowlevel.checkpoint()
                assert manager.revived == 0  # the re-creation is under way
                second = await ping(2)
        assert (second.status_code, second.json()) == (200, {"jsonrpc": "2.0", "id": 2, "result": {}})
        assert (first[0].status_code, first[0].json()["id"]) == (200, 1)
        assert manager.revived == 1
