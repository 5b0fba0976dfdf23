"""One deadline per call, shared by every step it tries (``gateway.call_budget``; docs/configuration.md).

A client gives up after its own timeout (often 60 s); a ladder of rungs, each with its own timeout (qmd's deep mode
has 120 s), could take longer than that in total, and the floor that would have answered never runs. So the router
makes a ``CallDeadline`` when a call starts and runs each step through ``run``: a step that is not the last one left
to try may use what remains of ``total_s`` minus ``floor_s`` (the time kept for the rungs after it), the last one may
use all that remains. A step cut short is a ``BackendTimeout`` naming the budget (its process group is killed, as on
any cancellation); a step left with no time at all is ``OutOfTime``, skipped without being tried. A backend's own
timeout still applies when it is shorter.
"""

from __future__ import annotations

import time
from collections.abc import Awaitable, Callable
from typing import TypeVar

import anyio

from gateway.config import CallBudget
from gateway.errors import BackendTimeout, OutOfTime

__all__ = ["CallDeadline"]

T = TypeVar("T")

_MIN_STEP_S = 0.05
"""A step given less than this is not started: nothing useful answers that fast through a process or a session."""


class CallDeadline:
    """The time left to one call, from its start (``budget`` is ``gateway.call_budget``)."""

    def __init__(self, budget: CallBudget) -> None:
        self._budget = budget
        self._deadline = time.monotonic() + budget.total_s

    def allowance(self, *, last: bool) -> float:
        """Seconds the next step may run: all that remains when it is the ``last`` one left, else that minus the
        floor's reserve."""
        remaining = self._deadline - time.monotonic()
        return remaining if last else remaining - self._budget.floor_s

    async def run(self, step: Callable[[], Awaitable[T]], *, backend: str, last: bool) -> T:
        """Run ``step`` within its allowance.

        Raises:
            OutOfTime: no time is left for this step (it was not started).
            BackendTimeout: the step was cut at its allowance (cancelled, so its processes are gone).
        """
        allowance = self.allowance(last=last)
        total, floor = self._budget.total_s, self._budget.floor_s
        if allowance < _MIN_STEP_S:
            kept = "" if last else f", {floor:g} s of it kept for the rungs after this one"
            raise OutOfTime(backend, f"skipped: the call's budget of {total:g} s is spent{kept}")
        with anyio.move_on_after(allowance):
            return await step()
        kept = "" if last else f" ({floor:g} s kept for the rungs after it)"
        raise BackendTimeout(backend, f"cut after {allowance:.1f} s by the call's budget of {total:g} s{kept}")
