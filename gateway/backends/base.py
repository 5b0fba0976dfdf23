"""What every backend is to the rest of the gateway: a named source of tools with a state and a reason.

A backend is one of: a downstream MCP server (``mcp.py``), a command-line adapter (``cli.py``) or the built-in
wiki provider (``wiki.py``). The runtime starts each backend's ``run()`` as one supervisor task with
``await task_group.start(backend.run)``; ``run`` calls ``task_status.started()`` once the backend is ready *or* has
failed for the first time (a failing backend never blocks startup), then keeps the backend alive until cancelled.

The contract of ``call_tool``:
  * it returns the provider's ``CallToolResult`` untouched (an ``is_error`` result is an answer, not a failure);
  * it raises a ``BackendError`` subclass when the provider failed to answer (timeout, crash, transport error,
    disabled), with the cause in plain words; nothing foreign (``OSError``, ``httpx2``, ``anyio``) escapes;
  * cancellation of the calling task cancels the call downstream (a process group is killed, a
    ``notifications/cancelled`` is sent).

``Backend`` is the contract; ``BackendBase`` is what the backends share of its implementation (name, kind, status,
listeners, the logged state change).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any, Protocol

import anyio
import mcp_types as types
import structlog
from anyio.abc import TaskStatus
from mcp.shared.dispatcher import ProgressFnT

from gateway.errors import BackendUnavailable

log = structlog.get_logger("gateway.backend")


class BackendState(StrEnum):
    STARTING = "starting"
    READY = "ready"
    DEGRADED = "degraded"
    FAILED = "failed"
    DISABLED = "disabled"


@dataclass(frozen=True, slots=True)
class BackendStatus:
    """A snapshot of one backend's health, as shown by ``gateway check``, ``/status`` and the log.

    ``reason`` says why the backend is not ready (declared by the operator or detected); ``since`` is the unix time
    the state was entered; ``last_error`` is the most recent failure, kept after the backend heals; ``unready`` names
    the variants of a ready backend found unable to run (``("files_search[deep]", "the detected reason")``), which
    the ladder skips at once.
    """

    state: BackendState
    reason: str | None = None
    since: float = field(default_factory=time.time)
    last_error: str | None = None
    tool_count: int = 0
    declared: bool = False  # True when the reason is the operator's (enabled: false), not detected
    unready: tuple[tuple[str, str], ...] = ()


ProgressFn = ProgressFnT
"""Progress relay: ``async (progress, total, message) -> None``."""

ChangeListener = Callable[[], None]
"""Called (synchronously, cheaply) whenever a backend's state or tool list changes."""


class Backend(Protocol):
    """A source of tools. See the module docstring for the contract."""

    @property
    def name(self) -> str: ...

    @property
    def kind(self) -> str:
        """``stdio`` | ``streamable_http`` | ``sse`` | ``adapter`` | ``wiki``."""
        ...

    @property
    def status(self) -> BackendStatus: ...

    def tools(self) -> Sequence[types.Tool]:
        """The tools this backend offers now, under their own (downstream) names; empty unless ready."""
        ...

    def last_known_tools(self) -> Sequence[types.Tool]:
        """The tools it offered when it was last ready (its current ones while ready); empty if it never was. The
        catalog keeps these listed while the backend reconnects, so clients' cached lists stay true."""
        ...

    def ladder(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str | None]:
        """The variants to try for this call, in order (requested first, then each cheaper rung).

        ``(None,)`` for a tool without variants.
        """
        ...

    @property
    def asks_mid_call(self) -> bool:
        """Whether a call may be interrupted by this backend's own request to the client (see BackendBase)."""
        ...

    async def run(self, *, task_status: TaskStatus[None]) -> None: ...

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
    ) -> types.CallToolResult: ...

    def subscribe(self, listener: ChangeListener) -> None:
        """Register a listener for state and tool-list changes."""
        ...


class BackendBase:
    """What the backends share, written once (an implementation helper; the contract is ``Backend``).

    It holds the name, kind and status, offers no variants (``ladder`` answers ``(None,)``), keeps the change
    listeners, and moves the status: ``_set_status`` enters a status, logs a change of state or reason and tells the
    listeners; ``_set_state`` enters a state for a reason unless the backend is already there.
    """

    def __init__(self, name: str, kind: str, status: BackendStatus) -> None:
        self._name = name
        self._kind = kind
        self._status = status
        self._listeners: list[ChangeListener] = []
        self._last_known: tuple[types.Tool, ...] = ()

    @property
    def name(self) -> str:
        return self._name

    @property
    def kind(self) -> str:
        return self._kind

    @property
    def status(self) -> BackendStatus:
        return self._status

    def ladder(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str | None]:
        return (None,)

    @property
    def asks_mid_call(self) -> bool:
        """Whether a call may be interrupted by this backend's own request to the client (sampling, elicitation,
        roots) for the gateway to relay; only a handshake-era MCP session can send one."""
        return False

    def tools(self) -> Sequence[types.Tool]:
        return ()

    def last_known_tools(self) -> Sequence[types.Tool]:
        if self._status.state in (BackendState.READY, BackendState.DEGRADED):
            return self.tools()
        return self._last_known

    def subscribe(self, listener: ChangeListener) -> None:
        self._listeners.append(listener)

    def _set_status(self, status: BackendStatus) -> None:
        """Enter ``status`` and tell the listeners (always: the tool list may have changed within a state).

        A change of state or reason is logged: ``backend.ready`` (info) or ``backend.state`` (info when disabled,
        else a warning), with the backend, its kind, the state, the reason and the tool count.
        """
        previous = self._status
        self._status = status
        if status.state in (BackendState.READY, BackendState.DEGRADED):
            self._last_known = tuple(self.tools())  # what the catalog keeps listed if the backend is lost
        if status.state is not previous.state or status.reason != previous.reason:
            event = "backend.ready" if status.state is BackendState.READY else "backend.state"
            log_fn = log.info if status.state in (BackendState.READY, BackendState.DISABLED) else log.warning
            log_fn(
                event,
                backend=self._name,
                kind=self._kind,
                state=str(status.state),
                reason=status.reason,
                tools=status.tool_count,
            )
        for listener in list(self._listeners):
            listener()

    def _set_state(
        self, state: BackendState, reason: str | None = None, *, tool_count: int = 0, declared: bool = False
    ) -> None:
        """Enter ``state`` for ``reason``; nothing happens (no log, no listener told) when already there.

        The reason of a FAILED or DEGRADED state is kept as ``last_error``; otherwise the last one stays.
        ``tool_count`` is how many tools the backend offers in that state.
        """
        previous = self._status
        if (previous.state, previous.reason) == (state, reason):
            return
        failing = state in (BackendState.FAILED, BackendState.DEGRADED)
        self._set_status(
            BackendStatus(
                state,
                reason,
                last_error=reason if failing else previous.last_error,
                tool_count=tool_count,
                declared=declared,
            )
        )


class DisabledBackend(BackendBase):
    """A backend the operator switched off (``enabled: false``): shown with its reason, offering nothing."""

    def __init__(self, name: str, kind: str, reason: str | None) -> None:
        super().__init__(
            name, kind, BackendStatus(BackendState.DISABLED, reason or "disabled in federation.yaml", declared=True)
        )

    def tools(self) -> Sequence[types.Tool]:
        return ()

    async def run(self, *, task_status: TaskStatus[None]) -> None:
        task_status.started()
        await anyio.sleep_forever()

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
    ) -> types.CallToolResult:
        raise BackendUnavailable(self._name, self._status.reason or "disabled")
