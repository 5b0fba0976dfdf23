"""Who sees what (``policies:``, gateway/auth/policies.py) and per-caller credentials (gateway/auth/secrets.py), over a
real gateway process: two callers see different tools in both protocol eras, a call outside a policy is answered
exactly like an unknown tool and leaves a ``refused`` row, a reload that changes one policy tells only that caller's
session, and each caller's own secret reaches a real HTTP downstream (and no other caller's)."""

from __future__ import annotations

import functools
import json
import sqlite3
import subprocess
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from pathlib import Path
from typing import Any

import anyio
import httpx2
import mcp_types as types
import pytest
from mcp.shared.exceptions import MCPError

from gateway.backends.base import Backend
from gateway.calls import Caller
from gateway.config import parse_config
from gateway.core.catalog import Catalog
from gateway.core.policies import Views
from gateway.errors import ConfigError
from gateway.testing import FakeBackend
from tests.fixtures.gateway_proc import FIXTURES, PYTHON, echo_argv, mcp_session, run_gateway
from tests.fixtures.procs import free_port, start_http_server
from tests.fixtures.waiting import eventually

pytestmark = pytest.mark.anyio

TOKENS = "alice=tok-alice-0123,bob=tok-bob-4567"
MODERN = "2026-07-28"
HANDSHAKE = "2025-11-25"
MODERN_META = {"io.modelcontextprotocol/protocolVersion": MODERN, "io.modelcontextprotocol/clientCapabilities": {}}
ACCEPT = {"Accept": "application/json, text/event-stream"}
WAIT = 15


def config(readers: str = "[echo, add]", *, audit: str = "audit.db") -> str:
    return f"""
gateway:
  audit: {{path: {audit}}}
servers:
  e:
    transport: stdio
    command: {PYTHON}
    args: {json.dumps(echo_argv()[1:])}
policies:
  readers:
    callers: [alice]
    tools: {{include: {readers}}}
  writers:
    callers: [bob]
    tools: {{exclude: [echo, "s*"]}}
"""


class Raw:
    """Raw JSON-RPC posts as one caller in one era (so answers can be compared byte for byte)."""

    def __init__(self, http: httpx2.AsyncClient, url: str, token: str, era: str) -> None:
        self.http, self.url, self.era = http, url, era
        self.headers = {**ACCEPT, "Authorization": f"Bearer {token}"}
        self.status = 0

    async def open(self) -> None:
        if self.era == MODERN:
            self.headers["mcp-protocol-version"] = MODERN
            return
        init = {"protocolVersion": self.era, "capabilities": {}, "clientInfo": {"name": "raw", "version": "1"}}
        body = {"jsonrpc": "2.0", "id": 1, "method": "initialize", "params": init}
        opened = await self.http.post(self.url, headers=self.headers, json=body)
        assert opened.status_code == 200, opened.text
        self.headers.update({"mcp-session-id": opened.headers["mcp-session-id"], "mcp-protocol-version": self.era})
        done = await self.http.post(
            self.url, headers=self.headers, json={"jsonrpc": "2.0", "method": "notifications/initialized"}
        )
        assert done.status_code == 202, done.text

    async def send(self, method: str, params: dict[str, Any]) -> bytes:
        """The JSON-RPC answer's bytes (the last SSE data line, or the JSON body)."""
        headers = dict(self.headers)
        if self.era == MODERN:
            params = {**params, "_meta": MODERN_META}
            headers["mcp-method"] = method
            if method in ("tools/call", "prompts/get"):
                headers["mcp-name"] = params["name"]
            elif method == "resources/read":
                headers["mcp-name"] = params["uri"]
        body = {"jsonrpc": "2.0", "id": 7, "method": method, "params": params}
        with anyio.fail_after(WAIT):
            # json.dumps escapes a lone surrogate (\ud800) as JSON allows; httpx2's own encoder refuses it
            content = json.dumps(body)
            response = await self.http.post(
                self.url, headers={**headers, "content-type": "application/json"}, content=content
            )
        self.status = response.status_code  # an error answer is 400 in the stateless era, 200 in the other
        if response.headers["content-type"].startswith("text/event-stream"):
            data = [line[5:] for line in response.text.splitlines() if line.startswith("data:") and line[5:].strip()]
            return data[-1].strip().encode()
        return response.content.strip()

    async def tools(self) -> set[str]:
        answer = json.loads(await self.send("tools/list", {}))
        return {tool["name"] for tool in answer["result"]["tools"]}


@asynccontextmanager
async def raw(url: str, token: str, era: str) -> AsyncIterator[Raw]:
    async with httpx2.AsyncClient(timeout=httpx2.Timeout(WAIT)) as http:
        client = Raw(http, url, token, era)
        await client.open()
        yield client


def rows(folder: Path) -> list[tuple[str, str, str, list[dict[str, Any]]]]:
    with sqlite3.connect(folder / "audit.db") as db:
        found = db.execute("SELECT caller, tool, status, chain FROM calls ORDER BY id").fetchall()
    return [(caller, tool, status, json.loads(chain)) for caller, tool, status, chain in found]


def announcements(log: str) -> list[list[str]]:
    """The callers told of each list change, as the gateway logged them (``lists.announced``)."""
    return [json.loads(line)["callers"] for line in log.splitlines() if '"lists.announced"' in line]


ALL_TOOLS = {"echo", "add", "fail", "slow", "sleep", "crash", "pid", "with_defs"}


@pytest.mark.spawns
@pytest.mark.parametrize("era", [HANDSHAKE, MODERN])
async def test_two_callers_see_their_own_tools_and_a_hidden_tool_answers_as_an_unknown_one(
    tmp_path: Path, era: str
) -> None:
    with run_gateway(config(), tmp_path, tokens=TOKENS) as gateway:
        async with raw(gateway.url(), "tok-alice-0123", era) as alice, raw(gateway.url(), "tok-bob-4567", era) as bob:
            assert await alice.tools() == {"echo", "add"}
            assert await bob.tools() == ALL_TOOLS - {"echo", "slow", "sleep"}

            hidden = await alice.send("tools/call", {"name": "pid", "arguments": {}})
            hidden_status = alice.status
            unknown = await alice.send("tools/call", {"name": "pi_", "arguments": {}})
            assert hidden.replace(b"pid", b"pi_") == unknown  # byte for byte, but for the name asked
            assert hidden_status == alice.status
            assert json.loads(hidden)["error"]["message"] == "Unknown tool: 'pid'."
            # Bad arguments to a hidden tool are no clue either: the same unknown tool, not invalid params.
            nested = await alice.send("tools/call", {"name": "pid", "arguments": {"x": "\ud800"}})
            assert json.loads(nested)["error"] == json.loads(hidden)["error"]

            served = json.loads(await bob.send("tools/call", {"name": "pid", "arguments": {}}))
            assert int(served["result"]["content"][0]["text"]) > 0
            echoed = json.loads(await alice.send("tools/call", {"name": "echo", "arguments": {"text": "hi"}}))
            assert echoed["result"]["content"][0]["text"] == "hi"

    found = [(caller, tool, status) for caller, tool, status, _ in rows(tmp_path)]
    assert found == [
        ("alice", "pid", "refused"),
        ("alice", "pi_", "unknown_tool"),
        ("alice", "pid", "refused"),
        ("bob", "pid", "ok"),
        ("alice", "echo", "ok"),
    ]
    refused = rows(tmp_path)[0][3]
    assert refused == [
        {
            "provider": "gateway",
            "variant": None,
            "outcome": "refused",
            "reason": "not in the caller's policy",
            "ms": 0.0,
        }
    ]


@pytest.mark.spawns
async def test_status_shows_the_policies_and_how_many_tools_each_caller_sees(tmp_path: Path) -> None:
    operated = config().replace("gateway:\n", "gateway:\n  auth: {operators: [bob]}\n", 1)
    with run_gateway(operated, tmp_path, tokens=TOKENS) as gateway:
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            headers = {"Authorization": "Bearer tok-alice-0123"}

            async def status() -> dict[str, Any]:
                document: dict[str, Any] = (await http.get(gateway.url("/status"), headers=headers)).json()
                return document

            async def ready() -> bool:
                return (await status())["catalog"]["tools"] == len(ALL_TOOLS)

            await eventually(ready, within=WAIT)
            access = (await status())["access"]
            assert [(p["name"], p["callers"], p["tools"]) for p in access["policies"]] == [
                ("readers", ["alice"], 2),
                ("writers", ["bob"], 5),
            ]
            assert access["callers"] == [
                {"caller": "alice", "policy": "readers", "tools": 2},
                {"caller": "bob", "policy": "writers", "tools": 5},
            ]
            operator = (await http.get(gateway.url("/ui/"), headers={"Authorization": "Bearer tok-bob-4567"})).text
            assert "readers" in operator and "writers" in operator
            page = (await http.get(gateway.url("/ui/"), headers=headers)).text  # alice's: her own view only
            assert "writers" not in page and "echo" in page


@pytest.mark.spawns
async def test_a_reload_that_changes_one_policy_tells_only_that_callers_session(tmp_path: Path) -> None:
    heard: dict[str, list[str]] = {"alice": [], "bob": []}

    def listener(who: str) -> Any:
        async def handle(message: Any) -> None:
            if isinstance(message, types.ServerNotification):
                heard[who].append(message.method)

        return handle

    with run_gateway(config(), tmp_path, tokens=TOKENS) as gateway:
        async with (
            mcp_session(gateway.url(), token="tok-alice-0123", message_handler=listener("alice")) as alice,
            mcp_session(gateway.url(), token="tok-bob-4567", message_handler=listener("bob")) as bob,
        ):
            assert {t.name for t in (await alice.list_tools()).tools} == {"echo", "add"}
            assert "echo" not in {t.name for t in (await bob.list_tools()).tools}
            before = len(announcements(gateway.output()))
            (tmp_path / "federation.yaml").write_text(config("[echo, add, pid]"))
            await eventually(lambda: heard["alice"] == ["notifications/tools/list_changed"], within=WAIT)
            await eventually(lambda: len(announcements(gateway.output())) > before, within=WAIT)
            # the gateway told alice's session, and no other
            assert announcements(gateway.output())[before:] == [["alice"]]
            assert {t.name for t in (await alice.list_tools()).tools} == {"echo", "add", "pid"}
            await bob.send_ping()
            assert heard["bob"] == []


def test_policies_are_checked_at_load_naming_file_key_and_line() -> None:
    text = "servers: {}\npolicies:\n  p:\n    backends: {include: [nope]}\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text, file="f.yaml")
    assert (caught.value.key_path, caught.value.line) == ("policies.p.backends", 4)
    assert "nope" in str(caught.value)
    with pytest.raises(ConfigError) as caught:
        parse_config("policies:\n  p:\n    tools: {inclde: [a]}\n", file="f.yaml")
    assert (caught.value.key_path, caught.value.line) == ("policies.p.tools.inclde", 3)


def test_a_caller_no_policy_matches_sees_nothing_and_jwt_claims_pick_a_policy() -> None:
    federation = parse_config(
        """
policies:
  staff:
    callers: ["corp:*"]
    claims: {groups: staff}
    scopes: [tools.read]
  nobody-else:
    callers: [carol]
    tools: {include: []}
"""
    )
    catalog = Catalog.build(federation, {})
    views = Views()
    staff = Caller("corp:u1", frozenset({"tools.read"}), {"groups": ["staff", "x"]})
    assert (view := views.view(catalog, staff)) is not None and view.policy == "staff"
    no_scope = Caller("corp:u1", frozenset(), {"groups": ["staff"]})
    assert (view := views.view(catalog, no_scope)) is not None and view.policy == ""
    assert view.list_result == {"tools": []}
    assert views.view(Catalog.build(parse_config("servers: {}"), {}), staff) is None  # no policies: all


# ----------------------------------------------------------------------------------------------- credentials


@pytest.mark.spawns
async def test_each_caller_reaches_the_downstream_with_its_own_secret_and_never_another_s(tmp_path: Path) -> None:
    port = free_port()
    seen = tmp_path / "credentials.log"
    secrets = tmp_path / "secrets.yaml"
    secrets.write_text(
        'alice: {svc: "alice-secret-123"}\nbob: {svc: "bob-secret-456"}\n"*": {svc: "gateway-own-789"}\n'
    )
    secrets.chmod(0o600)
    text = f"""
gateway:
  audit: {{path: audit.db}}
  auth: {{caller_secrets: secrets.yaml}}
servers:
  svc:
    transport: streamable_http
    url: http://127.0.0.1:{port}/mcp
    headers: {{Authorization: "Bearer ${{caller.secret:svc}}"}}
"""
    downstream = [PYTHON, str(FIXTURES / "credential_server.py"), str(port)]
    tokens = TOKENS + ",carol=tok-carol-8901"
    with (
        start_http_server(downstream, port, env={"CREDENTIALS_LOG": str(seen)}),
        run_gateway(text, tmp_path, tokens=tokens) as gateway,
    ):

        async def whoami(token: str) -> types.CallToolResult:
            async with mcp_session(gateway.url(), token=token) as session:
                with anyio.fail_after(WAIT):
                    return await session.call_tool("whoami", {})

        answers: list[str] = []

        async def whoami_on(session: Any) -> None:
            answers.append((await session.call_tool("whoami", {})).content[0].text)

        async with mcp_session(gateway.url(), token="tok-alice-0123") as first:  # concurrent first calls: one session
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    for _ in range(4):
                        tg.start_soon(whoami_on, first)
        assert answers == ["Bearer alice-secret-123"] * 4
        alice, bob = await whoami("tok-alice-0123"), await whoami("tok-bob-4567")
        assert [alice.content[0].text, bob.content[0].text] == ["Bearer alice-secret-123", "Bearer bob-secret-456"]  # type: ignore[union-attr]
        assert (await whoami("tok-alice-0123")).content[0].text == "Bearer alice-secret-123"  # type: ignore[union-attr]
        carol = await whoami("tok-carol-8901")  # no secret of her own: refused, never given another's
        assert carol.is_error
        text_of_carol = carol.content[0].text  # type: ignore[union-attr]
        assert "carol has no secret 'svc'" in text_of_carol and "secret-" not in text_of_carol
        async with httpx2.AsyncClient(timeout=WAIT) as http:
            status = (await http.get(gateway.url("/status"), headers={"Authorization": "Bearer tok-bob-4567"})).text
        log = gateway.output()

    opened = [json.loads(x)["caller"] for x in log.splitlines() if '"backend.caller_session"' in x and '"open"' in x]
    assert sorted(opened) == ["alice", "bob"]  # one session per caller, however many calls and client sessions
    sent = set(seen.read_text().split("\n")) - {""}
    assert sent == {"Bearer alice-secret-123", "Bearer bob-secret-456", "Bearer gateway-own-789"}
    for secret in ("alice-secret-123", "bob-secret-456", "gateway-own-789"):
        assert secret not in log and secret not in status
        assert secret not in (tmp_path / "audit.db").read_bytes().decode("latin-1")


def test_a_per_caller_header_needs_the_secrets_file() -> None:
    text = "servers:\n  s:\n    transport: streamable_http\n    url: http://127.0.0.1:1/mcp\n"
    with pytest.raises(ConfigError) as caught:
        parse_config(text + '    headers: {Authorization: "Bearer ${caller.secret:gh}"}\n', file="f.yaml")
    assert caught.value.key_path == "servers.s.headers.Authorization"
    assert "gateway.auth.caller_secrets" in str(caught.value)


def test_a_view_drops_hidden_tools_from_the_router_note_and_a_route_needs_every_backend() -> None:
    note = "Router:\n- search: find things\n- secret_tool: do the hidden thing\nEnd."
    federation = parse_config(
        f"""
gateway:
  router_note: {json.dumps(note)}
servers:
  a: {{transport: stdio, command: x, router: true}}
  b: {{transport: stdio, command: x}}
routes:
  both: {{providers: [{{provider: a/find}}, {{provider: b/find}}]}}
policies:
  limited:
    tools: {{exclude: [secret_tool]}}
    backends: {{exclude: [b]}}
""",
        env={},
    )
    backends: dict[str, Backend] = {
        "a": FakeBackend("a", ["search", "secret_tool", "find"]),
        "b": FakeBackend("b", ["find", "other"]),
    }
    catalog = Catalog.build(federation, backends)
    assert set(catalog.entries) == {"search", "secret_tool", "both", "other"}
    view = Views().view(catalog, Caller("anyone"))
    assert view is not None and view.tools == {"search"}  # `both` falls back to b, which the policy excludes
    (search,) = view.list_result["tools"]
    assert search["description"].endswith("Router:\n- search: find things\nEnd.")
    assert "secret_tool" not in json.dumps(view.list_result)
    whole = next(t for t in catalog.list_result["tools"] if t["name"] == "search")
    assert "secret_tool" in whole["description"]  # only the view is filtered


@pytest.mark.spawns
async def test_a_stateless_listen_stream_hears_only_of_changes_to_its_own_callers_view(tmp_path: Path) -> None:
    frames: dict[str, list[str]] = {"alice": [], "bob": []}
    acknowledged = {"alice": anyio.Event(), "bob": anyio.Event()}
    body = {
        "jsonrpc": "2.0",
        "id": 9,
        "method": "subscriptions/listen",
        "params": {"_meta": MODERN_META, "notifications": {"toolsListChanged": True}},
    }

    async def listen(http: httpx2.AsyncClient, url: str, who: str, token: str) -> None:
        headers = {
            **ACCEPT,
            "Authorization": f"Bearer {token}",
            "MCP-Protocol-Version": MODERN,
            "Mcp-Method": "subscriptions/listen",
        }
        async with http.stream("POST", url, json=body, headers=headers) as response:
            assert response.status_code == 200
            async for line in response.aiter_lines():
                if line.startswith("data:") and line[5:].strip():
                    frames[who].append(json.loads(line[5:])["method"])
                    acknowledged[who].set()

    with run_gateway(config(), tmp_path, tokens=TOKENS) as gateway:
        async with raw(gateway.url(), "tok-alice-0123", MODERN) as alice:
            assert await alice.tools() == {"echo", "add"}  # the first request waits for the backend: startup is over
        async with httpx2.AsyncClient(timeout=httpx2.Timeout(WAIT, read=None)) as http:
            with anyio.fail_after(WAIT):
                async with anyio.create_task_group() as tg:
                    tg.start_soon(listen, http, gateway.url(), "alice", "tok-alice-0123")
                    tg.start_soon(listen, http, gateway.url(), "bob", "tok-bob-4567")
                    await acknowledged["alice"].wait()
                    await acknowledged["bob"].wait()
                    before = len(announcements(gateway.output()))
                    (tmp_path / "federation.yaml").write_text(config("[echo, add, pid]"))
                    await eventually(lambda: "notifications/tools/list_changed" in frames["alice"], within=WAIT)
                    await eventually(lambda: len(announcements(gateway.output())) > before, within=WAIT)
                    tg.cancel_scope.cancel()
            told = announcements(gateway.output())[before:]
    assert told == [["alice"]]
    assert frames["alice"] == ["notifications/subscriptions/acknowledged", "notifications/tools/list_changed"]
    assert frames["bob"] == ["notifications/subscriptions/acknowledged"]


@pytest.mark.spawns
def test_gateway_tools_shows_one_callers_view(tmp_path: Path) -> None:
    (tmp_path / "federation.yaml").write_text(config(audit="audit.db"))
    argv = [PYTHON, "-m", "gateway", "tools", "-c", str(tmp_path / "federation.yaml"), "--json"]
    run = functools.partial(subprocess.run, capture_output=True, text=True, timeout=WAIT, check=True)
    alice = json.loads(run([*argv, "--caller", "alice"]).stdout)
    nobody = json.loads(run([*argv, "--caller", "mallory"]).stdout)
    everything = json.loads(run(argv).stdout)
    assert [t["name"] for t in alice] == ["echo", "add"]
    assert nobody == []
    assert {t["name"] for t in everything} == ALL_TOOLS


@pytest.mark.spawns
async def test_resources_and_prompts_are_filtered_alike_and_a_hidden_one_answers_as_a_missing_one(
    tmp_path: Path,
) -> None:
    text = f"""
gateway:
  audit: {{enabled: false}}
servers:
  c:
    transport: stdio
    command: {PYTHON}
    args: [{json.dumps(str(FIXTURES / "conformance_server.py"))}, --stdio]
policies:
  readers:
    callers: [alice]
    resources: {{include: ["test://static-text", "test://n*"]}}
    prompts: {{include: [test_simple_prompt]}}
  everyone: {{}}
"""
    with run_gateway(text, tmp_path, tokens=TOKENS) as gateway:
        async with (
            mcp_session(gateway.url(), token="tok-alice-0123") as alice,
            mcp_session(gateway.url(), token="tok-bob-4567") as bob,
        ):
            with anyio.fail_after(WAIT):
                assert [str(r.uri) for r in (await alice.list_resources()).resources] == ["test://static-text"]
                assert (await alice.list_resource_templates()).resource_templates == []
                assert [p.name for p in (await alice.list_prompts()).prompts] == ["test_simple_prompt"]
                everything = {str(r.uri) for r in (await bob.list_resources()).resources}
                assert {"test://static-text", "test://static-binary"} <= everything
                assert len((await bob.list_resource_templates()).resource_templates) == 1
                assert len((await bob.list_prompts()).prompts) > 1

                read = await alice.read_resource("test://static-text")
                assert read.contents[0].text == "This is the content of the static text resource."  # type: ignore[union-attr]
                with pytest.raises(MCPError) as hidden:
                    await alice.read_resource("test://static-binary")
                assert (hidden.value.error.code, hidden.value.error.message) == (-32602, "Resource not found")
                with pytest.raises(MCPError) as missing:  # allowed by the policy, unknown downstream
                    await alice.read_resource("test://nope")
                assert missing.value.error.model_dump() == {
                    **hidden.value.error.model_dump(),
                    "data": {"uri": "test://nope"},
                }
                assert (await bob.read_resource("test://static-binary")).contents[0].uri == "test://static-binary"

                with pytest.raises(MCPError) as hidden_prompt:
                    await alice.get_prompt("test_prompt_with_arguments", {"arg1": "a", "arg2": "b"})
                with pytest.raises(MCPError) as unknown_prompt:
                    await alice.get_prompt("no_such_prompt", {})
                assert hidden_prompt.value.error.message == "Unknown prompt: 'test_prompt_with_arguments'"
                assert unknown_prompt.value.error.message == "Unknown prompt: 'no_such_prompt'"
                assert hidden_prompt.value.error.code == unknown_prompt.value.error.code


# ----------------------------------------------------------------------------------------------- token exchange


def exchange_config(port: int, exchanger: int, oauth: str = "") -> str:
    return f"""
gateway:
  audit: {{path: audit.db}}
{oauth}
servers:
  svc:
    transport: streamable_http
    url: http://127.0.0.1:{port}/mcp
    headers: {{Authorization: "Bearer ${{SVC_TOKEN}}"}}
    token_exchange:
      token_endpoint: http://127.0.0.1:{exchanger}/token
      client_id: gw
      client_secret: "${{EXCHANGE_SECRET}}"
      audience: svc-api
"""


@contextmanager
def exchange_world(folder: Path, oauth: str = "", port: int | None = None) -> Iterator[tuple[Any, Any, Path]]:
    downstream, exchanger = free_port(), free_port()
    seen = folder / "credentials.log"
    with (
        start_http_server(
            [PYTHON, str(FIXTURES / "credential_server.py"), str(downstream)],
            downstream,
            env={"CREDENTIALS_LOG": str(seen)},
        ),
        start_http_server([PYTHON, str(FIXTURES / "token_exchange_server.py"), str(exchanger)], exchanger) as tx,
        run_gateway(
            exchange_config(downstream, exchanger, oauth),
            folder,
            tokens=TOKENS,
            env={"SVC_TOKEN": "gateway-own-token-1", "EXCHANGE_SECRET": "gw-secret"},
            port=port,
        ) as gateway,
    ):
        yield gateway, tx, seen


@pytest.mark.spawns
async def test_a_static_token_caller_gets_no_exchanged_token_and_the_gateway_session_keeps_its_own(
    tmp_path: Path,
) -> None:
    with exchange_world(tmp_path) as (gateway, tx, seen):
        async with mcp_session(gateway.url(), token="tok-alice-0123") as alice:
            with anyio.fail_after(WAIT):
                assert [t.name for t in (await alice.list_tools()).tools] == ["whoami"]
                refused = await alice.call_tool("whoami", {})
        log, exchanges = gateway.output(), tx.output()
    assert refused.is_error
    assert "caller alice did not sign in with an OAuth access token" in refused.content[0].text  # type: ignore[union-attr]
    assert set(seen.read_text().split("\n")) - {""} == {"Bearer gateway-own-token-1"}  # the listing session only
    assert "gateway-own-token-1" not in log and "gw-secret" not in log
    assert exchanges.strip() == ""  # nothing was exchanged


def test_a_token_exchange_endpoint_must_be_https_off_loopback() -> None:
    text = (
        "servers:\n  s:\n    transport: streamable_http\n    url: http://127.0.0.1:1/mcp\n    token_exchange:\n"
        "      token_endpoint: http://idp.example.com/token\n      client_id: gw\n      client_secret: s3cret-value\n"
    )
    with pytest.raises(ConfigError) as caught:
        parse_config(text, file="f.yaml")
    assert (caught.value.key_path, caught.value.line) == ("servers.s.token_exchange.token_endpoint", 6)
    assert "https" in str(caught.value) and "s3cret-value" not in str(caught.value)


# ----------------------------------------------------------------------------------------------- what a URI resolves to


def vault_config() -> str:
    return f"""
gateway:
  audit: {{enabled: false}}
servers:
  vault:
    transport: stdio
    command: {PYTHON}
    args: [{json.dumps(str(FIXTURES / "fidelity_server.py"))}, --stdio]
policies:
  readers:
    callers: [alice]
    resources: {{exclude: ["fid://r/*", "fid://item/*"]}}
  everyone: {{}}
"""


@pytest.mark.spawns
@pytest.mark.parametrize("era", [HANDSHAKE, MODERN])
async def test_a_hidden_resource_stays_hidden_under_its_backend_prefixed_uri_for_every_request_kind(
    tmp_path: Path, era: str
) -> None:
    # `vault__fid://r/1` resolves to vault's fid://r/1, which alice's policy hides: the policy applies to what a
    # request resolves to, not to the string typed.
    not_found = {"code": -32602, "message": "Resource not found"}
    with run_gateway(vault_config(), tmp_path, tokens=TOKENS) as gateway:
        async with raw(gateway.url(), "tok-alice-0123", era) as alice, raw(gateway.url(), "tok-bob-4567", era) as bob:
            answers = {}
            for uri in ("fid://r/1", "vault__fid://r/1", "vault__fid://item/7", "fid://item/7", "nope://x"):
                answers[uri] = json.loads(await alice.send("resources/read", {"uri": uri}))
            read = json.loads(await bob.send("resources/read", {"uri": "vault__fid://r/1"}))
            completion = {
                "ref": {"type": "ref/resource", "uri": "vault__fid://item/{id}"},
                "argument": {"name": "id", "value": "1"},
            }
            completed = json.loads(await alice.send("completion/complete", completion))
            completed_bob = json.loads(await bob.send("completion/complete", completion))
            subscribed = None
            if era == HANDSHAKE:  # the stateless era has no resources/subscribe (subscriptions/listen instead)
                subscribed = json.loads(await alice.send("resources/subscribe", {"uri": "vault__fid://r/1"}))
    assert read["result"]["contents"][0]["text"] == "resource 1 of fidelity", read  # the prefixed form serves bob
    for uri, answer in answers.items():
        assert {k: answer["error"][k] for k in ("code", "message")} == not_found, (uri, answer)
        assert "result" not in answer
    assert completed_bob["result"]["completion"]["values"] == ["1", "12"]
    assert "error" in completed and "result" not in completed, completed
    if subscribed is not None:
        assert "error" in subscribed and "result" not in subscribed, subscribed


# ----------------------------------------------------------------------------------------------- a hidden tool's schema


def mirror_config() -> str:
    return f"""
gateway:
  audit: {{enabled: false}}
servers:
  c:
    transport: stdio
    command: {PYTHON}
    args: [{json.dumps(str(FIXTURES / "conformance_server.py"))}, --stdio]
policies:
  readers:
    callers: [alice]
    tools: {{exclude: [test_header_mirror]}}
  everyone: {{}}
"""


@pytest.mark.spawns
async def test_a_hidden_tools_header_schema_is_no_clue_in_the_stateless_era(tmp_path: Path) -> None:
    # test_header_mirror declares `region` as mirrored in Mcp-Param-Region (SEP-2243): a call without that header is
    # refused by the header check, which must not read the schema of a tool the caller cannot see.
    arguments = {"region": "eu-west", "query": "q"}
    with run_gateway(mirror_config(), tmp_path, tokens=TOKENS) as gateway:
        async with (
            raw(gateway.url(), "tok-alice-0123", MODERN) as alice,
            raw(gateway.url(), "tok-bob-4567", MODERN) as bob,
        ):
            assert "test_header_mirror" in await bob.tools()  # the first request waits for startup to be over
            hidden = await alice.send("tools/call", {"name": "test_header_mirror", "arguments": arguments})
            hidden_status = alice.status
            unknown = await alice.send("tools/call", {"name": "test_header_mirrox", "arguments": arguments})
            unknown_status = alice.status
            seen = json.loads(await bob.send("tools/call", {"name": "test_header_mirror", "arguments": arguments}))
    assert seen["error"]["code"] == -32020 and "Mcp-Param-Region" in seen["error"]["message"]  # the check works
    assert hidden.replace(b"test_header_mirror", b"test_header_mirrox") == unknown, hidden
    assert hidden_status == unknown_status
    assert json.loads(hidden)["error"]["code"] == -32602, hidden


# ----------------------------------------------------------------------------------------------- the status page


UI_TOKENS = f"{TOKENS},carol=tok-carol-8910"


def ui_config() -> str:
    return config().replace("gateway:\n", "gateway:\n  auth: {operators: [carol]}\n", 1)


async def pages(gateway: Any, *tokens: str) -> list[str]:
    """The status page as each token's caller sees it, after alice called ``echo`` and bob ``fail``."""
    with anyio.fail_after(WAIT):
        async with mcp_session(gateway.url(), token="tok-alice-0123") as alice:
            await alice.call_tool("echo", {"text": "alice was here"})
        async with mcp_session(gateway.url(), token="tok-bob-4567") as bob:
            await bob.call_tool("fail", {"message": "bob was here"})
    shown = []
    for token in tokens:
        async with httpx2.AsyncClient(headers={"Authorization": f"Bearer {token}"}, timeout=WAIT) as http:
            response = await http.get(gateway.url("/ui/"))
        assert response.status_code == 200
        shown.append(response.text)
    return shown


def section(text: str, table: str) -> str:
    return text.split(f'<table id="{table}">', 1)[1].split("</table>", 1)[0] if f'id="{table}"' in text else ""


def listed(text: str) -> set[str]:
    return {name for name in ALL_TOOLS if f"<code>{name}</code>" in section(text, "catalog")}


@pytest.mark.spawns
async def test_the_status_page_shows_a_caller_what_its_policy_shows_and_its_own_calls_only(tmp_path: Path) -> None:
    with run_gateway(config(), tmp_path, tokens=TOKENS) as gateway:
        (shown,) = await pages(gateway, "tok-alice-0123")
    assert listed(shown) == {"echo", "add"}
    calls = section(shown, "calls")
    assert "<code>echo</code>" in calls and "<code>fail</code>" not in calls and "bob" not in calls
    assert "<code>fail</code>" not in section(shown, "stats")
    assert "<h2>Access" not in shown and "writers" not in shown


@pytest.mark.spawns
async def test_an_operator_sees_every_tool_every_callers_calls_and_who_sees_what_on_the_status_page(
    tmp_path: Path,
) -> None:
    with run_gateway(ui_config(), tmp_path, tokens=UI_TOKENS) as gateway:
        alice, carol = await pages(gateway, "tok-alice-0123", "tok-carol-8910")
    assert listed(alice) == {"echo", "add"} and "bob" not in section(alice, "calls")
    assert listed(carol) == ALL_TOOLS
    calls = section(carol, "calls")
    assert "<code>echo</code>" in calls and "<code>fail</code>" in calls and "bob" in calls
    assert "<h2>Access" in carol and "writers" in carol
