"""The gateway's task ids (front/tasks.py ``TaskIds``) are sealed under a key of their own: derived from the state key
for task ids alone, so neither a ``requestState`` nor a session id opens as a task id, nor a task id as either."""

from __future__ import annotations

import pytest
from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState
from mcp.shared.exceptions import MCPError

from gateway.front.http.seal import SessionSeal
from gateway.front.tasks import TaskIds

KEY = b"k" * 16 + b"0123456789abcdef0123456789abcdef"


def test_a_task_id_and_a_request_state_never_stand_in_for_each_other() -> None:
    ids = TaskIds([KEY])
    task = ids.seal(backend="b", task="t-1", tool="slow", caller="alice", ttl_ms=60_000)
    assert ids.open(task, "alice") == ("b", "t-1", "slow")
    state = AESGCMRequestStateCodec([KEY])  # how front/continuation.py seals a requestState under the same key
    with pytest.raises(InvalidRequestState):
        state.unseal(task)
    claims = b'{"v":1,"b":"b","t":"t-1","n":"slow","p":null,"exp":9999999999}'
    with pytest.raises(MCPError, match="Unknown task"):
        ids.open(state.seal(claims), None)
    session = SessionSeal([KEY], 3600).mint(owner=None, protocol_version="2025-11-25", client_params={})
    assert session is not None
    with pytest.raises(MCPError, match="Unknown task"):
        ids.open(session, None)


def test_rotated_keys_open_a_task_id_sealed_under_the_old_one() -> None:
    old = TaskIds([KEY]).seal(backend="b", task="t", tool="x", caller=None, ttl_ms=None)
    assert TaskIds([b"n" * 48, KEY]).open(old, None) == ("b", "t", "x")
