"""Tasks (the ``io.modelcontextprotocol/tasks`` extension, SEP-2663) at the gateway's face: a task-augmented
``tools/call`` is answered with a task of the gateway's, and ``tasks/get``, ``tasks/update`` and ``tasks/cancel``
reach the backend that runs it. Part of the face (front/face.py), which registers these handlers.

The task id a client gets is the gateway's own: a token sealed (AES-256-GCM, the SDK's codec, under a key derived for
task ids alone from the key of front/continuation.py's ``requestState``) that carries the backend, the downstream's
own task id, the published tool and a digest of the caller, so any replica holding the key routes it, with no shared
state. The downstream's id never reaches the client, nor the client's the downstream. A ``tasks/*`` request is
checked as a server of the extension checks it: the client must declare the extension (else -32021, whatever the
id), its ``Mcp-Name`` header must be the ``taskId`` (else -32020, SEP-2243). Then it goes as a call goes: it waits
for a startup under way, and the router holds it to the caller's policy as it is now and to the backend's circuit
breaker (core/tasks.py). A task id that does not unseal, was minted for another caller, or whose tool the caller's
policy hides, is answered exactly as an unknown task (-32602 "Unknown task"), so another caller cannot tell a task
exists; a backend that does not answer is told as for any request (front/server.py ``refusal``).
"""

from __future__ import annotations

import base64
import dataclasses
import hashlib
import json
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import mcp_types as types
import structlog
from mcp.server import Server
from mcp.server.context import ServerRequestContext
from mcp.server.request_state import AESGCMRequestStateCodec, InvalidRequestState
from mcp.shared.exceptions import MCPError
from pydantic import Field

from gateway.calls import CallContext
from gateway.config import environ
from gateway.core.policies import View
from gateway.core.router import Unanswered
from gateway.core.runtime import Gateway
from gateway.core.tasks import TASKS, TaskRelay
from gateway.errors import BackendRpcError, TaskCreated, ToolNotFound
from gateway.front.continuation import load_key
from gateway.front.server import refusal

__all__ = ["Tasks"]

log = structlog.get_logger("gateway.tasks")

_VERSION = 1
_SERVER_INFO = "io.modelcontextprotocol/serverInfo"
_PRINCIPAL_LABEL = b"mcp-gateway/task/caller:"
_KEY_LABEL = b"mcp-gateway/task-id/v1:"
"""Prefixed to the state key before the codec derives its own (HKDF-SHA256): a task id and a ``requestState`` or a
session id (front/http/seal.py) never stand in for each other."""
_LONGEST_S = 7 * 24 * 3600.0
"""The longest a task id of the gateway's stays valid when the downstream gave its task no ``ttlMs``."""

CallTool = Callable[[ServerRequestContext[Any], types.CallToolRequestParams], Awaitable[Any]]


class TaskParams(types.RequestParams):
    task_id: str = Field(alias="taskId")


class UpdateParams(TaskParams):
    input_responses: dict[str, Any] = Field(default_factory=dict, alias="inputResponses")


class Face(Protocol):
    """What these handlers use of the face (front/face.py)."""

    gateway: Gateway

    def context(self, ctx: ServerRequestContext[Any]) -> CallContext: ...
    def view(self, ctx: ServerRequestContext[Any]) -> View | None: ...


def _principal(caller: str | None) -> str | None:
    if caller is None:
        return None
    raw = hashlib.sha256(_PRINCIPAL_LABEL + caller.encode("utf-8", "surrogatepass")).digest()[:16]
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _relayed(answer: dict[str, Any]) -> dict[str, Any]:
    """A downstream's answer as the gateway's: without the downstream's ``serverInfo`` stamp (the SDK stamps the
    gateway's own), every other field as it came."""
    meta = answer.get("_meta")
    if isinstance(meta, dict) and _SERVER_INFO in meta:
        rest = {key: value for key, value in meta.items() if key != _SERVER_INFO}
        answer = {key: value for key, value in answer.items() if key != "_meta"} | ({"_meta": rest} if rest else {})
    return answer


def _unknown(task_id: str) -> MCPError:
    return MCPError(types.INVALID_PARAMS, f"Unknown task: {task_id[:120]}")


class TaskIds:
    """Seals and opens the gateway's task ids (see the module docstring) under the state ``keys`` (the first seals,
    every one opens), each derived for task ids alone."""

    def __init__(self, keys: Sequence[bytes], *, clock: Callable[[], float] = time.time) -> None:
        self._codec = AESGCMRequestStateCodec([_KEY_LABEL + key for key in keys])
        self._clock = clock

    @classmethod
    def of(cls, gateway: Gateway) -> TaskIds:
        """The task ids of ``gateway``, under its ``gateway.continuation`` key (the one replicas share)."""
        settings, audit = gateway.config.gateway.continuation, gateway.config.gateway.audit
        ledger = audit.path if audit.enabled else None
        keys, _ = load_key(settings.key_env, environ(settings.key_env), ledger, file=str(gateway.config.source or ""))
        return cls(keys)

    def seal(self, *, backend: str, task: str, tool: str, caller: str | None, ttl_ms: object) -> str:
        ttl_s = ttl_ms / 1000 if isinstance(ttl_ms, int | float) and not isinstance(ttl_ms, bool) else _LONGEST_S
        claims = {"v": _VERSION, "b": backend, "t": task, "n": tool, "p": _principal(caller)}
        claims["exp"] = self._clock() + min(ttl_s, _LONGEST_S) + 60  # the downstream's own expiry decides first
        return self._codec.seal(json.dumps(claims, separators=(",", ":")).encode())

    def open(self, token: str, caller: str | None) -> tuple[str, str, str]:
        """(backend, the downstream's task id, the published tool) of a token sealed for ``caller``.

        Raises:
            MCPError: -32602 "Unknown task", the answer to an unknown task (the reason goes to the log only).
        """
        try:
            claims = json.loads(self._codec.unseal(token))
        except (InvalidRequestState, ValueError) as exc:
            log.info("task.unknown", reason=f"does not unseal ({type(exc).__name__})")
            raise _unknown(token) from None
        if not isinstance(claims, dict) or claims.get("v") != _VERSION:
            log.info("task.unknown", reason="malformed claims")
            raise _unknown(token)
        backend, task, tool = claims.get("b"), claims.get("t"), claims.get("n")
        if not isinstance(backend, str) or not isinstance(task, str) or not isinstance(tool, str):
            log.info("task.unknown", reason="malformed claims")
            raise _unknown(token)
        if not isinstance(claims.get("exp"), int | float) or not self._clock() < claims["exp"]:
            log.info("task.unknown", reason="expired")
            raise _unknown(token)
        if claims.get("p") != _principal(caller):
            log.info("task.unknown", reason="minted for another caller")
            raise _unknown(token)
        return backend, task, tool


class Tasks:
    """The face's task handlers (see the module docstring)."""

    def __init__(self, face: Face) -> None:
        self.face = face
        gateway = face.gateway
        self.ids = TaskIds.of(gateway)
        self.relay = TaskRelay(gateway.router)

    def register(self, server: Server[Any]) -> None:
        server.add_request_handler("tasks/get", TaskParams, self.get)
        server.add_request_handler("tasks/update", UpdateParams, self.update)
        server.add_request_handler("tasks/cancel", TaskParams, self.cancel)

    def calls(self, call_tool: CallTool) -> CallTool:
        """``call_tool``, whose call a backend may answer with a task: that task, as one of the gateway's."""

        async def calling(ctx: ServerRequestContext[Any], params: types.CallToolRequestParams) -> Any:
            try:
                return await call_tool(ctx, params)
            except TaskCreated as created:
                answer = _relayed(dict(created.result))
                caller = self.face.context(ctx).caller.name
                answer["taskId"] = self.ids.seal(
                    backend=created.backend,
                    task=str(answer.get("taskId")),
                    tool=created.published or params.name,
                    caller=caller,
                    ttl_ms=answer.get("ttlMs"),
                )
                return answer

        return calling

    async def get(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        return await self._ask(ctx, "tasks/get", params, {})

    async def update(self, ctx: ServerRequestContext[Any], params: UpdateParams) -> dict[str, Any]:
        return await self._ask(ctx, "tasks/update", params, {"inputResponses": params.input_responses})

    async def cancel(self, ctx: ServerRequestContext[Any], params: TaskParams) -> dict[str, Any]:
        return await self._ask(ctx, "tasks/cancel", params, {})

    async def _ask(
        self, ctx: ServerRequestContext[Any], method: str, params: TaskParams, more: dict[str, Any]
    ) -> dict[str, Any]:
        caps = ctx.session.client_capabilities
        if caps is None or not caps.extensions or TASKS not in caps.extensions:
            data: dict[str, Any] = {"requiredCapabilities": {"extensions": {TASKS: {}}}}
            raise MCPError(
                types.MISSING_REQUIRED_CLIENT_CAPABILITY, f"Client did not declare the {TASKS} extension", data
            )
        headers = getattr(ctx.request, "headers", None)  # a Starlette request on HTTP, none on stdio
        if headers is not None and headers.get("mcp-name", "").strip() != params.task_id:
            raise MCPError(types.HEADER_MISMATCH, "Mcp-Name header does not match the request's taskId")
        call = self.face.context(ctx)
        backend, task, tool = self.ids.open(params.task_id, call.caller.name)
        gateway = self.face.gateway
        if backend not in gateway.backends:
            log.info("task.unknown", reason="the backend that runs it is no longer configured", backend=backend)
            raise _unknown(params.task_id)
        await gateway.router.wait_started(method, tool, ctx=call)  # as a call waits for a backend still starting
        seen = self.face.view(ctx)  # the caller's policy now, which the router holds the task's tool to
        call = dataclasses.replace(call, visible=seen.tools) if seen is not None else call
        try:
            answer = await self.relay.ask(
                method, {"taskId": task, **more}, backend=backend, tool=tool, task=params.task_id, ctx=call
            )
        except ToolNotFound:
            log.info("task.unknown", reason="its tool is not in the caller's policy")
            raise _unknown(params.task_id) from None
        except Unanswered as exc:
            failure = exc.failures[-1] if exc.failures else None
            if failure is None or (isinstance(failure, BackendRpcError) and failure.code == types.INVALID_PARAMS):
                raise _unknown(params.task_id) from None  # the downstream's words would name its own id
            raise refusal(exc, None) from None
        answer = _relayed(answer)
        if "taskId" in answer:
            answer["taskId"] = params.task_id
        return answer
