"""When a server answers a caller's call 403 ``insufficient_scope``, the caller is asked to sign in again for the
union of scopes (signin.py ``SignIn.step_up``), boundedly. The whole round trip through the gateway, against the
conformance suite's own step-up server, is tests/system/test_conformance_gateway.py's ``auth/scope-step-up``; here
the rule that keeps it from looping, on the real sealed store (in memory)."""

from __future__ import annotations

import pytest

from gateway.auth.connections import OPEN_CALLER, Connections
from gateway.backends.mcp.signin import MAX_STEP_UPS, SignIn
from gateway.config import HttpServer

pytestmark = pytest.mark.anyio

SERVER = HttpServer.model_validate(
    {"transport": "streamable_http", "url": "https://mcp.example.com/mcp", "auth": {"oauth": {}}}
)


def challenge(scope: str) -> str:
    return f'Bearer error="insufficient_scope", scope="{scope}", resource_metadata="https://mcp.example.com/prm"'


async def signed_in(scope: str, caller: str = "alice") -> SignIn:
    store = Connections(None, [b"k" * 32])
    await store.put("remote", caller, {"token": {"access_token": "t", "token_type": "Bearer", "scope": scope}}, None)
    return SignIn("remote", SERVER, store, "https://gateway.example.com")


async def test_a_wider_scope_asks_the_caller_to_sign_in_again_at_most_a_few_times() -> None:
    signin = await signed_in("mcp:basic")
    asked = [await signin.step_up("alice", challenge("mcp:basic mcp:write")) for _ in range(MAX_STEP_UPS + 2)]
    assert asked == [True] * MAX_STEP_UPS + [False, False]


async def test_a_scope_the_caller_holds_already_is_never_asked_for_again() -> None:
    signin = await signed_in("mcp:admin mcp:basic")
    assert not await signin.step_up("alice", challenge("mcp:admin"))
    assert not await signin.step_up("alice", 'Bearer error="insufficient_scope"')  # no scope named: nothing to ask


async def test_the_unnamed_caller_of_an_open_gateway_is_the_one_who_signed_in_on_its_page() -> None:
    signin = await signed_in("mcp:basic", caller=OPEN_CALLER)
    token, _ = await signin.token("")
    assert token == "t"
    assert await signin.step_up("", challenge("mcp:write"))
