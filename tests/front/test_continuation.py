"""The sealed requestState of multi-round-trip requests (gateway/continuation.py), without processes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from mcp.shared.exceptions import MCPError

from gateway.errors import ConfigError
from gateway.front.continuation import Continuation, Continuations, load_key

KEY = b"0123456789abcdef0123456789abcdef"


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def _seal(c: Continuations, **over: object) -> str:
    fields: dict[str, object] = {
        "method": "tools/call",
        "name": "interview",
        "arguments": {"rounds": 1},
        "backend": "asker",
        "local": "interview",
        "caller": "alice",
        "state": "down",
    }
    fields.update(over)
    return c.seal(**fields)  # type: ignore[arg-type]


def _open(c: Continuations, token: object, **over: object) -> Continuation:
    fields: dict[str, object] = {
        "method": "tools/call",
        "name": "interview",
        "arguments": {"rounds": 1},
        "caller": "alice",
    }
    fields.update(over)
    return c.open(token, **fields)  # type: ignore[arg-type]


def _refused(c: Continuations, token: object, **over: object) -> None:
    with pytest.raises(MCPError) as exc:
        _open(c, token, **over)
    assert (exc.value.error.code, exc.value.error.message) == (-32602, "Invalid or expired requestState")
    assert exc.value.error.data == {"reason": "invalid_request_state"}


def test_a_token_opens_for_its_request_and_caller_only() -> None:
    clock = Clock()
    c = Continuations([KEY], 60, clock=clock)
    token = _seal(c)
    assert _open(c, token) == Continuation("asker", "interview", "down")
    assert "asker" not in token and "down" not in token  # encrypted, not only signed
    _refused(c, token, caller="bob")
    _refused(c, token, caller=None)
    _refused(c, token, name="other")
    _refused(c, token, method="prompts/get")
    _refused(c, token, arguments={"rounds": 2})
    _refused(c, token + "A")
    _refused(c, 42)
    _refused(Continuations([b"another key, also 32 bytes long!"], 60, clock=clock), token)
    clock.now += 60
    _refused(c, token)  # expired


def test_no_caller_binds_to_no_caller() -> None:
    c = Continuations([KEY], 60)
    token = _seal(c, caller=None, state=None)
    assert _open(c, token, caller=None) == Continuation("asker", "interview", None)
    _refused(c, token, caller="alice")


def test_the_key_comes_from_the_environment_then_a_file_beside_the_ledger(tmp_path: Path) -> None:
    assert load_key("K", "x" * 32, str(tmp_path / "audit.db")) == ([b"x" * 32], "environment variable K")
    with pytest.raises(ConfigError, match="the key in the environment variable K has 5 characters"):
        load_key("K", "short", None)
    with pytest.raises(ConfigError, match="key 2 of 2 in the environment variable K has 3 characters"):
        load_key("K", "x" * 32 + ",abc", None)
    key, source = load_key("K", None, str(tmp_path / "audit.db"))
    path = tmp_path / "audit.db.state-key"
    assert source == "file audit.db.state-key beside the audit ledger"
    assert os.stat(path).st_mode & 0o777 == 0o600
    assert [len(k) for k in key] == [64]
    assert load_key("K", None, str(tmp_path / "audit.db"))[0] == key  # kept: a restart opens old tokens
    assert load_key("K", "", str(tmp_path / "audit.db"))[0] == key  # an empty variable is no key
    ephemeral, source = load_key("K", None, None)
    assert source == "this process only" and len(ephemeral[0]) == 32 and ephemeral != load_key("K", None, None)[0]


def test_a_rotation_opens_tokens_of_the_old_key_and_seals_with_the_new() -> None:
    old, new = b"o" * 32, b"n" * 32
    before = Continuations([old], 60)
    token = _seal(before)
    during = Continuations([new, old], 60)
    assert _open(during, token).backend == "asker"
    assert _open(Continuations([new], 60), _seal(during)).backend == "asker"  # sealed with the new one
    _refused(Continuations([new], 60), token)  # the old key dropped: its tokens no longer open
