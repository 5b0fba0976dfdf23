"""The one table from a downstream session's foreign errors to the gateway's error tree (backends/failures.py)."""

from __future__ import annotations

import anyio
import httpx2
import pytest
from mcp.client.subscriptions import ListenNotSupportedError, SubscriptionLost
from mcp.shared.exceptions import MCPError

from gateway.backends.mcp.failures import FOREIGN, FOREIGN_ERRORS, gateway_error
from gateway.errors import (
    BackendError,
    BackendProtocolError,
    BackendRpcError,
    BackendTimeout,
    BackendUnavailable,
)


@pytest.mark.parametrize(
    ("foreign", "expected"),
    [
        (MCPError(-32602, "bad"), BackendRpcError),
        (httpx2.ConnectError("refused"), BackendUnavailable),
        (httpx2.ReadTimeout("slow"), BackendUnavailable),  # an HTTP timeout loses the stream, as it always did
        (anyio.BrokenResourceError(), BackendUnavailable),
        (anyio.ClosedResourceError(), BackendUnavailable),
        (BrokenPipeError(), BackendUnavailable),
        (FileNotFoundError("npx"), BackendUnavailable),
        (TimeoutError(), BackendTimeout),  # nearer than OSError, its base
        (SubscriptionLost(), BackendUnavailable),  # nearer than RuntimeError, its base
        (ListenNotSupportedError("2025-11-25"), BackendProtocolError),
        (RuntimeError("unexpected result shape"), BackendProtocolError),
    ],
)
def test_each_foreign_error_maps_to_the_nearest_gateway_error(foreign: Exception, expected: type[BackendError]) -> None:
    assert gateway_error(foreign) is expected
    assert isinstance(foreign, FOREIGN)


@pytest.mark.parametrize("bug", [ValueError("x"), KeyError("k"), TypeError("t"), AssertionError()])
def test_an_error_that_is_no_downstreams_is_not_translated(bug: Exception) -> None:
    assert gateway_error(bug) is None
    assert not isinstance(bug, FOREIGN)


def test_the_except_tuple_is_the_table() -> None:
    assert FOREIGN == tuple(FOREIGN_ERRORS)
    assert all(issubclass(target, BackendError) for target in FOREIGN_ERRORS.values())
