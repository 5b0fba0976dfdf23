"""Testing aids for the gateway and for code built on it, as httpx ships ``MockTransport`` and structlog
``capture_logs``: real implementations of the seams, not mocks.

* ``FakeBackend``: a scripted implementation of the ``Backend`` protocol (gateway/backends/base.py). Its answers are
  queued per ``(tool, variant)`` with ``script``: a ``CallToolResult`` is returned, an exception raised, ``BLOCK``
  waits until the call is cancelled; once they are used up it answers ``"<name>/<tool> answered"``. It records every
  call in ``calls``; ``set_state`` changes its status as a real backend's would.
* ``FakeRecorder``: an audit sink that keeps every record, in order.
* ``in_process_gateway``: a running ``Gateway`` with its MCP face, and an SDK ``Client`` connected to it in memory.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import AsyncIterator, Iterable, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import TYPE_CHECKING, Any, Final, NamedTuple

import anyio
import mcp_types as types
from anyio.abc import TaskStatus
from mcp.client.client import Client

from gateway.backends.base import Backend, BackendBase, BackendState, BackendStatus, ProgressFn
from gateway.calls import NO_UPSTREAM, Upstream
from gateway.config import Federation, parse_config
from gateway.core.runtime import Gateway
from gateway.front.face import Face
from gateway.ledger.records import AuditRecord

__all__ = [
    "BLOCK",
    "Call",
    "FakeBackend",
    "FakeRecorder",
    "InProcess",
    "in_process_gateway",
    "make_tool",
    "text_result",
]

BLOCK: Final = "block"
"""A scripted answer that never comes: the call sets ``entered`` and waits until it is cancelled."""

Answer = types.CallToolResult | Exception | str


def make_tool(
    name: str,
    description: str | None = None,
    input_schema: Mapping[str, Any] | None = None,
    output_schema: Mapping[str, Any] | None = None,
) -> types.Tool:
    """A tool definition; its input schema is an empty object's unless given."""
    return types.Tool(
        name=name,
        description=description,
        input_schema=dict(input_schema) if input_schema is not None else {"type": "object", "properties": {}},
        output_schema=dict(output_schema) if output_schema is not None else None,
    )


def text_result(text: str, *, is_error: bool = False, **fields: Any) -> types.CallToolResult:
    """A call result of one text block (``fields``: ``structured_content``, ``meta``, ...)."""
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=is_error, **fields)


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    """One call a ``FakeBackend`` received."""

    tool: str
    arguments: dict[str, Any]
    variant: str | None


class FakeBackend(BackendBase):
    """A scripted backend, ready unless told otherwise. ``run()`` becomes ready and parks until cancelled.

    Args:
        name: The backend's name in the federation.
        tools: Its tools, as definitions or names (``make_tool``).
        kind: Its kind, as the config would name it.
        state: Its state until ``run()`` or ``set_state``; ``reason`` and ``declared`` go with it.
        ladders: The variants each tool's ladder tries, in order (``(None,)`` when not given).
        list_when_down: ``tools()`` lists its tools in any state (the protocol says: none unless ready), so a test
            can show that the catalog, not the backend, leaves a down backend's tools out.
    """

    def __init__(
        self,
        name: str,
        tools: Iterable[types.Tool | str] = (),
        *,
        kind: str = "stdio",
        state: BackendState = BackendState.READY,
        reason: str | None = None,
        declared: bool = False,
        ladders: Mapping[str, Sequence[str | None]] | None = None,
        list_when_down: bool = False,
    ) -> None:
        self._tools = [make_tool(t) if isinstance(t, str) else t for t in tools]
        super().__init__(
            name, kind, BackendStatus(state, reason=reason, declared=declared, tool_count=len(self._tools))
        )
        self._ladders = dict(ladders or {})
        self._list_when_down = list_when_down
        self._script: dict[tuple[str, str | None], deque[Answer]] = {}
        self.calls: list[Call] = []
        self.entered = anyio.Event()
        """Set when a call reaches a ``BLOCK`` answer."""

    def set_state(self, state: BackendState, reason: str | None = None, *, declared: bool = False) -> None:
        self._set_status(BackendStatus(state, reason=reason, declared=declared, tool_count=len(self._tools)))

    def tools(self) -> Sequence[types.Tool]:
        if self._list_when_down or self._status.state in (BackendState.READY, BackendState.DEGRADED):
            return tuple(self._tools)
        return ()

    def ladder(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str | None]:
        return tuple(self._ladders.get(tool, (None,)))

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self.set_state(BackendState.READY)
        task_status.started()
        await anyio.sleep_forever()

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
        upstream: Upstream = NO_UPSTREAM,
    ) -> types.CallToolResult:
        self.calls.append(Call(tool, dict(arguments), variant))
        queue = self._script.get((tool, variant))
        answer: Answer = queue.popleft() if queue else text_result(f"{self._name}/{tool} answered")
        if isinstance(answer, Exception):  # a GatewayError, or a fault the gateway did not expect
            raise answer
        if isinstance(answer, str):  # BLOCK
            self.entered.set()
            await anyio.sleep_forever()
        assert isinstance(answer, types.CallToolResult)
        return answer

    def script(self, tool: str, *answers: Answer, variant: str | None = None) -> FakeBackend:
        """Queue answers for calls of ``tool`` in ``variant``; once they are used up, a plain text answer follows."""
        self._script.setdefault((tool, variant), deque()).extend(answers)
        return self


if TYPE_CHECKING:
    _conforms: Backend = FakeBackend("fake")  # mypy checks here that FakeBackend satisfies the Backend protocol


class FakeRecorder:
    """An audit sink that keeps every record, in order (the router's ``Recorder``)."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    async def record(self, rec: AuditRecord) -> None:
        self.records.append(rec)


class InProcess(NamedTuple):
    """What ``in_process_gateway`` yields: the connected client, and the running gateway it talks to."""

    client: Client
    gateway: Gateway


@asynccontextmanager
async def in_process_gateway(
    config: Federation | str, *, mode: str = "legacy", settle_s: float | None = 15.0, **client_options: Any
) -> AsyncIterator[InProcess]:
    """Run a gateway in this process and connect the SDK's ``Client`` to its MCP face in memory (no transport).

    Leaving the block disconnects the client, then stops the gateway and its backends.

    Args:
        config: The federation, or the text of a federation.yaml (read with an empty environment).
        mode: The client's ``mode``: ``"legacy"`` (the handshake era) or a protocol version such as
            ``"2026-07-28"`` (the stateless era).
        settle_s: Wait at most this long for every backend's first outcome and probes before connecting; None: do
            not wait.
        client_options: More keywords for ``Client`` (callbacks, ``client_info``, ...).

    Raises:
        TimeoutError: The backends had not all settled within ``settle_s``.
    """
    federation = parse_config(config, file="federation.yaml", env={}) if isinstance(config, str) else config
    async with Gateway(federation).running() as gateway:
        if settle_s is not None and not await gateway.wait_settled(settle_s, checked=True):
            raise TimeoutError(f"the gateway's backends had not all settled within {settle_s} s")
        async with Client(Face(gateway).server(), mode=mode, **client_options) as client:
            yield InProcess(client, gateway)
