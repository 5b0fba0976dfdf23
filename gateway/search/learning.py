"""Learning from use: which found tool a caller then called, remembered per team, as a nudge to later searches.

A search that is followed, within the same session, by a call of one of the tools it found is a label a gateway
alone sees: this request meant that tool. ``UseMemory.record`` keeps (the request's vector, the tool's name) per
team (the caller's policy; one team's choices never reach another's searches), the oldest dropped past ``LIMIT``.
``UseMemory.nudge(team)`` gives ``ToolIndex.rank`` its ``learned`` argument: for a new request, every remembered
request at least ``MIN_SIMILARITY`` alike adds ``WEIGHT`` times its similarity to the log-odds of the tool chosen
then (the largest such, per tool). The memory lives in the process (per replica) and starts empty.
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Mapping

import numpy as np

from gateway.search.ranking import Vectors

__all__ = ["LIMIT", "MIN_SIMILARITY", "WEIGHT", "UseMemory"]

MIN_SIMILARITY = 0.7
"""How alike (cosine) an earlier request must be for its choice to count (with ``WEIGHT``, the best of a small grid
on the dev half, each request left out of its own memory: bench/bench_toolsearch.py)."""
WEIGHT = 2.0
"""Log-odds added per unit of similarity to the tool an alike request chose."""
LIMIT = 2_000
"""Choices kept per team (the oldest go first)."""


class UseMemory:
    """Per-team memory of (request vector, chosen tool); thread-safe (searches rank in worker threads)."""

    def __init__(self, limit: int = LIMIT, min_similarity: float = MIN_SIMILARITY, weight: float = WEIGHT) -> None:
        self._limit = limit
        self.min_similarity = min_similarity
        self.weight = weight
        self._teams: dict[str | None, deque[tuple[Vectors, str]]] = {}
        self._lock = threading.Lock()

    def record(self, team: str | None, vector: Vectors, tool: str) -> None:
        """Remember that ``team`` chose ``tool`` after a request whose vector is ``vector``."""
        with self._lock:
            self._teams.setdefault(team, deque(maxlen=self._limit)).append((vector, tool))

    def __len__(self) -> int:
        return sum(len(choices) for choices in self._teams.values())

    def nudge(self, team: str | None) -> Callable[[Vectors], Mapping[str, float]] | None:
        """``ToolIndex.rank``'s ``learned`` for ``team`` (None while it has chosen nothing)."""
        with self._lock:
            choices = list(self._teams.get(team, ()))
        if not choices:
            return None
        matrix = np.stack([vector for vector, _ in choices])
        tools = [tool for _, tool in choices]

        def learned(vector: Vectors) -> Mapping[str, float]:
            sims = matrix @ vector
            bonus: dict[str, float] = {}
            for n in np.flatnonzero(sims >= self.min_similarity):
                value = self.weight * float(sims[n])
                if value > bonus.get(tools[n], 0.0):
                    bonus[tools[n]] = value
            return bonus

        return learned
