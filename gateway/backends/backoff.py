"""How long a backend waits before it tries again: tenacity wait strategies, so every retry loop is a tenacity loop
with ``sleep=anyio.sleep`` (cancellable) and no delay arithmetic of its own.

``backoff(first_s, max_s)`` waits ``first_s`` after the first failed attempt, twice as long after each further one,
at most ``max_s``; every wait is spread by a random factor in [0.8, 1.2] (``spread``), so the retries of many
backends, and of many gateways, do not fall in step.
"""

from __future__ import annotations

import random

from tenacity import RetryCallState
from tenacity.wait import wait_base, wait_exponential

__all__ = ["SPREAD", "backoff", "spread"]

SPREAD = 0.2
"""Every wait is its nominal length times a random factor in [1 - SPREAD, 1 + SPREAD]."""


def spread(seconds: float) -> float:
    """``seconds`` spread by ``SPREAD`` (for a fixed period: a re-check, a ping)."""
    return seconds * random.uniform(1 - SPREAD, 1 + SPREAD)


class _Spread(wait_base):
    """A tenacity wait: ``inner``'s wait, spread by ``SPREAD``."""

    def __init__(self, inner: wait_base) -> None:
        self._inner = inner

    def __call__(self, retry_state: RetryCallState) -> float:
        return spread(self._inner(retry_state))


def backoff(first_s: float, max_s: float) -> wait_base:
    """The wait before attempt n + 1: ``first_s * 2 ** (n - 1)``, at most ``max_s``, spread by ``SPREAD``."""
    return _Spread(wait_exponential(multiplier=first_s, max=max_s))
