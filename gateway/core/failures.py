"""The answers the router makes itself: every provider failed, a fault of the gateway's, a provider's refusal of
its arguments told in the client's terms, and a request no backend answered (``Unanswered``)."""

from __future__ import annotations

from collections.abc import Sequence

import mcp_types as types

from gateway.core.catalog import Provider
from gateway.errors import BackendError, InvalidArguments, quote
from gateway.ledger.records import AuditStep

__all__ = ["Unanswered", "failure_result", "fault", "refusal", "refused"]


class Unanswered(Exception):
    """No backend answered a request (``Router.request``). ``failures`` are the backends' failures in the order
    they were asked (a skipped open circuit is a ``BackendUnavailable``); empty when none of the origins' backends
    serves requests."""

    def __init__(self, failures: Sequence[BackendError]) -> None:
        super().__init__("; ".join(str(f) for f in failures) or "no backend serves this request")
        self.failures = tuple(failures)


def failure_result(name: str, steps: list[AuditStep]) -> types.CallToolResult:
    if not steps:
        text = f"Tool {name!r} has no available provider right now."
    else:
        parts = [f"{s.provider}{f' [{s.variant}]' if s.variant else ''}: {s.outcome} ({s.reason})" for s in steps]
        text = f"Tool {name!r} failed: every provider failed. " + "; ".join(parts)
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def fault(name: str, exc: Exception) -> types.CallToolResult:
    text = (
        f"Tool {quote(name)} failed: the gateway hit an unexpected error ({type(exc).__name__}) while serving this "
        "call; other calls are not affected."
    )
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=True)


def refused(exc: InvalidArguments, published: str, provider: Provider) -> types.CallToolResult:
    """A backend's refusal of its own tool's arguments, told in the client's terms: the published tool (renamed,
    prefixed or a route) and argument."""
    return refusal(InvalidArguments(published, provider.published_argument(exc.argument), exc.message))


def refusal(exc: InvalidArguments) -> types.CallToolResult:
    """Arguments refused, as the tool result a client shows its model."""
    return types.CallToolResult(content=[types.TextContent(text=str(exc))], is_error=True)
