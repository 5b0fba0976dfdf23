"""Resources, prompts and completion: each request sent to the backend that owns its name (a URI, a prompt's name),
as the caller's policy shows it, bridged or retried across the eras as front/eras.py says. Part of the face
(front/face.py), which registers these handlers.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Protocol

import mcp_types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from gateway.backends.base import Backend, ProgressFn
from gateway.calls import BackChannel, CallContext, Origin, Round
from gateway.core.kept import SCHEME as KEPT
from gateway.core.policies import View
from gateway.core.router import Unanswered
from gateway.core.runtime import Gateway
from gateway.errors import URI_CHARS, BackendRpcError, InputRequired, clip, quote
from gateway.front.bridges import Bridge, may_ask
from gateway.front.channels import forwarded_meta
from gateway.front.clients import Clients
from gateway.front.eras import Eras, ahead
from gateway.front.outbox import Outboxes
from gateway.front.server import refusal

__all__ = ["Named"]

_NOT_FOUND_CODES = frozenset({types.INVALID_PARAMS, -32002})
"""A downstream's "no such resource" (-32002 is the code of the specification before SEP-2164)."""


class Face(Protocol):
    """What these handlers use of the face (front/face.py)."""

    gateway: Gateway
    eras: Eras
    outboxes: Outboxes
    clients: Clients

    def view(self, ctx: ServerRequestContext[Any]) -> View | None: ...
    def context(self, ctx: ServerRequestContext[Any]) -> CallContext: ...
    def channel(self, ctx: ServerRequestContext[Any]) -> BackChannel: ...
    def envelope(self, ctx: ServerRequestContext[Any], listed: Mapping[str, Any], kind: str) -> Mapping[str, Any]: ...


class Named:
    """The face's handlers of requests that name a resource, a prompt or a completion's reference."""

    def __init__(self, face: Face) -> None:
        self.face = face
        self.gateway = face.gateway

    async def forward(
        self,
        method: str,
        name: str,
        origins: tuple[Origin, ...],
        build: Callable[[Origin], Any],
        result_type: Any,
        call: CallContext,
        progress: ProgressFn | None,
        *,
        none_answered: MCPError | None = None,
        arguments: Mapping[str, Any] | None = None,
    ) -> tuple[Origin, Any]:
        """Send the request through the router to the first of ``origins`` that answers. A lone backend's error
        passes through as it is; when several refused, ``none_answered`` is the answer (else the first error)."""

        async def send(backend: Backend, origin: Origin) -> Any:
            return await backend.request(build(origin), result_type, progress=progress, upstream=call.upstream)

        try:
            return await self.gateway.router.request(method, name, origins, send, arguments=arguments, ctx=call)
        except Unanswered as exc:
            raise refusal(exc, none_answered) from exc.failures[0] if exc.failures else None

    def visible_origins(self, ctx: ServerRequestContext[Any], uri: str) -> tuple[Origin, ...]:
        """The backends that may serve ``uri`` to this caller (none: answered as a resource that does not exist)."""
        origins = self.gateway.catalog.lists.resolve(uri)
        seen = self.face.view(ctx)
        return seen.origins(uri, origins) if seen is not None else origins

    def visible_prompt(self, ctx: ServerRequestContext[Any], name: str) -> Origin | None:
        seen = self.face.view(ctx)
        if seen is not None and name not in seen.prompts:
            return None  # answered as an unknown prompt
        return self.gateway.catalog.lists.prompt(name)

    async def list_resources(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        await self.gateway.wait_started()
        seen = self.face.view(ctx)
        listed = seen.resources_result if seen is not None else self.gateway.catalog.lists.resources_result
        kept = self.gateway.answers.resources(self.face.context(ctx))  # the caller's own cut answers (core/answers.py)
        return self.face.envelope(
            ctx, {**listed, "resources": [*listed["resources"], *kept]} if kept else listed, "resources"
        )

    async def list_resource_templates(
        self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None
    ) -> Any:
        await self.gateway.wait_started()
        seen = self.face.view(ctx)
        lists = self.gateway.catalog.lists
        templates = seen.templates_result if seen is not None else lists.templates_result
        return self.face.envelope(ctx, templates, "resource_templates")

    async def read_resource(self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams) -> Any:
        call = self.face.context(ctx)
        if params.uri.startswith(KEPT):  # the rest of a cut answer (core/answers.py): its caller's, and nobody else's
            found = self.gateway.answers.resource(call, params.uri)
            if found is None:
                raise MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": clip(params.uri, URI_CHARS)})
            return found
        await self.gateway.router.wait_started("resources/read", params.uri, ctx=call)
        return await self._bridged(ctx, "resources/read", params.uri, None, params, call, self._read)

    async def _read(
        self, ctx: ServerRequestContext[Any], params: types.ReadResourceRequestParams, call: CallContext
    ) -> Any:
        caller = call.caller.name
        meta = forwarded_meta(params.meta)
        if params.request_state is not None:  # a later round: to the backend that asked, whatever the lists say
            found = self.face.eras.reopen("resources/read", params.uri, None, caller, params.request_state)
            origins: tuple[Origin, ...] = (Origin(found.backend, found.local),)
            retry: Round | None = Round(params.input_responses, found.state)
        else:
            origins = self.visible_origins(ctx, params.uri)
            retry = ahead(params.input_responses)

        async def again(origin: Origin, retry: Round) -> Any:
            return await self._read_from(ctx, params, (origin,), meta, call.for_round(retry))

        not_found = MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": clip(params.uri, URI_CHARS)})
        try:
            if not origins:
                raise not_found
            try:
                return await self._read_from(ctx, params, origins, meta, call.for_round(retry))
            except MCPError as exc:
                if exc.error.code in _NOT_FOUND_CODES and self.face.view(ctx) is not None:
                    raise not_found from None  # with policies, a downstream's own "not found" is told as a hidden one
                raise
        except InputRequired as exc:
            return await self.face.eras.asked(ctx, "resources/read", params.uri, None, caller, exc, again)

    async def _read_from(
        self,
        ctx: ServerRequestContext[Any],
        params: types.ReadResourceRequestParams,
        origins: tuple[Origin, ...],
        meta: Any,
        call: CallContext,
    ) -> Any:
        def build(origin: Origin) -> types.ReadResourceRequest:
            update = {"uri": origin.local, "meta": meta, "input_responses": None, "request_state": None}
            return types.ReadResourceRequest(params=params.model_copy(update=update))

        # An unlisted URI may be asked of several backends; when none has it, the answer is SEP-2164's.
        not_found = MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": clip(params.uri, URI_CHARS)})
        progress = self.face.outboxes.progress(ctx)
        origin, result = await self.forward(
            "resources/read", params.uri, origins, build, types.ReadResourceResult, call, progress,
            none_answered=not_found,
        )  # fmt: skip
        if origin.local != params.uri:  # published under a prefix: the contents name the URI the client asked for
            for contents in result.contents:
                if contents.uri == origin.local:
                    contents.uri = params.uri
        return result

    async def subscribe(
        self, ctx: ServerRequestContext[Any], params: types.SubscribeRequestParams
    ) -> types.EmptyResult:
        call = self.face.context(ctx)
        await self.gateway.router.wait_started("resources/subscribe", params.uri, ctx=call)

        async def send(backend: Backend, origin: Origin) -> None:
            await self.face.clients.subscribe(ctx, params.uri, origin, backend)

        origins = self.visible_origins(ctx, params.uri)
        try:
            await self.gateway.router.request("resources/subscribe", params.uri, origins, send, ctx=call)
        except Unanswered as exc:
            failure = exc.failures[-1] if exc.failures else None
            if isinstance(failure, BackendRpcError):
                raise MCPError(failure.code, failure.message, failure.data) from failure
            raise MCPError(types.INVALID_PARAMS, "Resource not found", {"uri": clip(params.uri, URI_CHARS)}) from None
        return types.EmptyResult()

    async def unsubscribe(
        self, ctx: ServerRequestContext[Any], params: types.UnsubscribeRequestParams
    ) -> types.EmptyResult:
        origin = self.face.clients.forget(ctx, params.uri)
        if origin is not None:

            async def send(backend: Backend, origin: Origin) -> None:
                await backend.unsubscribe_resource(origin.local)

            try:
                await self.gateway.router.request(
                    "resources/unsubscribe", params.uri, (origin,), send, ctx=self.face.context(ctx)
                )
            except Unanswered:
                pass  # the backend is gone (or no session): nothing downstream holds the subscription any more
        return types.EmptyResult()

    async def list_prompts(self, ctx: ServerRequestContext[Any], params: types.PaginatedRequestParams | None) -> Any:
        await self.gateway.wait_started()
        seen = self.face.view(ctx)
        prompts = seen.prompts_result if seen is not None else self.gateway.catalog.lists.prompts_result
        return self.face.envelope(ctx, prompts, "prompts")

    async def get_prompt(self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams) -> Any:
        call = self.face.context(ctx)
        await self.gateway.router.wait_started("prompts/get", params.name, arguments=params.arguments, ctx=call)
        return await self._bridged(ctx, "prompts/get", params.name, params.arguments, params, call, self._prompt)

    async def _prompt(
        self, ctx: ServerRequestContext[Any], params: types.GetPromptRequestParams, call: CallContext
    ) -> Any:
        caller = call.caller.name
        origin: Origin | None
        retry: Round | None
        if params.request_state is not None:  # a later round: to the backend that asked, whatever the lists say
            found = self.face.eras.reopen("prompts/get", params.name, params.arguments, caller, params.request_state)
            origin, retry = Origin(found.backend, found.local), Round(params.input_responses, found.state)
        else:
            origin, retry = self.visible_prompt(ctx, params.name), ahead(params.input_responses)
        if origin is None:
            raise MCPError(types.INVALID_PARAMS, f"Unknown prompt: {quote(params.name)}")
        meta = forwarded_meta(params.meta)

        def build(origin: Origin) -> types.GetPromptRequest:
            update = {"name": origin.local, "meta": meta, "input_responses": None, "request_state": None}
            return types.GetPromptRequest(params=params.model_copy(update=update))

        async def send_to(origin: Origin, again: Round | None) -> Any:
            found = await self.forward(
                "prompts/get", params.name, (origin,), build, types.GetPromptResult, call.for_round(again),
                self.face.outboxes.progress(ctx), arguments=params.arguments,
            )  # fmt: skip
            return found[1]

        try:
            return await send_to(origin, retry)
        except InputRequired as exc:
            return await self.face.eras.asked(ctx, "prompts/get", params.name, params.arguments, caller, exc, send_to)

    async def _bridged(
        self,
        ctx: ServerRequestContext[Any],
        method: str,
        name: str,
        arguments: Mapping[str, Any] | None,
        params: types.GetPromptRequestParams | types.ReadResourceRequestParams,
        call: CallContext,
        serve: Callable[[ServerRequestContext[Any], Any, CallContext], Any],
    ) -> Any:
        """A ``prompts/get`` or ``resources/read`` served by ``serve``: a stateless client's bridged (with the bridge as
        its back-channel) when a handshake-era backend serves it or its state names a waiting request."""
        if ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS:
            return await serve(ctx, params, call)
        bridges, caller = self.face.eras.bridges, call.caller.name
        bridge: Bridge | None
        if params.request_state is None:
            lists = self.gateway.catalog.lists
            origins = (lists.prompt(name),) if method == "prompts/get" else lists.resolve(name)
            if not may_ask(self.gateway.backends, [o.backend for o in origins if o is not None]):
                return await serve(ctx, params, call)
            plain = params.model_copy(update={"input_responses": None})
            retry = ahead(params.input_responses)

            async def work(channel: Bridge) -> Any:
                return await serve(ctx, plain, call.for_round(retry, channel))

            bridge = bridges.start(call.upstream.channel or self.face.channel(ctx), caller, work)
        else:
            found = self.face.eras.opened(method, name, arguments, caller, params.request_state)
            bridge = bridges.reopened(found, method, caller, params.input_responses)
            if bridge is None:
                return await serve(ctx, params, call)
        return await bridges.next(
            ctx.session.client_capabilities, bridge, method=method, name=name, arguments=arguments, caller=caller
        )

    async def complete(self, ctx: ServerRequestContext[Any], params: types.CompleteRequestParams) -> Any:
        ref = params.ref
        name = ref.name if isinstance(ref, types.PromptReference) else ref.uri
        call = self.face.context(ctx)
        await self.gateway.router.wait_started("completion/complete", name, ctx=call)
        lists = self.gateway.catalog.lists
        origin: Origin | None
        if isinstance(ref, types.PromptReference):
            origin = self.visible_prompt(ctx, ref.name)
        else:
            origin = lists.template(ref.uri) or next(iter(lists.resolve(ref.uri)), None)
            seen = self.face.view(ctx)
            if origin is not None and seen is not None and not seen.origins(ref.uri, (origin,)):
                origin = None
        if origin is None:
            raise MCPError(types.INVALID_PARAMS, "No backend offers this prompt or resource.")
        meta = forwarded_meta(params.meta)

        def build(origin: Origin) -> types.CompleteRequest:
            local_ref = ref.model_copy(
                update={"name": origin.local} if isinstance(ref, types.PromptReference) else {"uri": origin.local}
            )
            return types.CompleteRequest(params=params.model_copy(update={"ref": local_ref, "meta": meta}))

        found = await self.forward(
            "completion/complete", name, (origin,), build, types.CompleteResult, call, self.face.outboxes.progress(ctx)
        )
        return found[1]
