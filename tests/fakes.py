"""In-memory fakes of the gateway's seams: a scripted ``Backend`` and an audit recorder that keeps what it is given.

``FakeBackend`` is a real implementation of the ``Backend`` protocol (``gateway/backends/base.py``), not a mock: it has
a name, a kind, a status set with ``set_state``, a tool list, a per-tool ladder, scripted answers per
``(tool, variant)`` (a ``CallToolResult`` is returned, a ``BackendError`` raised, ``BLOCK`` waits until the call is
cancelled), a ``run()`` that becomes ready and then parks until cancelled, and change listeners.
"""

from __future__ import annotations

import dataclasses
from collections import deque
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final

import anyio
import mcp_types as types
from anyio.abc import TaskStatus

from gateway.backends.base import Backend, BackendBase, BackendState, BackendStatus, ProgressFn
from gateway.calls import NO_UPSTREAM, Upstream
from gateway.ledger.records import AuditRecord

__all__ = ["BLOCK", "FakeBackend", "FakeRecorder", "make_tool", "text_result"]

BLOCK: Final = "block"
"""A scripted answer that never comes: the call sets ``entered`` and waits until it is cancelled."""

Answer = types.CallToolResult | Exception | str


def make_tool(
    name: str,
    description: str | None = None,
    input_schema: Mapping[str, Any] | None = None,
    output_schema: Mapping[str, Any] | None = None,
) -> types.Tool:
    return types.Tool(
        name=name,
        description=description,
        input_schema=dict(input_schema) if input_schema is not None else {"type": "object", "properties": {}},
        output_schema=dict(output_schema) if output_schema is not None else None,
    )


def text_result(text: str, *, is_error: bool = False, **fields: Any) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(text=text)], is_error=is_error, **fields)


@dataclasses.dataclass(frozen=True, slots=True)
class Call:
    tool: str
    arguments: dict[str, Any]
    variant: str | None


class FakeBackend(BackendBase):
    """A scripted backend. ``tools()`` follows the protocol (empty unless ready) unless ``list_when_down`` is set,
    which lets a test check that the catalog itself, not the backend, leaves a down backend's tools out."""

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

    # ------------------------------------------------------------------ the protocol (name, kind, status: BackendBase)

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

    # ------------------------------------------------------------------ scripting

    def script(self, tool: str, *answers: Answer, variant: str | None = None) -> FakeBackend:
        """Queue answers for calls of ``tool`` in ``variant``; once they are used up, a plain text answer follows."""
        self._script.setdefault((tool, variant), deque()).extend(answers)
        return self


class FakeRecorder:
    """An audit sink that keeps every record, in order."""

    def __init__(self) -> None:
        self.records: list[AuditRecord] = []

    async def record(self, rec: AuditRecord) -> None:
        self.records.append(rec)


def _conforms(backend: FakeBackend) -> Backend:
    return backend  # mypy checks here that FakeBackend satisfies the Backend protocol
