"""What replicas share through Redis (``gateway.shared.redis_url``): per-caller request rates (``SharedRates``), so N
replicas enforce one limit, and the ends of sessions (``SharedSessionEnds``), so a DELETE on one replica ends the
session on all of them. One ``SharedRedis`` holds the client for both and bounds every round trip; while Redis cannot
answer, both answer None and ``gateway.shared.redis_down`` decides: ``open`` serves the request (its rate counted per
replica), ``closed`` refuses it with HTTP 503. The URL, which may hold a password, is never logged.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import anyio
import structlog

from gateway.config import PolicyLimits, SharedSettings

__all__ = [
    "FAILURE_REASONS",
    "PROBE_S",
    "RETRY_S",
    "SharedRates",
    "SharedRedis",
    "SharedSessionEnds",
    "failure_reason",
]

log = structlog.get_logger("gateway.shared_limits")

RETRY_S = 1.0
"""After Redis failed to answer, how long requests do not ask it (each would otherwise wait the timeout)."""
PROBE_S = 5.0
"""How often Redis is pinged while it answers (a PING costs it microseconds; an outage is seen within this)."""
FAILURE_REASONS = ("timeout", "connection", "auth", "response", "other")
"""What a failed round trip is counted as: no answer in time; no connection (refused, reset, closed, loading);
the password or the user refused; Redis answered an error (out of memory, read-only replica, script error) or
something that is not a number; anything else."""
_PREFIX = "mcp-gateway:rate:"
_ENDED = "mcp-gateway:session-ended:"
T = TypeVar("T")

_TAKE = """
local rate = tonumber(ARGV[1])
local burst = tonumber(ARGV[2])
local t = redis.call('TIME')
local now = tonumber(t[1]) + tonumber(t[2]) / 1000000
local held = redis.call('HMGET', KEYS[1], 'tokens', 'stamp')
local tokens = tonumber(held[1]) or burst
local stamp = tonumber(held[2]) or now
tokens = math.min(burst, tokens + math.max(0, now - stamp) * rate)
local wait = 0
if tokens >= 1 then tokens = tokens - 1 else wait = (1 - tokens) / rate end
redis.call('HSET', KEYS[1], 'tokens', tostring(tokens), 'stamp', tostring(now))
redis.call('PEXPIRE', KEYS[1], math.ceil((burst - tokens) / rate * 1000) + 1000)
return tostring(wait)
"""


def _key(caller: str, rule: PolicyLimits, burst: float) -> str:
    digest = hashlib.sha256(caller.encode("utf-8", "surrogatepass")).hexdigest()[:24]
    return f"{_PREFIX}{rule.requests_per_s:g}:{burst:g}:{digest}"


def failure_reason(exc: BaseException) -> str:
    """The one of ``FAILURE_REASONS`` a failed round trip counts as."""
    import redis.exceptions as errors

    if isinstance(exc, (errors.AuthenticationError, errors.AuthorizationError, errors.NoPermissionError)):
        return "auth"
    if isinstance(exc, (errors.TimeoutError, TimeoutError)):  # the client's socket timeout, or fail_after's
        return "timeout"
    if isinstance(exc, (errors.ConnectionError, OSError)):
        return "connection"
    if isinstance(exc, (errors.ResponseError, errors.InvalidResponse, ValueError)):
        return "response"
    return "other"


class SharedRedis:
    """The one Redis client of a replica's shared state. Every round trip is bounded by ``redis_timeout_s`` (connect
    and answer), and after a failure Redis is not asked again for ``RETRY_S``, so at most one request per ``RETRY_S``
    waits that long. ``watch`` pings it every ``PROBE_S`` (every ``RETRY_S`` while it is down), so whether it answers
    is known even while no request asks. Each failure is counted under one of ``FAILURE_REASONS`` (for /metrics: a
    fixed set, never the error's text)."""

    def __init__(self, settings: SharedSettings) -> None:
        import redis.asyncio  # only when a URL is set

        assert settings.redis_url is not None
        self.timeout = settings.redis_timeout_s
        self.fail_open = settings.redis_down == "open"
        self.client: Any = redis.asyncio.Redis.from_url(
            settings.redis_url,
            socket_timeout=self.timeout,
            socket_connect_timeout=self.timeout,
            retry_on_timeout=False,
            health_check_interval=0,
        )
        self._errors = (redis.RedisError, OSError, TimeoutError, ValueError)
        self._down_until = 0.0
        self.failures = 0
        self.failures_by_reason = dict.fromkeys(FAILURE_REASONS, 0)
        self.down = False

    async def ask(self, op: Callable[[], Awaitable[T]], *, probe: bool = False) -> tuple[bool, T | None]:
        """``(True, op's answer)``, or ``(False, None)`` when Redis cannot answer now (or failed in the last
        ``RETRY_S``, unless this is a ``probe``: the watcher's ping asks even then)."""
        if not probe and time.monotonic() < self._down_until:
            return False, None
        try:
            with anyio.fail_after(self.timeout * 2):  # connect + answer, each bounded by the client as well
                answer = await op()
        except self._errors as exc:  # whatever Redis failed with (its errors, the socket's, a timeout): no answer
            self._failed(exc)
            return False, None
        self._answered()
        return True, answer

    async def ping(self) -> bool:
        """Ask Redis whether it answers (bounded like every round trip, even within ``RETRY_S`` of a failure); a
        failure counts as one."""
        return (await self.ask(self.client.ping, probe=True))[0]

    async def watch(self) -> None:
        """Ping Redis every ``PROBE_S``, every ``RETRY_S`` while it is down (so requests go back to it as soon as it
        answers). Runs until cancelled."""
        while True:
            await anyio.sleep(RETRY_S if self.down else PROBE_S)
            await self.ping()

    def _answered(self) -> None:
        self._down_until = 0.0
        if self.down:
            self.down = False
            log.info("shared_limits.redis_back")

    def _failed(self, exc: BaseException) -> None:
        self.failures += 1
        self.failures_by_reason[failure_reason(exc)] += 1
        self._down_until = time.monotonic() + RETRY_S
        if not self.down:
            self.down = True
            log.warning(
                "shared_limits.redis_down",
                error=type(exc).__name__,
                reason=failure_reason(exc),
                then="served, counted per replica" if self.fail_open else "refused with 503",
                retry_s=RETRY_S,
            )

    def statistics(self) -> dict[str, Any]:
        """For ``/status``: whether Redis answered the last time it was asked, and how often it failed since start."""
        return {
            "redis": "down" if self.down else "up",
            "failures": self.failures,
            "on_redis_down": "open" if self.fail_open else "closed",
        }

    async def aclose(self) -> None:
        with anyio.move_on_after(self.timeout * 2, shield=True):
            await self.client.aclose()


class SharedRates:
    """Token buckets in Redis, one per caller and rule. ``take`` spends a token with one atomic Lua script
    (``EVALSHA``): the bucket is a Redis hash (tokens, stamp) refilled at the rule's ``requests_per_s`` up to its
    ``burst`` by Redis's own clock, so the replicas' clocks need not agree, and it expires once it would be full
    again. The key names the rule's rate and burst, so a reload that changes a rule starts fresh buckets, as the
    per-replica ones do (limits.py). Only the rate is shared: concurrent tool calls stay counted per replica (the end
    of a call on a replica that died would never be counted)."""

    def __init__(self, redis: SharedRedis) -> None:
        self.redis = redis
        self.fail_open = redis.fail_open
        self._script: Any = redis.client.register_script(_TAKE)

    async def take(self, caller: str, rule: PolicyLimits, burst: float) -> float | None:
        """Spend one of the caller's tokens: 0.0 if there was one, else the seconds until there is; None when Redis
        cannot answer now (then ``gateway.shared.redis_down`` decides)."""
        assert rule.requests_per_s is not None
        key, rate = _key(caller, rule, burst), rule.requests_per_s

        async def spend() -> float:
            return float(await self._script(keys=[key], args=[rate, burst]))  # a ValueError is a failure too

        return (await self.redis.ask(spend))[1]


class SharedSessionEnds:
    """Sessions ended on some replica, one expiring key each: ``end`` sets it with ``PX`` (it expires when the sealed
    id would, so Redis holds at most the sessions ended within ``session_max_age_s``), named by a digest of the id,
    never the id; ``ended`` is one ``EXISTS`` per request on a sealed session id (sessions.py)."""

    def __init__(self, redis: SharedRedis) -> None:
        self.redis = redis
        self.fail_open = redis.fail_open

    async def end(self, session_id: str, ttl_s: float) -> bool:
        """Record that ``session_id`` ended, for ``ttl_s`` seconds (what is left of its lifetime); False when Redis
        cannot answer (the end is then this replica's alone)."""
        ttl_ms = max(1, round(ttl_s * 1000))
        answered, _ = await self.redis.ask(lambda: self.redis.client.set(_ended_key(session_id), b"1", px=ttl_ms))
        return answered

    async def ended(self, session_id: str) -> bool | None:
        """Whether some replica ended ``session_id``; None when Redis cannot answer now."""
        answered, count = await self.redis.ask(lambda: self.redis.client.exists(_ended_key(session_id)))
        return bool(count) if answered else None


def _ended_key(session_id: str) -> str:
    return _ENDED + hashlib.sha256(session_id.encode("latin-1", "replace")).hexdigest()[:32]
