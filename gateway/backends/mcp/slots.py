"""A fair share of a bounded resource among callers: ``FairSlots``, the calls one HTTP backend carries at once.

``limit`` slots; a caller holds at most ``per_caller`` of them, so one caller's flood always leaves room for the
others. When a slot frees, it goes to the waiting caller that holds the fewest (among equals, the one waiting
longest), so a newcomer is served before a flooder's next call. A wait is bounded by its caller: ``take`` answers
False when no slot came in time, and a waiter that is cancelled leaves the queue (or gives back the slot it was
handed meanwhile).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

import anyio

__all__ = ["FairSlots", "SlotStatistics"]


@dataclass(frozen=True, slots=True)
class SlotStatistics:
    limit: int
    per_caller: int
    busy: int
    waiting: int


class FairSlots:
    """``limit`` slots, at most ``per_caller`` held by one caller; see the module docstring."""

    def __init__(self, limit: int, per_caller: int) -> None:
        self.limit = limit
        self.per_caller = min(per_caller, limit)
        self._busy = 0
        self._held: dict[str, int] = {}
        self._waiting: dict[str, deque[anyio.Event]] = {}  # by caller, in the order the callers came

    def statistics(self) -> SlotStatistics:
        waiting = sum(len(queue) for queue in self._waiting.values())
        return SlotStatistics(self.limit, self.per_caller, self._busy, waiting)

    async def take(self, caller: str, wait_s: float) -> bool:
        """Take a slot for ``caller``: True once it has one (give it back with ``give``), False when none came
        within ``wait_s``."""
        handed = anyio.Event()
        self._waiting.setdefault(caller, deque()).append(handed)
        self._hand_on()
        try:
            if not handed.is_set():
                with anyio.move_on_after(wait_s):
                    await handed.wait()
        except BaseException:
            self._leave(caller, handed)
            raise
        if handed.is_set():
            return True
        self._leave(caller, handed)
        return False

    def give(self, caller: str) -> None:
        """Give back one of ``caller``'s slots; the next waiter gets it."""
        held = self._held.get(caller, 0) - 1
        if held > 0:
            self._held[caller] = held
        else:
            self._held.pop(caller, None)
        self._busy -= 1
        self._hand_on()

    def _leave(self, caller: str, handed: anyio.Event) -> None:
        if handed.is_set():  # the slot came as the wait ended: it goes on to the next waiter
            self.give(caller)
            return
        queue = self._waiting.get(caller)
        if queue is not None and handed in queue:
            queue.remove(handed)
            if not queue:
                del self._waiting[caller]

    def _hand_on(self) -> None:
        while self._busy < self.limit:
            eligible = [
                (self._held.get(caller, 0), order, caller)
                for order, caller in enumerate(self._waiting)
                if self._held.get(caller, 0) < self.per_caller
            ]
            if not eligible:
                return
            caller = min(eligible)[2]
            queue = self._waiting[caller]
            handed = queue.popleft()
            if not queue:
                del self._waiting[caller]
            self._held[caller] = self._held.get(caller, 0) + 1
            self._busy += 1
            handed.set()
