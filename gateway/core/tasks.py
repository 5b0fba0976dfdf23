"""Tasks (the ``io.modelcontextprotocol/tasks`` extension, SEP-2663) on the routing side: which extensions the
backends offer, the requests that reach the backend owning a task, and the task's ledger rows.

A task-augmented ``tools/call`` is routed as every call is (core/router.py): the backend's answer, a task, ends it as
``TaskCreated`` and its row's status is ``task`` (the creation). ``tasks/get``, ``tasks/update`` and ``tasks/cancel``
name a task the front already traced to its backend and tool (front/tasks.py): ``TaskRelay.ask`` routes each as
every other request is (``Router.request``: the caller's policy for the task's tool, the backend's circuit breaker,
the shutdown), as the calling client's request (its capabilities, its caller). Their rows: a ``tasks/get`` that
first finds a task ended writes one row of kind ``tasks/get`` whose status is the task's end (``ok``, ``error`` for a
tool error or a failed task, ``cancelled``), once per task in this process (``ENDED_KEPT`` remembered; another
replica that sees the end writes its own); each ``tasks/cancel`` writes one row of kind ``tasks/cancel``; a request
refused or unanswered writes its row as any request does. Polls that find a task still running write nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterable, Mapping
from functools import partial
from typing import Any, ClassVar

import mcp_types as types
from pydantic import TypeAdapter

from gateway.backends.base import Backend, BackendState
from gateway.calls import CallContext, Origin
from gateway.core.router import Router

__all__ = ["RELAYED", "TASKS", "TERMINAL", "TaskRelay", "TaskRequest", "offered_extensions"]

TASKS = "io.modelcontextprotocol/tasks"
"""The extension's identifier, under ``capabilities.extensions``."""

TERMINAL = frozenset({"completed", "failed", "cancelled"})

ENDED_KEPT = 4096
"""How many ended tasks this process remembers having written the end of (the oldest forgotten first)."""

_ANSWER: TypeAdapter[dict[str, Any]] = TypeAdapter(dict[str, Any])


class TaskRequest(types.Request[dict[str, Any], str]):
    """A ``tasks/*`` request to a downstream; the SDK mirrors its ``taskId`` into ``Mcp-Name`` (SEP-2663)."""

    name_param: ClassVar[str | None] = "taskId"


RELAYED = frozenset({TASKS})
"""The extensions the gateway relays, so offers when a backend does. Any other (e.g. skills, SEP-2640) commits its
server to methods the gateway does not serve: it is not offered."""


def offered_extensions(backends: Iterable[Backend]) -> dict[str, dict[str, Any]]:
    """The extensions of ``RELAYED`` the ready backends offer (``capabilities.extensions``), each under its
    identifier; where two offer one, the first's settings."""
    offered: dict[str, dict[str, Any]] = {}
    for backend in backends:
        caps = backend.capabilities
        if caps is None or not caps.extensions or backend.status.state is not BackendState.READY:
            continue
        for identifier, settings in caps.extensions.items():
            if identifier in RELAYED:
                offered.setdefault(identifier, dict(settings or {}))
    return offered


def _end_status(answer: Mapping[str, Any]) -> str:
    status = answer.get("status")
    if status == "cancelled":
        return "cancelled"
    result = answer.get("result")
    return "ok" if status == "completed" and not (isinstance(result, dict) and result.get("isError")) else "error"


class TaskRelay:
    """Sends the ``tasks/*`` requests of a task to the backend that owns it, and writes the task's rows."""

    def __init__(self, router: Router) -> None:
        self._router = router
        self._ended: OrderedDict[str, None] = OrderedDict()

    async def ask(
        self, method: str, params: dict[str, Any], *, backend: str, tool: str, task: str, ctx: CallContext
    ) -> dict[str, Any]:
        """``method`` with ``params`` (the downstream's own task id in them) to ``backend``; its answer as it came.
        ``tool`` (the published name, held to the caller's policy in ``ctx.visible``) and ``task`` (the client's
        task id) name the rows.

        Raises:
            ToolNotFound: ``tool`` is outside the caller's policy; nothing was sent.
            Unanswered: the backend did not answer: its failure says why (its circuit open, a timeout), a JSON-RPC
                error answer among them (an unknown task's -32602); no failure when it serves no requests.
        """
        request = TaskRequest(method=method, params=params)

        async def send(found: Backend, origin: Origin) -> dict[str, Any]:
            answer: dict[str, Any] = await found.request(request, _ANSWER, upstream=ctx.upstream)
            return answer

        origin = Origin(backend, str(params.get("taskId")))
        recorded = partial(self._status, method, task)
        found: tuple[Origin, dict[str, Any]] = await self._router.request(
            method, tool, (origin,), send, ctx=ctx, tool=tool, recorded=recorded
        )
        return found[1]

    def _status(self, method: str, task: str, answer: Mapping[str, Any]) -> str | None:
        """The status of the row ``answer`` makes (see the module docstring); None: no row."""
        if method == "tasks/cancel":
            return "ok"
        if method != "tasks/get" or answer.get("status") not in TERMINAL or task in self._ended:
            return None
        self._ended[task] = None
        if len(self._ended) > ENDED_KEPT:
            self._ended.popitem(last=False)
        return _end_status(answer)
