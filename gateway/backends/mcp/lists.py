"""The downstream's lists (tools, resources, resource templates, prompts): read whole, and heard of when they change.

``list_each`` reads every page of the lists named (none of a capability the downstream does not offer; a server that
hands out the same cursor again stops there), and stops with ``ListTooLarge`` at the first page past the server's
``max_tools`` or, for any one list, its ``max_list_bytes`` (the items as JSON): a server listing 30,000 tools must not
take the gateway's memory and every caller's time. ``changed_lists`` names the lists a handshake-era ``list_changed``
notification is about. A stateless-era (2026-07-28) downstream announces its changes only on a ``subscriptions/listen``
stream: ``hold_listen`` keeps one open for the lists its discover answer says it announces and the resources its
clients subscribed to (``Watch``; re-opened when they change), calling ``relist`` when the stream opens (the spec
replays nothing) and leaving each event to the session's message handler (the SDK tees listen frames to it); a
stream that breaks or is refused is reopened with backoff (``LISTEN_BACKOFF_S``), which starts again from its first
step after a stream that stayed up ``min_uptime_s``. The backend's health stays its discover check: a lost stream
never fails the backend. ``listed_ttl_ms`` is the shortest ``ttlMs`` (SEP-2549) the pages of a session's last listing
of a kind carried, which bounds the gateway's own for the merged list.
"""

from __future__ import annotations

import weakref
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import anyio
import mcp_types as types
import structlog
from mcp.client.session import ClientSession
from mcp.client.subscriptions import ListenNotSupportedError, listen
from mcp.shared.exceptions import MCPError
from mcp.shared.message import SessionMessage
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from gateway.backends.backoff import backoff
from gateway.backends.mcp.failures import FOREIGN, Life, ListTooLarge
from gateway.config import ServerConfig

__all__ = [
    "LISTEN_BACKOFF_S",
    "LIST_KINDS",
    "LIST_TOO_LARGE",
    "OVER_LIMIT_RETRY_S",
    "Watch",
    "changed_lists",
    "hold_listen",
    "list_each",
    "listed_ttl_ms",
    "relist",
    "screen_lists",
]

log = structlog.get_logger("gateway.backend")

LIST_KINDS = ("tools", "resources", "resource_templates", "prompts")
LISTEN_BACKOFF_S = (0.5, 30.0)
"""A lost listen stream is reopened after 0.5 s, then twice as long each time it is lost again, at most 30 s."""

LIST_TOO_LARGE = -32051
"""The code of the gateway's own error that stands in for a list page over the server's ``max_tools``
(``screen_lists``); never a downstream's."""
OVER_LIMIT_RETRY_S = 300.0
"""How long a server over its list limits waits before it is asked again (its lists may shrink; a reload that raises
the limit applies at once)."""

Relist = Callable[[Sequence[str]], Awaitable[None]]
"""Re-read the lists named and tell the listeners."""

_TTLS: weakref.WeakKeyDictionary[ClientSession, dict[str, int]] = weakref.WeakKeyDictionary()
"""Per session, per kind: the shortest ``ttlMs`` its last listing's pages carried (a kind absent: none did)."""


def listed_ttl_ms(session: ClientSession | None, kind: str) -> int | None:
    """The shortest ``ttlMs`` the pages of ``session``'s last listing of ``kind`` carried; None when none did."""
    return _TTLS.get(session, {}).get(kind) if session is not None else None


def _note_ttl(session: ClientSession, kind: str, ttl_ms: int | None) -> None:
    kept = _TTLS.setdefault(session, {})
    if ttl_ms is None:
        kept.pop(kind, None)
    else:
        kept[kind] = ttl_ms


class _ListenLost(Exception):
    """A ``subscriptions/listen`` stream ended before ``min_uptime_s`` (it is reopened with backoff)."""


async def list_each(
    session: ClientSession, kinds: Sequence[str], caps: types.ServerCapabilities | None, config: ServerConfig
) -> dict[str, tuple[Any, ...]]:
    """Every page of each list in ``kinds``, by kind (an empty one when ``caps`` does not offer it).

    Raises:
        ListTooLarge: a list is over the server's ``max_tools`` or ``max_list_bytes``.
    """
    try:
        return {kind: await _list(session, kind, caps, config) for kind in kinds}
    except MCPError as exc:
        if exc.error.code == LIST_TOO_LARGE:  # screen_lists' stand-in for a page over the limit
            raise ListTooLarge(exc.error.message) from None
        raise


def changed_lists(message: object) -> tuple[str, ...]:
    """The lists a ``list_changed`` notification says changed (none for any other message)."""
    if isinstance(message, types.ToolListChangedNotification):
        return ("tools",)
    if isinstance(message, types.ResourceListChangedNotification):
        return ("resources", "resource_templates")
    if isinstance(message, types.PromptListChangedNotification):
        return ("prompts",)
    return ()


def _too_many(config: ServerConfig) -> str:
    return f"the server lists more than {config.max_tools:,} tools (max_tools): it is not served"


def screen_lists(config: ServerConfig) -> Callable[[Any], Any]:
    """A filter of the session's incoming messages: a tools list page longer than ``max_tools`` is replaced by the
    gateway's own ``LIST_TOO_LARGE`` error before the SDK validates it (30,000 tools cost about a second of the event
    loop and their models' memory), so only its JSON was ever held."""

    def screen(item: Any) -> Any:
        message = getattr(item, "message", None)
        if isinstance(message, types.JSONRPCResponse) and isinstance(message.result, dict):
            tools = message.result.get("tools")
            if isinstance(tools, list) and len(tools) > config.max_tools:
                error = types.ErrorData(code=LIST_TOO_LARGE, message=_too_many(config))
                return SessionMessage(types.JSONRPCError(jsonrpc="2.0", id=message.id, error=error), item.metadata)
        return item

    return screen


def _check_size(kind: str, items: Sequence[Any], page: Sequence[Any], size: int, config: ServerConfig) -> int:
    """The list's size in bytes with ``page`` (the last page of ``items``) counted in; raises ``ListTooLarge``."""
    if kind == "tools" and len(items) > config.max_tools:
        raise ListTooLarge(f"the server lists more than {config.max_tools:,} tools (max_tools): it is not served")
    size += sum(len(item.model_dump_json(by_alias=True, exclude_none=True)) for item in page)
    if size > config.max_list_bytes:
        name = kind.replace("_", " ")
        raise ListTooLarge(
            f"the server's {name} list is over {config.max_list_bytes:,} bytes (max_list_bytes) after "
            f"{len(items):,} entries: it is not served"
        )
    return size


async def _list(
    session: ClientSession, kind: str, caps: types.ServerCapabilities | None, config: ServerConfig
) -> tuple[Any, ...]:
    offered = {
        "tools": caps is None or caps.tools is not None,
        "resources": caps is not None and caps.resources is not None,
        "resource_templates": caps is not None and caps.resources is not None,
        "prompts": caps is not None and caps.prompts is not None,
    }[kind]
    if not offered:
        return ()
    items: list[Any] = []
    cursor: str | None = None
    seen: set[str] = set()
    size = 0
    ttls: list[int] = []
    while True:
        before = len(items)
        params = types.PaginatedRequestParams(cursor=cursor) if cursor else None
        page: Any
        if kind == "tools":
            page = tools = await session.list_tools(params=params)
            items.extend(tools.tools)
            cursor = tools.next_cursor
        elif kind == "resources":
            page = resources = await session.send_request(
                types.ListResourcesRequest(params=params), types.ListResourcesResult
            )
            items.extend(resources.resources)
            cursor = resources.next_cursor
        elif kind == "resource_templates":
            try:
                templates = await session.send_request(
                    types.ListResourceTemplatesRequest(params=params), types.ListResourceTemplatesResult
                )
            except MCPError as exc:
                if exc.error.code != types.METHOD_NOT_FOUND:
                    raise
                # Resources without templates: an SDK server lacking the handler answers "Method not found"
                # (over stateless HTTP, with a 404) though it declared ``resources``; it has no templates.
                return tuple(items)
            page = templates
            items.extend(templates.resource_templates)
            cursor = templates.next_cursor
        else:
            page = prompts = await session.send_request(
                types.ListPromptsRequest(params=params), types.ListPromptsResult
            )
            items.extend(prompts.prompts)
            cursor = prompts.next_cursor
        if "ttl_ms" in page.model_fields_set:  # a page without one reads as 0: only one the server sent counts
            ttls.append(max(0, page.ttl_ms))
        size = _check_size(kind, items, items[before:], size, config)
        if not cursor or cursor in seen:  # a server that hands out the same cursor again would loop forever
            _note_ttl(session, kind, min(ttls, default=None))
            return tuple(items)
        seen.add(cursor)


@dataclass(frozen=True)
class _Announced:
    """The list changes a stateless-era downstream's discover answer says it announces."""

    tools: bool
    prompts: bool
    resources: bool

    @classmethod
    def by(cls, caps: types.ServerCapabilities | None) -> _Announced:
        return cls(
            tools=caps is not None and caps.tools is not None and bool(caps.tools.list_changed),
            prompts=caps is not None and caps.prompts is not None and bool(caps.prompts.list_changed),
            resources=caps is not None and caps.resources is not None and bool(caps.resources.list_changed),
        )

    @property
    def kinds(self) -> list[str]:
        kinds = [*(("tools",) if self.tools else ()), *(("prompts",) if self.prompts else ())]
        return kinds + (["resources", "resource_templates"] if self.resources else [])


class Watch(Protocol):
    """The resources a listen stream carries besides the list changes (held.py ``Held``, for a stateless-era
    downstream whose clients subscribed to some)."""

    def take(self) -> tuple[int, tuple[str, ...]]: ...
    async def wait_changed(self) -> None: ...
    def acknowledged(self, generation: int, honoured: Sequence[str]) -> None: ...


async def hold_listen(
    session: ClientSession,
    caps: types.ServerCapabilities | None,
    watch: Watch,
    *,
    backend: str,
    config: ServerConfig,
    relist: Relist,
) -> None:
    """Hold one ``subscriptions/listen`` stream to a stateless-era downstream until cancelled, for the list changes
    ``caps`` says it announces and the resources ``watch`` names (none of either: no stream, until ``watch``
    changes); returns when the downstream refuses the listen method."""
    announced = _Announced.by(caps)

    def lost(state: RetryCallState) -> None:
        error = state.outcome.exception() if state.outcome is not None else None
        wait = round(state.upcoming_sleep, 1)
        log.info("backend.listen_lost", backend=backend, error=str(error), retry_in_s=wait)

    while True:  # one backoff per run of short-lived streams
        retrying = AsyncRetrying(
            retry=retry_if_exception_type(_ListenLost),
            wait=backoff(*LISTEN_BACKOFF_S),
            sleep=anyio.sleep,
            before_sleep=lost,
            reraise=True,
        )
        try:
            async for attempt in retrying:
                with attempt:
                    await _listen_once(session, announced, watch, backend=backend, config=config, relist=relist)
        except ListenNotSupportedError as exc:
            log.warning("backend.listen_unavailable", backend=backend, error=str(exc))
            return


async def _listen_once(
    session: ClientSession,
    announced: _Announced,
    watch: Watch,
    *,
    backend: str,
    config: ServerConfig,
    relist: Relist,
) -> None:
    """One ``subscriptions/listen`` stream, until it ends or the resources watched change. Returns when it stayed
    up ``min_uptime_s`` or was re-opened for a change (it is reopened at once); raises ``_ListenLost`` when it ended
    sooner, or was refused, or never acknowledged."""
    generation, uris = watch.take()
    if not announced.kinds and not uris:
        await watch.wait_changed()
        return
    opened_at = anyio.current_time()
    error = "the server closed it"
    changed = False
    with anyio.CancelScope() as ack_scope:
        ack_scope.deadline = opened_at + config.connect_timeout_s  # bounds the wait for the ack only
        try:
            async with listen(
                session,
                tools_list_changed=announced.tools,
                prompts_list_changed=announced.prompts,
                resources_list_changed=announced.resources,
                resource_subscriptions=uris,
            ) as subscription:
                ack_scope.deadline = float("inf")
                honoured = subscription.honored.resource_subscriptions if subscription.honored is not None else None
                watch.acknowledged(generation, honoured or ())
                log.debug("backend.listen_open", backend=backend, lists=announced.kinds, resources=len(uris))
                if announced.kinds:
                    await relist(announced.kinds)
                async with anyio.create_task_group() as tg:

                    async def until_changed() -> None:
                        nonlocal changed
                        await watch.wait_changed()
                        changed = True
                        tg.cancel_scope.cancel()

                    tg.start_soon(until_changed)
                    async for _event in subscription:  # drains the backlog; the message handler has re-listed
                        pass
                    tg.cancel_scope.cancel()
        except ListenNotSupportedError:
            raise  # a RuntimeError, but not a lost stream: the loop stops
        except FOREIGN as exc:
            error = str(exc) or type(exc).__name__
    if changed:
        return
    if ack_scope.cancelled_caught:
        error = f"no acknowledgment within connect_timeout_s of {config.connect_timeout_s:g} s"
    if anyio.current_time() - opened_at < config.min_uptime_s:
        raise _ListenLost(error)
    log.info("backend.listen_lost", backend=backend, error=error, retry_in_s=0)


async def relist(
    session: ClientSession,
    kinds: Sequence[str],
    capabilities: types.ServerCapabilities | None,
    config: ServerConfig,
    *,
    backend: str,
    life: Life,
) -> dict[str, tuple[Any, ...]] | None:
    """The lists ``kinds`` read again after a ``list_changed``; None when they could not be (logged), or when one
    has grown past the server's limits (``life`` is then marked lost, saying so: the backend reconnects)."""
    try:
        with anyio.fail_after(config.connect_timeout_s):
            return await list_each(session, kinds, capabilities, config)
    except ListTooLarge as exc:
        life.mark_lost(str(exc))
    except FOREIGN as exc:
        log.warning("backend.relist_failed", backend=backend, lists=list(kinds), error=str(exc))
    return None
