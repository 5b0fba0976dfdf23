"""The gateway as an OAuth client of a downstream, per caller (issue 26), against real parts: the tests' OpenID
provider (tests/fixtures/oidc_provider.mjs) as the authorization server of a real OAuth-protected MCP server
(tests/fixtures/oauth_mcp_server.py), the gateway as a process, each caller's browser driven with plain HTTP through
the gateway's sign-in page, the provider's login form and the gateway's callback."""

from __future__ import annotations

import json
import os
import re
import sqlite3
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from urllib.parse import urljoin

import anyio
import httpx2
import pytest
from mcp.client import Client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared.exceptions import MCPError, UrlElicitationRequiredError
from mcp_types import URL_ELICITATION_REQUIRED

from gateway.auth.connections import WATCH_S, Connections
from gateway.auth.keys import load_key
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, answer_elicitation, first_text, mcp_session, run_gateway
from tests.fixtures.identity import IdentityProvider, holds_jwt, start_identity_provider
from tests.fixtures.procs import RunningServer, free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = [pytest.mark.anyio, pytest.mark.spawns]

WAIT = 30.0
TOKENS = "alice=tok-alice-0123456789,bob=tok-bob-0123456789,ops=tok-ops-0123456789"
STATE_KEY = "k" * 48


@contextmanager
def oauth_world(folder: Path, *, ttl_s: int | None = None) -> Iterator[tuple[IdentityProvider, RunningServer, int]]:
    """The provider (access tokens living ``ttl_s``) and the protected server; yields them and the gateway's port."""
    mcp_port = free_port()
    with ExitStack() as stack:
        idp = stack.enter_context(start_identity_provider(f"http://127.0.0.1:{mcp_port}/mcp", access_ttl_s=ttl_s))
        argv = [PYTHON, str(FIXTURES / "oauth_mcp_server.py"), str(mcp_port), idp.issuer]
        server = stack.enter_context(start_http_server(argv, mcp_port))
        yield idp, server, free_port()


def config(
    server: RunningServer,
    port: int,
    oauth: str = 'allow_http: true, scope: "openid mcp:tools"',
    ledger: str = "audit.db",
    url: str | None = None,
) -> str:
    shared = f", url: {json.dumps(url)}" if url else ""
    return f"""
gateway:
  name: gw
  audit: {{path: {ledger}{shared}}}
  auth: {{connect_url: "http://127.0.0.1:{port}", operators: [ops]}}
servers:
  remote:
    transport: streamable_http
    url: {server.url()}
    auth: {{oauth: {{{oauth}}}}}
"""


@contextmanager
def gateway(folder: Path, server: RunningServer, port: int, **oauth: str) -> Iterator[RunningServer]:
    env = {"GATEWAY_STATE_KEY": STATE_KEY}
    with run_gateway(config(server, port, **oauth), folder, tokens=TOKENS, env=env, port=port) as running:
        yield running


async def sign_in(gw: RunningServer, caller_token: str, account: str) -> httpx2.Response:
    """Sign in through the gateway's page as a browser would: the page, the provider's login form, the callback."""
    async with httpx2.AsyncClient(timeout=20) as browser:
        response = await browser.get(gw.url("/ui/connect/remote"), headers={"Authorization": f"Bearer {caller_token}"})
        assert response.status_code == 303, response.text
        location = response.headers["location"]
        callback = gw.url("/ui/connect/callback")
        for _ in range(10):
            if location.startswith(callback):
                break
            page = await browser.get(location)
            if page.status_code in (302, 303):
                location = urljoin(str(page.url), page.headers["location"])
                continue
            action = re.search(r'action="([^"]+)"', page.text)
            prompt = re.search(r'name="prompt" value="([^"]+)"', page.text)
            assert action and prompt, page.text
            form = {"prompt": prompt.group(1), "login": account, "password": "any"}
            posted = await browser.post(urljoin(location, action.group(1)), data=form)
            assert posted.status_code in (302, 303), posted.text
            location = urljoin(str(posted.url), posted.headers["location"])
        else:
            raise AssertionError("the sign-in did not come back to the gateway's callback")
        return await browser.get(location)


def holding_jwt(folder: Path) -> list[str]:
    """The ledger's files (the database, its journal) that hold a JWT."""
    return [file.name for file in folder.glob("audit.db*") if holds_jwt(file.read_bytes())]


async def whoami(gw: RunningServer, token: str) -> tuple[bool, str]:
    async with mcp_session(gw.url(), token=token) as session:
        with anyio.fail_after(WAIT):
            result = await session.call_tool("whoami", {})
    return bool(result.is_error), first_text(result)


async def tools_of(gw: RunningServer, token: str) -> set[str]:
    async with mcp_session(gw.url(), token=token) as session:
        return {tool.name for tool in (await session.list_tools()).tools}


async def ready(gw: RunningServer) -> None:
    """Until the gateway lists the server's tools (its shared session opened with a signed-in caller's token)."""

    async def listed() -> bool:
        return "whoami" in await tools_of(gw, "tok-ops-0123456789")

    await eventually(listed, within=WAIT)


async def test_two_callers_sign_in_with_two_accounts_and_each_gets_their_own(tmp_path: Path) -> None:
    with oauth_world(tmp_path) as (_idp, server, port), gateway(tmp_path, server, port) as gw:
        # before anyone signed in: the server's status names the link
        async with httpx2.AsyncClient() as http:
            status = (await http.get(gw.url("/status"), headers={"Authorization": "Bearer tok-ops-0123456789"})).text
        assert "/ui/connect/remote" in status
        page = await sign_in(gw, "tok-alice-0123456789", "alice-account")
        assert page.status_code == 200 and "alice is signed in to remote" in page.text, page.text
        await ready(gw)
        # bob has not signed in: his call answers with the link, and goes nowhere
        error, text = await whoami(gw, "tok-bob-0123456789")
        assert error and f"http://127.0.0.1:{port}/ui/connect/remote" in text, text
        # a client that declares URL-mode elicitation (SEP-1036) is asked to open the link instead
        async with mcp_session(gw.url(), token="tok-bob-0123456789", elicitation_callback=answer_elicitation) as bob:
            with anyio.fail_after(WAIT), pytest.raises(MCPError) as asked:
                await bob.call_tool("whoami", {})
        assert asked.value.error.code == URL_ELICITATION_REQUIRED
        [elicitation] = UrlElicitationRequiredError.from_error(asked.value.error).elicitations
        assert elicitation.url == f"http://127.0.0.1:{port}/ui/connect/remote" and elicitation.elicitation_id
        assert (await whoami(gw, "tok-alice-0123456789")) == (False, "account: alice-account")
        page = await sign_in(gw, "tok-bob-0123456789", "bob-account")
        assert page.status_code == 200, page.text
        assert (await whoami(gw, "tok-bob-0123456789")) == (False, "account: bob-account")
        assert (await whoami(gw, "tok-alice-0123456789")) == (False, "account: alice-account")
        log = gw.output()
    # the ledger's file holds the tokens sealed: no JWT in it, nor in the log
    db = sqlite3.connect(tmp_path / "audit.db")
    rows = db.execute("SELECT caller, sealed FROM downstream_tokens").fetchall()
    assert sorted(caller for caller, _ in rows if caller) == ["alice", "bob"]
    for _caller, sealed in rows:
        assert not holds_jwt(bytes(sealed))
    assert holding_jwt(tmp_path) == []  # the ledger's rows of the calls, its journal: no JWT anywhere
    assert not holds_jwt(log), "a JWT reached the gateway's log"


async def test_each_caller_lists_the_tools_their_own_account_lists(tmp_path: Path) -> None:
    with oauth_world(tmp_path) as (_idp, server, port), gateway(tmp_path, server, port) as gw:
        assert (await sign_in(gw, "tok-alice-0123456789", "alice-account")).status_code == 200
        await ready(gw)
        assert (await sign_in(gw, "tok-bob-0123456789", "bob-account")).status_code == 200  # bob signed in last

        async def listed_own() -> bool:
            return await tools_of(gw, "tok-alice-0123456789") == {"whoami", "read_mail", "unlock_drafts", "alice_notes"}

        await eventually(listed_own, within=WAIT)
        assert await tools_of(gw, "tok-bob-0123456789") == {"whoami", "read_mail", "unlock_drafts", "bob_notes"}
        async with mcp_session(gw.url(), token="tok-alice-0123456789") as alice:
            with anyio.fail_after(WAIT):
                assert first_text(await alice.call_tool("alice_notes", {})) == "notes of alice-account"
                with pytest.raises(MCPError, match="Unknown tool: 'bob_notes'"):  # not hers: as if it did not exist
                    await alice.call_tool("bob_notes", {})
        # a caller who has not signed in sees what the server lists to the account the gateway lists with
        assert "whoami" in await tools_of(gw, "tok-ops-0123456789")


async def test_a_restart_keeps_the_sign_in_and_revocation_ends_it(tmp_path: Path) -> None:
    with oauth_world(tmp_path) as (_idp, server, port):
        with gateway(tmp_path, server, port) as gw:
            assert (await sign_in(gw, "tok-alice-0123456789", "alice-account")).status_code == 200
            await ready(gw)
        # the operator's command: who is connected to what, from the same file, never a token
        with anyio.fail_after(WAIT):
            listed = await anyio.run_process(
                [PYTHON, "-m", "gateway", "connections", "-c", str(tmp_path / "federation.yaml")],
                env={**os.environ, "GATEWAY_STATE_KEY": STATE_KEY},
            )
        said = listed.stdout.decode() + listed.stderr.decode()
        assert said.startswith("alice\tremote\ttoken expires in "), said
        assert "refreshable" in said and not holds_jwt(said)
        with gateway(tmp_path, server, port) as gw:  # a new process: the tokens come from the ledger's file
            await ready(gw)
            assert (await whoami(gw, "tok-alice-0123456789")) == (False, "account: alice-account")
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice-0123456789"}) as http:
                listing = await http.get(gw.url("/ui/connections"))
                assert "alice -&gt; remote" in listing.text and not holds_jwt(listing.text), listing.text
                revoked = await http.post(
                    gw.url("/ui/connections"),
                    data={"backend": "remote", "caller": "alice"},
                    headers={"Origin": f"http://127.0.0.1:{port}"},
                )
            assert revoked.status_code == 303, revoked.text
            error, text = await whoami(gw, "tok-alice-0123456789")
            assert error and "/ui/connect/remote" in text, text
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-ops-0123456789"}) as http:
                status, metrics = await http.get(gw.url("/status")), await http.get(gw.url("/metrics"))
                ui = await http.get(gw.url("/ui/"))
            log = gw.output()
    assert status.status_code == metrics.status_code == ui.status_code == 200
    for text in (status.text, metrics.text, ui.text, log):
        assert not holds_jwt(text)  # no JWT (every token the provider issues is one)


async def test_revoking_a_connection_revokes_its_tokens_at_the_authorization_server(tmp_path: Path) -> None:
    """RFC 7009: the provider advertises a revocation endpoint, so revoking alice's connection there revokes her
    refresh token too: it no longer refreshes at the provider."""
    with oauth_world(tmp_path) as (idp, server, port), gateway(tmp_path, server, port) as gw:
        assert (await sign_in(gw, "tok-alice-0123456789", "alice-account")).status_code == 200
        await ready(gw)
        keys, _ = load_key("GATEWAY_STATE_KEY", STATE_KEY, str(tmp_path / "audit.db"))
        held = await Connections(str(tmp_path / "audit.db"), keys).get("remote", "alice")
        assert held is not None and held["revocation_endpoint"] and held["token"]["refresh_token"]
        refresh = {
            "grant_type": "refresh_token",
            "refresh_token": held["token"]["refresh_token"],
            "client_id": held["client"]["client_id"],
        }
        async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice-0123456789"}) as http:
            revoked = await http.post(
                gw.url("/ui/connections"), data={"backend": "remote"}, headers={"Origin": f"http://127.0.0.1:{port}"}
            )
            assert revoked.status_code == 303, revoked.text
        registered = held["client"]
        auth = (registered["client_id"], registered["client_secret"]) if registered.get("client_secret") else None
        async with httpx2.AsyncClient(auth=auth) as client:  # as the gateway's client would refresh
            answer = await client.post(held["token_endpoint"], data=refresh)
        log = gw.output()
    assert answer.status_code == 400 and answer.json()["error"] == "invalid_grant", answer.text
    assert '"event": "signin.revoked_at_server"' in log and '"refused": null' in log, log[-3000:]
    assert not holds_jwt(log)


async def test_a_callback_from_another_browser_completes_nothing(tmp_path: Path) -> None:
    with oauth_world(tmp_path) as (_idp, server, port), gateway(tmp_path, server, port) as gw:
        async with httpx2.AsyncClient(timeout=20) as attacker:
            started = await attacker.get(
                gw.url("/ui/connect/remote"), headers={"Authorization": "Bearer tok-alice-0123456789"}
            )
            assert started.status_code == 303
            state = re.search(r"state=([^&]+)", started.headers["location"])
            assert state is not None
        async with httpx2.AsyncClient(timeout=20) as victim:  # no flow cookie
            answer = await victim.get(gw.url(f"/ui/connect/callback?state={state.group(1)}&code=stolen"))
        assert answer.status_code == 400 and "did not start this sign-in" in answer.text


async def test_a_token_about_to_expire_is_refreshed_before_the_call(tmp_path: Path) -> None:
    # tokens live 20 s, under the 30 s margin: every session the gateway opens refreshes the token first
    with oauth_world(tmp_path, ttl_s=20) as (_idp, server, port), gateway(tmp_path, server, port) as gw:
        assert (await sign_in(gw, "tok-alice-0123456789", "alice-account")).status_code == 200
        await ready(gw)
        assert (await whoami(gw, "tok-alice-0123456789")) == (False, "account: alice-account")
        log = gw.output()
    assert "signin.refreshed" in log
    assert not holds_jwt(log)


async def test_per_gateway_serves_every_caller_with_the_gateways_own_identity(tmp_path: Path) -> None:
    oauth = 'per: gateway, client_id: alpha, client_secret: "${ALPHA_SECRET}", allow_http: true, scope: mcp:tools'
    with oauth_world(tmp_path) as (_idp, server, port):
        env = {"GATEWAY_STATE_KEY": STATE_KEY, "ALPHA_SECRET": "alpha-secret"}
        text = config(server, port, oauth)
        with run_gateway(text, tmp_path, tokens=TOKENS, env=env, port=port) as gw:
            await ready(gw)
            for caller in ("tok-alice-0123456789", "tok-bob-0123456789"):
                assert (await whoami(gw, caller)) == (False, "account: alpha")  # the client's own subject
                # a stateless client: the server speaks both eras, so on the shared session's stateless lane
                assert (await modern_whoami(gw, caller)) == (False, "account: alpha")
            log = gw.output()
    assert "alpha-secret" not in log and not holds_jwt(log)


async def call(gw: RunningServer, token: str, tool: str) -> tuple[bool, str]:
    async with mcp_session(gw.url(), token=token) as session:
        with anyio.fail_after(WAIT):
            result = await session.call_tool(tool, {})
    return bool(result.is_error), first_text(result)


async def test_more_scope_wanted_of_the_gateways_identity_is_taken_at_once(tmp_path: Path) -> None:
    oauth = 'per: gateway, client_id: alpha, client_secret: "${ALPHA_SECRET}", allow_http: true, scope: mcp:tools'
    with oauth_world(tmp_path) as (_idp, server, port):
        env = {"GATEWAY_STATE_KEY": STATE_KEY, "ALPHA_SECRET": "alpha-secret"}
        with run_gateway(config(server, port, oauth), tmp_path, tokens=TOKENS, env=env, port=port) as gw:
            await ready(gw)
            error, said = await call(gw, "tok-alice-0123456789", "read_mail")  # the token has mcp:tools alone
            assert error and "call again" in said, said

            async def served() -> bool:
                return await call(gw, "tok-bob-0123456789", "read_mail") == (False, "read by alpha")

            await eventually(served, within=WAIT)  # the shared session opened again with the wider token
            assert (await whoami(gw, "tok-alice-0123456789")) == (False, "account: alpha")
            log = gw.output()
    assert '"wanted": "mcp:read"' in log and "alpha-secret" not in log and not holds_jwt(log)


async def test_more_scope_wanted_of_a_caller_asks_them_to_sign_in_again(tmp_path: Path) -> None:
    """The call is answered with the link; the sign-in it starts asks for the union of scopes. This provider
    (oidc-provider) holds a dynamically registered client to the scope it registered with, so it refuses the wider
    one (invalid_scope), said on the page: the success path is the conformance suite's auth/scope-step-up."""
    with oauth_world(tmp_path) as (_idp, server, port), gateway(tmp_path, server, port) as gw:
        assert (await sign_in(gw, "tok-alice-0123456789", "alice-account")).status_code == 200
        await ready(gw)
        error, said = await call(gw, "tok-alice-0123456789", "read_mail")
        assert error and "wants more access" in said and f"http://127.0.0.1:{port}/ui/connect/remote" in said, said
        page = await sign_in(gw, "tok-alice-0123456789", "alice-account")
        assert page.status_code == 400 and "invalid_scope" in page.text, page.text
        assert (await whoami(gw, "tok-alice-0123456789")) == (False, "account: alice-account")  # still signed in
        log = gw.output()
    assert '"wanted": "mcp:read"' in log and not holds_jwt(log)


@pytest.mark.parametrize(
    ("mode", "said"),
    [
        ("plain-http", "led the sign-in to http://example.invalid, which is not https"),
        ("link-local", "169.254.169.254"),
        ("huge", "answered more than 262144 bytes"),
    ],
)
async def test_a_server_cannot_lead_the_sign_in_anywhere(tmp_path: Path, mode: str, said: str) -> None:
    mcp_port, port = free_port(), free_port()
    argv = [PYTHON, str(FIXTURES / "hostile_oauth_server.py"), str(mcp_port), mode]
    with start_http_server(argv, mcp_port) as server, gateway(tmp_path, server, port) as gw:
        async with httpx2.AsyncClient(timeout=WAIT) as browser:
            page = await browser.get(
                gw.url("/ui/connect/remote"), headers={"Authorization": "Bearer tok-alice-0123456789"}
            )
    assert page.status_code == 502, page.text
    assert said in page.text, page.text


async def test_a_replica_that_did_not_run_the_sign_in_serves_the_call(tmp_path: Path) -> None:
    ledger = str(tmp_path / "shared.db")  # both replicas' ledger, and so their tokens' store
    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    env = {"GATEWAY_STATE_KEY": STATE_KEY}
    with oauth_world(tmp_path) as (_idp, server, port_a):
        with run_gateway(
            config(server, port_a, ledger=ledger), tmp_path / "a", tokens=TOKENS, env=env, port=port_a
        ) as a:
            assert (await sign_in(a, "tok-alice-0123456789", "alice-account")).status_code == 200
            port_b = free_port()
            text = config(server, port_b, ledger=ledger)
            with run_gateway(text, tmp_path / "b", tokens=TOKENS, env=env, port=port_b) as b:
                await ready(b)
                assert (await whoami(b, "tok-alice-0123456789")) == (False, "account: alice-account")
                error, said = await whoami(b, "tok-bob-0123456789")
    assert error and f"http://127.0.0.1:{port_b}/ui/connect/remote" in said, said


async def test_replicas_on_postgresql_share_sign_ins_and_revocations(tmp_path: Path, pg_url: str) -> None:
    """Two gateways on one PostgreSQL ledger: each serves a caller who signed in through the other (told within
    ``WATCH_S``, not at its next 60 s look), each caller their own account; a revocation through one ends the
    caller's session on the other; the rows hold no token in clear."""
    import psycopg

    (tmp_path / "a").mkdir(), (tmp_path / "b").mkdir()
    env = {"GATEWAY_STATE_KEY": STATE_KEY}
    with oauth_world(tmp_path) as (_idp, server, port_a), ExitStack() as stack:
        port_b = free_port()
        a, b = (
            stack.enter_context(
                run_gateway(config(server, port, url=pg_url), tmp_path / name, tokens=TOKENS, env=env, port=port)
            )
            for name, port in (("a", port_a), ("b", port_b))
        )
        assert (await sign_in(a, "tok-alice-0123456789", "alice-account")).status_code == 200
        with anyio.fail_after(3 * WATCH_S + 10):  # b is told by its watch of the rows, not by its 60 s recheck
            await ready(b)
        assert (await whoami(b, "tok-alice-0123456789")) == (False, "account: alice-account")
        error, said = await whoami(b, "tok-bob-0123456789")
        assert error and f"http://127.0.0.1:{port_b}/ui/connect/remote" in said, said
        assert (await sign_in(b, "tok-bob-0123456789", "bob-account")).status_code == 200
        assert (await whoami(a, "tok-bob-0123456789")) == (False, "account: bob-account")
        assert (await whoami(a, "tok-alice-0123456789")) == (False, "account: alice-account")

        async def signed_out_on_b() -> bool:
            error, said = await whoami(b, "tok-alice-0123456789")
            return error and "/ui/connect/remote" in said

        bobs: list[tuple[bool, str]] = []  # bob's calls on b meanwhile, one after another

        async def bob_calls_on_b(stop: anyio.Event) -> None:
            async with mcp_session(b.url(), token="tok-bob-0123456789") as session:
                while not stop.is_set():
                    with anyio.fail_after(WAIT):
                        result = await session.call_tool("whoami", {})
                    bobs.append((bool(result.is_error), first_text(result)))

        stop = anyio.Event()
        async with anyio.create_task_group() as tg:
            tg.start_soon(bob_calls_on_b, stop)
            async with httpx2.AsyncClient(headers={"Authorization": "Bearer tok-alice-0123456789"}) as http:
                revoked = await http.post(
                    a.url("/ui/connections"),
                    data={"backend": "remote", "caller": "alice"},
                    headers={"Origin": f"http://127.0.0.1:{port_a}"},
                )
            assert revoked.status_code == 303, revoked.text
            await eventually(signed_out_on_b, within=3 * WATCH_S)
            # b's shared session listed as alice: it opens again with bob's token; his own session serves him
            # meanwhile (it used to fail his calls until the shared one was back)
            seen = len(bobs)
            await eventually(lambda: len(bobs) >= seen + 10, within=WAIT)
            stop.set()
        assert set(bobs) == {(False, "account: bob-account")}, b.output()[-3000:]
        with anyio.fail_after(WAIT):  # the operator's command reads the same database
            listed = await anyio.run_process(
                [PYTHON, "-m", "gateway", "connections", "-c", str(tmp_path / "a" / "federation.yaml")],
                env={**os.environ, "GATEWAY_STATE_KEY": STATE_KEY},
            )
        said = listed.stdout.decode() + listed.stderr.decode()
        assert said.startswith("bob\tremote\ttoken expires in ") and "alice" not in said, said
        logs = a.output() + b.output()
    with psycopg.connect(pg_url) as db:
        callers = [row[0] for row in db.execute("SELECT caller FROM downstream_tokens WHERE caller != ''")]
        [tokens] = db.execute("SELECT string_agg(encode(sealed, 'escape'), '') FROM downstream_tokens").fetchone()
        [calls] = db.execute("SELECT string_agg(c::text, '') FROM calls c").fetchone()
    assert callers == ["bob"]
    assert not holds_jwt(tokens) and not holds_jwt(calls) and not holds_jwt(logs)


async def modern_whoami(gw: RunningServer, token: str) -> tuple[bool, str]:
    """``whoami`` as a stateless client (the 2026-07-28 era, no session) calls it: an error's text, or the answer."""
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30)) as http:
        async with Client(streamable_http_client(gw.url(), http_client=http), mode="2026-07-28") as client:
            with anyio.fail_after(WAIT):
                try:
                    result = await client.call_tool("whoami", {})
                except MCPError as exc:
                    return True, f"{exc.error.message} {json.dumps(exc.error.data)}"
    return bool(result.is_error), first_text(result)


async def modern_tools(gw: RunningServer, token: str) -> set[str]:
    headers = {"Authorization": f"Bearer {token}"}
    async with httpx2.AsyncClient(headers=headers, timeout=httpx2.Timeout(30)) as http:
        async with Client(streamable_http_client(gw.url(), http_client=http), mode="2026-07-28") as client:
            with anyio.fail_after(WAIT):
                return {tool.name for tool in (await client.list_tools()).tools}


async def test_two_callers_in_the_stateless_era_each_get_their_own_account(tmp_path: Path) -> None:
    """The same as the handshake era's two callers, from 2026-07-28 clients: no session, each request on its own,
    each caller served on their own downstream session with their own token."""
    with oauth_world(tmp_path) as (_idp, server, port), gateway(tmp_path, server, port) as gw:
        assert (await sign_in(gw, "tok-alice-0123456789", "alice-account")).status_code == 200
        await ready(gw)
        error, said = await modern_whoami(gw, "tok-bob-0123456789")
        assert error and f"http://127.0.0.1:{port}/ui/connect/remote" in said, said
        assert (await sign_in(gw, "tok-bob-0123456789", "bob-account")).status_code == 200
        for _ in range(2):  # each request on its own: the second finds each caller's session again
            assert (await modern_whoami(gw, "tok-alice-0123456789")) == (False, "account: alice-account")
            assert (await modern_whoami(gw, "tok-bob-0123456789")) == (False, "account: bob-account")
        # each lists what their own account lists, in this era too
        assert await modern_tools(gw, "tok-alice-0123456789") == {"whoami", "read_mail", "unlock_drafts", "alice_notes"}
        assert await modern_tools(gw, "tok-bob-0123456789") == {"whoami", "read_mail", "unlock_drafts", "bob_notes"}
