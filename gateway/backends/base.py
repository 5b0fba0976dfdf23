"""What every backend is to the rest of the gateway: a named source of tools with a state and a reason.

A backend is one of: a downstream MCP server (``mcp/``), a command-line adapter (``cli/``) or the built-in
wiki provider (``wiki.py``). The runtime starts each backend's ``run()`` as one supervisor task with
``await task_group.start(backend.run)``; ``run`` calls ``task_status.started()`` once the backend is ready *or* has
failed for the first time (a failing backend never blocks startup), then keeps the backend alive until cancelled.
Ready means its tools are known: an adapter's probes report later (``wait_checked``).

The contract of ``call_tool``:
  * it returns the provider's ``CallToolResult`` untouched (an ``is_error`` result is an answer, not a failure);
  * it raises a ``BackendError`` subclass when the provider failed to answer (timeout, crash, transport error,
    disabled), with the cause in plain words; nothing foreign (``OSError``, ``httpx2``, ``anyio``) escapes;
  * cancellation of the calling task cancels the call downstream (a process group is killed, a
    ``notifications/cancelled`` is sent).

The layers above ask the backend, never its class or its ``kind`` (tests/test_layering.py checks it): whether its
tools are declared rather than discovered (``static_tools``), whether it is a downstream MCP session that serves the
rest of the protocol (``serves_requests``: resources, prompts, completion, subscriptions, log levels, roots), what it
offers besides tools, its processes (``process_statistics``) and its own estimates of what its answers cost
(``estimates``). A backend that is no MCP session inherits ``BackendBase``'s answers: nothing offered, every generic
request refused as unavailable, nothing to subscribe or tune.

``Backend`` is the contract; ``BackendBase`` is what the backends share of its implementation (name, kind, status,
listeners, the logged state change, the answers of a backend that is no MCP session).
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

from gateway.calls import NO_UPSTREAM, ClientLink, Upstream
from gateway.errors import BackendError, BackendUnavailable
from gateway.observe.logs import redactor

log = structlog.get_logger("gateway.backend")


STATIC_KINDS = frozenset({"adapter", "wiki"})
"""The kinds whose tools are declared in federation.yaml rather than discovered (``Backend.static_tools``)."""


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
    the ladder skips at once; ``eras`` the protocol eras an MCP downstream answered in.

    A status is what every way out reads (``/status``, ``/ui``, ``find_tools``, ``gateway check``, the log): its
    reasons are scrubbed of registered secrets when it is made (observe/logs.py ``redactor``), so none of them can
    forget to, and a reason quoting a stderr line with an API key in it, or a URL with its password, shows
    ``[redacted]`` wherever it goes.
    """

    state: BackendState
    reason: str | None = None
    since: float = field(default_factory=time.time)
    last_error: str | None = None
    tool_count: int = 0
    declared: bool = False  # True when the reason is the operator's (enabled: false), not detected
    unready: tuple[tuple[str, str], ...] = ()
    eras: tuple[str, ...] = ()
    """The protocol eras the downstream was found to speak at its last connect (``handshake``, ``2026-07-28``)."""

    def __post_init__(self) -> None:
        if self.reason:
            object.__setattr__(self, "reason", redactor.scrub(self.reason))
        if self.last_error:
            object.__setattr__(self, "last_error", redactor.scrub(self.last_error))
        if self.unready:
            object.__setattr__(self, "unready", tuple((label, redactor.scrub(why)) for label, why in self.unready))


ProgressFn = ProgressFnT
"""Progress relay: ``async (progress, total, message) -> None``."""


class Paced:
    """A client's progress relay in two forms. Called, it never waits for the client (what a shared downstream
    session needs: its read goes on for every caller); ``paced`` waits while the client has not taken what it was
    sent, for a downstream session of the caller's own, which may be held back as the caller's own connection to the
    server would hold it (backends/mcp/own.py)."""

    __slots__ = ("paced", "relay")

    def __init__(self, relay: ProgressFn, paced: ProgressFn) -> None:
        self.relay = relay
        self.paced = paced

    async def __call__(self, progress: float, total: float | None, message: str | None) -> None:
        await self.relay(progress, total, message)


def paced(progress: ProgressFn | None) -> ProgressFn | None:
    """The form of ``progress`` that waits for its client; None when it has none (or there is no progress)."""
    return progress.paced if isinstance(progress, Paced) else None


ChangeListener = Callable[[], None]
"""Called (synchronously, cheaply) whenever a backend's state or tool list changes."""


@dataclass(frozen=True, slots=True)
class ProcessStatistics:
    """What a backend that spawns processes is doing now (``/metrics``)."""

    live_processes: int
    """Spawned and not yet reaped (calls and probes)."""
    running_calls: int
    """Calls holding a concurrency slot."""
    waiting_calls: int
    """Calls waiting for a slot."""


@dataclass(frozen=True)
class CallerLists:
    """What each caller sees of a server whose callers list its tools with their own sessions (OAuth per caller):
    the tool names (the server's own) its shared session lists, and per caller whose own session has listed, theirs.
    """

    shared: frozenset[str]
    callers: Mapping[str, frozenset[str]]

    def seen_by(self, caller: str) -> frozenset[str]:
        """The names ``caller`` sees: their own session's list, else the shared session's."""
        return self.callers.get(caller, self.shared)


class SignsIn(Protocol):
    """A server the gateway signs in to as an OAuth client (``auth: {oauth: ...}``; backends/mcp/signin.py)."""

    @property
    def per_caller(self) -> bool:
        """Whether each caller signs in (``per: caller``), rather than the gateway with its own identity."""
        ...

    @property
    def link(self) -> str: ...

    def owns(self, state: str) -> bool:
        """Whether a sign-in waiting for its callback has this ``state``."""
        ...

    async def begin(self, caller: str) -> str | None: ...

    async def finish(self, state: str, code: str | None, iss: str | None, error: str | None) -> str: ...

    async def revoke(self, caller: str) -> None:
        """Revoke ``caller``'s tokens at the authorization server, where it offers that (best effort)."""
        ...


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

    @property
    def static_tools(self) -> bool:
        """Whether its tools are declared (an adapter, the wiki) rather than discovered from a session: a call is
        tried whatever its state short of disabled, the catalog keeps no last-known tools for it, and a route
        resolves to it first."""
        ...

    @property
    def serves_requests(self) -> bool:
        """Whether it is a downstream MCP session, which serves ``request`` and the rest of the protocol."""
        ...

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        """What it offered at its last handshake; None for a backend that is no MCP session (or before it)."""
        ...

    def tools(self) -> Sequence[types.Tool]:
        """The tools this backend offers now, under their own (downstream) names; empty unless ready."""
        ...

    def resources(self) -> Sequence[types.Resource]: ...

    def resource_templates(self) -> Sequence[types.ResourceTemplate]: ...

    def prompts(self) -> Sequence[types.Prompt]: ...

    def list_ttl_ms(self, kind: str) -> int | None:
        """The ``ttlMs`` (SEP-2549) the downstream gave its list ``kind`` (``tools``, ``resources``,
        ``resource_templates``, ``prompts``) when last listed; None when it gave none."""
        ...

    def last_known_tools(self) -> Sequence[types.Tool]:
        """The tools it offered when it was last ready (its current ones while ready); empty if it never was. The
        catalog keeps these listed while the backend reconnects, so clients' cached lists stay true."""
        ...

    def caller_lists(self) -> CallerLists | None:
        """Which of ``tools()`` each caller sees, for a server whose callers each list with their own session; None:
        every caller sees them all."""
        ...

    def serves(self, caller: str | None) -> bool:
        """Whether a call of ``caller``'s is sent now (the router answers the others at once with the state's reason):
        the backend is ready, or its tools are declared; a server whose callers have sessions of their own serves
        such a caller whatever its shared session's state."""
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

    async def wait_checked(self) -> None:
        """Return once its first health check is whole: ``run`` reports its first outcome as soon as its tools are
        known, and an adapter's probes (which only decide its rungs, or fail it) may answer later."""
        ...

    async def call_tool(
        self,
        tool: str,
        arguments: dict[str, Any],
        *,
        variant: str | None = None,
        progress: ProgressFn | None = None,
        upstream: Upstream = NO_UPSTREAM,
    ) -> types.CallToolResult:
        """Call ``tool``; ``upstream`` is the client request it serves (its caller, back-channel, ``_meta`` and, for
        a retry, its round)."""
        ...

    async def request(
        self, request: Any, result_type: Any, *, progress: ProgressFn | None = None, upstream: Upstream = NO_UPSTREAM
    ) -> Any:
        """Send any other client request (resources, prompts, completion) and return its answer.

        Raises:
            BackendError: it is no MCP session, is not ready, or failed to answer (a JSON-RPC error is
                ``BackendRpcError``).
            InputRequired: the answer is an input-required result.
        """
        ...

    async def subscribe_resource(self, uri: str) -> None:
        """Subscribe to updates of its ``uri`` (counted: the downstream is asked once).

        Raises:
            BackendError: it refused, or could not be reached.
        """
        ...

    async def unsubscribe_resource(self, uri: str) -> None:
        """Drop one subscription to ``uri``. Never raises."""
        ...

    async def set_log_level(self, level: types.LoggingLevel | None) -> None:
        """Ask for log messages from ``level`` up (kept across reconnects). Never raises."""
        ...

    async def roots_changed(self, client: ClientLink) -> None:
        """``client`` says its roots changed. Never raises."""
        ...

    def process_statistics(self) -> ProcessStatistics | None:
        """What its processes are doing now; None for a backend that spawns none."""
        ...

    def estimates(self) -> Mapping[str, int]:
        """Its own estimate, in tokens, of the answers of some of its tools (``{cost:TOOL}``); measured now, so
        call it only while ready; empty when it has none."""
        ...

    @property
    def signin(self) -> SignsIn | None:
        """Its OAuth sign-ins, when the gateway signs in to it (None otherwise)."""
        return None

    def connection_changed(self, caller: str, removed: bool) -> None:
        """``caller`` signed in to this server, or was signed out (``removed``)."""

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

    @property
    def static_tools(self) -> bool:
        return self._kind in STATIC_KINDS

    @property
    def serves_requests(self) -> bool:
        return False

    @property
    def capabilities(self) -> types.ServerCapabilities | None:
        return None

    def ladder(self, tool: str, arguments: Mapping[str, Any]) -> Sequence[str | None]:
        return (None,)

    async def wait_checked(self) -> None:
        return None

    @property
    def asks_mid_call(self) -> bool:
        """Whether a call may be interrupted by this backend's own request to the client (sampling, elicitation,
        roots) for the gateway to relay; only a handshake-era MCP session can send one."""
        return False

    def tools(self) -> Sequence[types.Tool]:
        return ()

    def resources(self) -> Sequence[types.Resource]:
        return ()

    def resource_templates(self) -> Sequence[types.ResourceTemplate]:
        return ()

    def prompts(self) -> Sequence[types.Prompt]:
        return ()

    def list_ttl_ms(self, kind: str) -> int | None:
        return None

    async def request(
        self, request: Any, result_type: Any, *, progress: ProgressFn | None = None, upstream: Upstream = NO_UPSTREAM
    ) -> Any:
        raise self._no_session(request.method)

    async def subscribe_resource(self, uri: str) -> None:
        raise self._no_session("resources/subscribe")

    async def unsubscribe_resource(self, uri: str) -> None:
        return None

    async def set_log_level(self, level: types.LoggingLevel | None) -> None:
        return None

    async def roots_changed(self, client: ClientLink) -> None:
        return None

    def process_statistics(self) -> ProcessStatistics | None:
        return None

    def estimates(self) -> Mapping[str, int]:
        return {}

    def _no_session(self, method: str) -> BackendError:
        return BackendUnavailable(self._name, f"it is no MCP server, so it serves no {method}")

    def last_known_tools(self) -> Sequence[types.Tool]:
        if self._status.state in (BackendState.READY, BackendState.DEGRADED):
            return self.tools()
        return self._last_known

    def caller_lists(self) -> CallerLists | None:
        return None

    def serves(self, caller: str | None) -> bool:
        return self._status.state is BackendState.READY or self.static_tools

    @property
    def signin(self) -> SignsIn | None:
        """Its OAuth sign-ins, when the gateway signs in to it (None otherwise)."""
        return None

    def connection_changed(self, caller: str, removed: bool) -> None:
        """``caller`` signed in to this server, or was signed out (``removed``)."""

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
        upstream: Upstream = NO_UPSTREAM,
    ) -> types.CallToolResult:
        raise BackendUnavailable(self._name, self._status.reason or "disabled")
