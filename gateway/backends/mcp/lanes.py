"""A downstream server's sessions beside its shared session: one client's, one caller's, or its handshake era's.

With ``session: per_client``, a client that can answer a downstream's requests (sampling, elicitation, roots) gets a
session of its own (``Lanes.for_client``), offering the downstream what that client offers; it opens at the
client's first call, in a task of its own, and closes with the client's connection. Its log messages go to the
notification hook with that client, and the client's ``roots_changed`` is told to it. A client that cannot answer
shares the backend's session; a client whose own session could not be opened gets ``BackendUnavailable`` saying why
(on the shared session its downstream's requests could reach another client, or nobody), and its next call tries
again.

With ``${caller.secret:NAME}`` in a server's headers, or ``token_exchange``, each caller gets a session carrying its
own credentials (``Lanes.for_caller``; auth/credentials.py), opened on its first request and kept while it stays up
and its credentials hold (an exchanged token's lifetime); past ``MAX_CALLER_SESSIONS`` a new caller's session closes
the least recently used idle one. A caller's session that says its tools changed is listed again (``list_caller``).
A caller that cannot have one gets ``BackendUnavailable`` saying why (never a header value).

A dual-era server's one handshake-era session beside its stateless shared session (``Lanes.for_handshake``) is
opened when the first handshake-era client needs it and shared by all of them (twin.py decides when).

Each session is owned by its own task in the task group of ``Lanes.running``; each keeps its own ``InFlight``
(relay.py), so a downstream's request on it reaches the client it belongs to.
"""

from __future__ import annotations

import contextvars
import functools
import math
import tempfile
import weakref
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Iterator, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, contextmanager
from dataclasses import dataclass, field
from typing import IO, Any, Protocol

import anyio
import anyio.abc
import mcp_types as types
import structlog
from mcp.client.session import ClientSession, MessageHandlerFnT

from gateway.auth.credentials import NoCredential, SessionCredentials
from gateway.backends.mcp.failures import FOREIGN, Life, ListTooLarge, ResponseRecorder, classify_failure
from gateway.backends.mcp.lists import changed_lists
from gateway.backends.mcp.relay import InFlight, attribute
from gateway.backends.mcp.stdio import stderr_tail
from gateway.calls import ClientLink, Upstream
from gateway.config import ServerConfig
from gateway.errors import BackendUnavailable, CredentialMissing

__all__ = ["MAX_CALLER_SESSIONS", "Connect", "Lane", "LaneNotify", "Lanes"]

log = structlog.get_logger("gateway.backend")

MAX_CALLER_SESSIONS = 64
"""Per-caller sessions one server keeps open (``${caller.secret:...}`` headers); past it, a new caller's session
closes the least recently used idle one (that caller's next request opens it again)."""

LaneNotify = Callable[[types.ServerNotification, Upstream | None, ClientLink], Awaitable[None]]
"""Told of a log message on a client's own session: ``(notification, the client request it belongs to or None,
the client)``."""
Handshake = Callable[[ClientSession], Awaitable[types.InitializeResult]]


class Connect(Protocol):
    """Open a session to the server over a transport of its own (the backend's ``_connect``)."""

    def __call__(
        self,
        life: Life,
        recorder: ResponseRecorder,
        stderr: IO[bytes],
        *,
        inflight: InFlight,
        offered: types.ClientCapabilities | None = None,
        headers: Mapping[str, str] | None = None,
        message_handler: MessageHandlerFnT | None = None,
        twin: bool = False,
    ) -> AbstractAsyncContextManager[ClientSession]: ...


@dataclass(eq=False)
class Lane:
    """A downstream session of one upstream client or one caller, owned by its own task."""

    owner: Any  # the client (ClientLink) of a per-client session; the caller's name for a per-caller one
    inflight: InFlight
    ready: anyio.Event = field(default_factory=anyio.Event)
    life: Life = field(default_factory=Life)
    session: ClientSession | None = None
    failure: str | None = None
    no_credential: bool = False
    link: str | None = None  # where the caller signs in, when that is what it lacks
    recorder: ResponseRecorder | None = None  # its HTTP error answers, once open

    @property
    def closed(self) -> anyio.Event:
        return self.life.lost


class Lanes:
    """The per-client and per-caller sessions of one downstream server."""

    def __init__(
        self,
        backend: str,
        config: ServerConfig,
        credentials: SessionCredentials | None,
        *,
        connect: Connect,
        handshake: Handshake,
        notify: LaneNotify | None,
    ) -> None:
        self._name = backend
        self._config = config
        self._credentials = credentials
        self._connect = connect
        self._handshake = handshake
        self._notify = notify
        self._clients: weakref.WeakKeyDictionary[Any, Lane] = weakref.WeakKeyDictionary()
        self._callers: dict[str, Lane] = {}
        self._handshake_lane: Lane | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self.list_caller: Callable[[str, ClientSession], Awaitable[None]] | None = None
        """Lists what a caller's session offers: once its handshake is done, before any request of the caller's goes
        on it (within the opening's deadline), and again whenever the server says on that session that its tools
        changed: an OAuth server's per-caller tool lists (oauth_backend.py)."""

    @asynccontextmanager
    async def running(self) -> AsyncIterator[None]:
        """The task group the sessions' tasks run in: they can be opened inside it, and close when it ends."""
        async with anyio.create_task_group() as tg:
            self._tg = tg
            try:
                yield
            finally:
                self._tg = None

    # -- per client -------------------------------------------------------------------------------------------------

    async def for_client(self, upstream: Upstream) -> Lane | None:
        """The client's own downstream session, opened on its first call; None for a client that cannot answer a
        downstream's requests (it shares the one session).

        Raises:
            BackendUnavailable: the client's session could not be opened (the reason says why).
        """
        client = upstream.channel.client if upstream.channel is not None else None
        if client is None or not _takes_back_channel(client.capabilities):
            return None
        lane = self._clients.get(client)
        if lane is None:
            lane = Lane(client, InFlight(owner=client))
            self._start(self._client_lifetime, lane)
            self._clients[client] = lane
            client.on_close(lane.closed.set)
        return await self._opened(lane, "this client")

    def _start(self, lifetime: Callable[..., Coroutine[Any, Any, None]], lane: Lane, *args: Any) -> None:
        if self._tg is None:
            raise BackendUnavailable(self._name, "not running")
        # A fresh context: the lane's task must not see this request as the one it serves (see relay.SERVING).
        contextvars.Context().run(self._tg.start_soon, lifetime, lane, *args)

    async def _opened(self, lane: Lane, whose: str) -> Lane:
        """``lane`` once its session is open: its task sets ``ready`` whatever happens, within the opening's own
        deadline (``_opening``), so this wait has no clock of its own."""
        await lane.ready.wait()
        if lane.session is None:
            reason = lane.failure or "closed"
            log.warning("backend.own_session_failed", backend=self._name, whose=whose, reason=reason)
            if lane.no_credential:  # the caller's to fix, not the server's failure (the breaker ignores it)
                raise CredentialMissing(self._name, f"no session of its own for {whose}: {reason}", link=lane.link)
            raise BackendUnavailable(self._name, f"no session of its own for {whose}: {reason}")
        return lane

    @contextmanager
    def _opening(self, lane: Lane) -> Iterator[_Opening]:
        """Where a lane's session lives: its stderr file, its HTTP responses' record, and a deadline of
        ``connect_timeout_s`` on opening it (transport, process, credentials, handshake) that ``_Opening.opened``
        lifts. Whatever ends it early becomes ``lane.failure`` in plain words (never with a header value): what the
        process said last, a timeout, a missing credential."""
        limit = self._config.connect_timeout_s
        with tempfile.TemporaryFile() as stderr:
            opening = _Opening(stderr, ResponseRecorder(), anyio.CancelScope(deadline=anyio.current_time() + limit))
            try:
                with opening.scope:
                    yield opening
            except NoCredential as exc:
                lane.failure, lane.no_credential, lane.link = str(exc), True, exc.link
            except Exception as exc:
                tail = stderr_tail(stderr)
                lane.failure = classify_failure(exc, config=self._config, http=opening.recorder, stderr_tail=tail)
            if opening.scope.cancelled_caught and lane.failure is None:
                lane.failure = f"it did not open within connect_timeout_s ({limit:g} s)"

    async def _client_lifetime(self, lane: Lane) -> None:
        """Own one client's downstream session until the client's connection closes or the session ends."""
        caps = lane.owner.capabilities or types.ClientCapabilities()
        offered = types.ClientCapabilities(sampling=caps.sampling, elicitation=caps.elicitation, roots=caps.roots)
        try:
            with self._opening(lane) as opening:
                async with self._connect(
                    lane.life,
                    opening.recorder,
                    opening.stderr,
                    inflight=lane.inflight,
                    offered=offered,
                    message_handler=functools.partial(self._on_client_message, lane),
                ) as session:
                    await session.initialize()  # a per-client session is a handshake-era one
                    opening.opened(lane, session)
                    log.info("backend.client_session", backend=self._name, state="open")
                    await lane.closed.wait()
        finally:
            lane.session = None
            lane.ready.set()
            if self._clients.get(lane.owner) is lane:
                del self._clients[lane.owner]
            log.info("backend.client_session", backend=self._name, state="closed", reason=lane.failure)

    async def _on_client_message(self, lane: Lane, message: Any) -> None:
        if isinstance(message, types.LoggingMessageNotification) and self._notify is not None:
            upstream, _ = attribute(lane.inflight)
            await self._notify(message, upstream, lane.owner)

    async def roots_changed(self, client: ClientLink) -> None:
        """``client`` says its roots changed: tell its own session, if it has one."""
        lane = self._clients.get(client)
        if lane is None or lane.session is None:
            return
        try:
            await lane.session.send_notification(types.RootsListChangedNotification())
        except FOREIGN as exc:
            log.debug("backend.roots_changed_failed", backend=self._name, error=str(exc) or type(exc).__name__)

    # -- the handshake session of a dual-era downstream -----------------------------------------------------------

    async def for_handshake(self, inflight: InFlight, on_message: MessageHandlerFnT) -> Lane:
        """The downstream's one handshake-era session beside its stateless shared session, opened on the first
        request of a handshake-era client and shared by all of them (its requests on ``inflight``, its messages to
        ``on_message``); opened again after it was lost. Its ``session`` is None when it could not be opened
        (``failure`` says why)."""
        lane = self._handshake_lane
        if lane is None or (lane.closed.is_set() and lane.ready.is_set()):
            lane = self._handshake_lane = Lane("handshake", inflight)
            self._start(self._handshake_lifetime, lane, on_message)
        await lane.ready.wait()  # set within the opening's deadline, whatever happens (_opening)
        return lane

    async def _handshake_lifetime(self, lane: Lane, on_message: MessageHandlerFnT) -> None:
        try:
            with self._opening(lane) as opening:
                async with self._connect(
                    lane.life,
                    opening.recorder,
                    opening.stderr,
                    inflight=lane.inflight,
                    message_handler=on_message,
                    twin=True,
                ) as session:
                    await session.initialize()
                    opening.opened(lane, session)
                    log.info("backend.handshake_session", backend=self._name, state="open")
                    await lane.closed.wait()
        finally:
            lane.session = None
            lane.life.mark_lost(lane.failure or "closed")
            lane.ready.set()
            log.info("backend.handshake_session", backend=self._name, state="closed", reason=lane.failure)

    # -- per caller -------------------------------------------------------------------------------------------------

    async def for_caller(self, caller: str | None, subject_token: str | None = None) -> Lane:
        """The caller's own session to this server (its headers carry the caller's credentials), opened on its
        first request and kept while it stays up (and its credentials hold).

        Raises:
            BackendUnavailable: the caller has no such secret, or its session could not be opened.
        """
        key = caller or ""
        lane = self._callers.pop(key, None)
        if lane is not None and not lane.closed.is_set():
            self._callers[key] = lane  # the most recently used last
        else:
            idle = [k for k, other in self._callers.items() if not len(other.inflight)]
            if len(self._callers) >= MAX_CALLER_SESSIONS and idle:
                self._callers[idle[0]].life.mark_lost("closed: the least recently used of too many caller sessions")
            lane = Lane(key, InFlight())
            self._start(self._caller_lifetime, lane, subject_token)
            self._callers[key] = lane
        return await self._opened(lane, f"caller {caller or 'anonymous'}")

    def open_caller(self, caller: str) -> None:
        """Start opening ``caller``'s session now, if it has none (its first request will find it)."""
        lane = self._callers.get(caller)
        if self._tg is not None and (lane is None or lane.closed.is_set()):
            lane = self._callers[caller] = Lane(caller, InFlight())
            self._start(self._caller_lifetime, lane, None)

    def take_challenge(self, caller: str) -> str | None:
        """The ``WWW-Authenticate`` of the last 403 ``insufficient_scope`` on ``caller``'s session, taken (once)."""
        lane = self._callers.get(caller)
        recorder = lane.recorder if lane is not None else None
        if recorder is None:
            return None
        challenge, recorder.challenge = recorder.challenge, None
        return challenge

    def close_caller(self, caller: str, reason: str) -> None:
        """End ``caller``'s own session now (its next request opens a new one, with what its credentials are then)."""
        lane = self._callers.get(caller)
        if lane is not None:
            lane.life.mark_lost(reason)

    async def _caller_lifetime(self, lane: Lane, subject_token: str | None) -> None:
        """Own one caller's session to this server until it ends, its exchanged token expires, or the backend
        stops."""
        assert self._credentials is not None
        try:
            with self._opening(lane) as opening:
                headers, lifetime = await self._credentials.for_caller(lane.owner or None, subject_token)
                async with self._connect(
                    lane.life,
                    opening.recorder,
                    opening.stderr,
                    inflight=lane.inflight,
                    headers=headers,
                    message_handler=functools.partial(self._on_caller_message, lane),
                ) as session:
                    await self._handshake(session)
                    if self.list_caller is not None:
                        await self.list_caller(lane.owner, session)
                    opening.opened(lane, session)
                    log.info("backend.caller_session", backend=self._name, caller=lane.owner, state="open")
                    with anyio.move_on_after(lifetime if lifetime is not None else math.inf):
                        await lane.closed.wait()
                    lane.life.mark_lost("the caller's token expired")  # the next request gets a fresh one
        finally:
            lane.session = None
            lane.life.mark_lost(lane.failure or "closed")
            lane.ready.set()
            if self._callers.get(lane.owner) is lane:
                del self._callers[lane.owner]
            log.info("backend.caller_session", backend=self._name, caller=lane.owner, state="closed")

    async def _on_caller_message(self, lane: Lane, message: Any) -> None:
        """The server says on a caller's session that its tools changed: that caller's list is read again, in a task
        of its own (this handler runs in the session's receive loop, which the listing's answer needs)."""
        if self.list_caller is not None and self._tg is not None and "tools" in changed_lists(message):
            self._tg.start_soon(self._relist_caller, lane)

    async def _relist_caller(self, lane: Lane) -> None:
        """``list_caller`` again for ``lane``'s session, bounded; a failure is logged, and a list grown past the
        server's limits ends the session."""
        session = lane.session
        if self.list_caller is None or session is None:
            return
        try:
            with anyio.fail_after(self._config.connect_timeout_s):
                await self.list_caller(lane.owner, session)
        except ListTooLarge as exc:
            lane.life.mark_lost(str(exc))
        except FOREIGN as exc:
            error = str(exc) or type(exc).__name__
            log.warning("backend.relist_failed", backend=self._name, caller=lane.owner, error=error)


@dataclass
class _Opening:
    """A lane's session being opened (``Lanes._opening``)."""

    stderr: IO[bytes]
    recorder: ResponseRecorder
    scope: anyio.CancelScope

    def opened(self, lane: Lane, session: ClientSession) -> None:
        """The session is open: no deadline from now on, and the lane's waiters are let through."""
        self.scope.deadline = math.inf
        lane.session = session
        lane.recorder = self.recorder
        lane.ready.set()


def _takes_back_channel(caps: types.ClientCapabilities | None) -> bool:
    return caps is not None and (caps.sampling is not None or caps.elicitation is not None or caps.roots is not None)
