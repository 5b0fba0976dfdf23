"""Tasks (the ``io.modelcontextprotocol/tasks`` extension, SEP-2663) on the routing side: which extensions the
backends offer, the requests that reach the backend owning a task, and the task's ledger rows.

A task-augmented ``tools/call`` is routed as every call is (core/router.py): the backend's answer, a task, ends it as
``TaskCreated`` and its row's status is ``task`` (the creation). ``tasks/get``, ``tasks/update`` and ``tasks/cancel``
name a task the front already traced to its backend (front/tasks.py): ``TaskRelay.ask`` sends each there, as the
calling client's request (its capabilities, its caller), and translates a failure as the router does (a JSON-RPC
error answer passes through). Their rows: a ``tasks/get`` that first finds a task ended writes one row of kind
``tasks/get`` whose status is the task's end (``ok``, ``error`` for a tool error or a failed task, ``cancelled``),
once per task in this process (``ENDED_KEPT`` remembered; another replica that sees the end writes its own); each
``tasks/cancel`` writes one row of kind ``tasks/cancel``. Polls that find a task still running write nothing.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Iterable, Mapping
from typing import Any, ClassVar

import mcp_types as types
from pydantic import TypeAdapter

from gateway.backends.base import Backend, BackendState
from gateway.calls import CallContext
from gateway.core.record import CallRecord, Instruments, ledger_name
from gateway.errors import BackendError, BackendRpcError, BackendUnavailable

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

    def __init__(self, backends: Callable[[], Mapping[str, Backend]], instruments: Instruments) -> None:
        self._backends = backends
        self._instruments = instruments
        self._ended: OrderedDict[str, None] = OrderedDict()

    async def ask(
        self, method: str, params: dict[str, Any], *, backend: str, tool: str, task: str, ctx: CallContext
    ) -> dict[str, Any]:
        """``method`` with ``params`` (the downstream's own task id in them) to ``backend``; its answer as it came.
        ``tool`` (the published name) and ``task`` (the client's task id) name the rows.

        Raises:
            BackendRpcError: the backend answered with a JSON-RPC error (an unknown task's -32602 among them).
            BackendError: the backend is gone, not ready, or failed to answer.
        """
        found = self._backends().get(backend)
        if found is None:
            raise BackendUnavailable(backend, "it is no longer configured")
        request = TaskRequest(method=method, params=params)
        record = CallRecord(self._instruments, method, ledger_name(tool), ctx)
        try:
            answer: dict[str, Any] = await found.request(request, _ANSWER, upstream=ctx.upstream)
        except BackendRpcError:
            raise
        except BackendError as exc:
            if method == "tasks/cancel":
                with record.open(span=False):
                    record.add(backend, exc.outcome, str(exc))
                    await record.finish("error", measured=False)
            raise
        if method == "tasks/cancel":
            with record.open(span=False):
                record.add(backend, "ok", None)
                await record.finish("ok", measured=False)
        elif method == "tasks/get" and answer.get("status") in TERMINAL and task not in self._ended:
            self._ended[task] = None
            if len(self._ended) > ENDED_KEPT:
                self._ended.popitem(last=False)
            status = _end_status(answer)
            with record.open(span=False):
                record.add(backend, status, f"task {answer.get('status')}")
                await record.finish(status, measured=False)
        return answer
