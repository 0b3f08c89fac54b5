"""Injected wake-ups: the dispatcher asks to be called back at a clock time.

`AsyncioTimers` uses the running event loop (production); `ManualTimers`
keeps the callbacks for a test or a discrete-event driver to run when its
fake clock reaches them, so no test ever sleeps.
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
from collections.abc import Callable
from typing import Protocol

from scheduler.clock import Clock


class TimerHandle(Protocol):
    def cancel(self) -> None: ...


class Timers(Protocol):
    def call_at(self, when_s: float, callback: Callable[[], None]) -> TimerHandle:
        """Run `callback` once the clock reads `when_s` or later."""
        ...


class AsyncioTimers:
    """Timers on the running asyncio loop; `when_s` is on the injected clock."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock

    def call_at(self, when_s: float, callback: Callable[[], None]) -> TimerHandle:
        delay_s = max(0.0, when_s - self.clock.now_s())
        return asyncio.get_running_loop().call_later(delay_s, callback)


class _ManualHandle:
    __slots__ = ("cancelled",)

    def __init__(self) -> None:
        self.cancelled = False

    def cancel(self) -> None:
        self.cancelled = True


class ManualTimers:
    """Timers a test fires by hand: `next_s()` says when, `run_due()` fires them."""

    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self._heap: list[tuple[float, int, _ManualHandle, Callable[[], None]]] = []
        self._seq = itertools.count()

    def call_at(self, when_s: float, callback: Callable[[], None]) -> TimerHandle:
        handle = _ManualHandle()
        heapq.heappush(self._heap, (when_s, next(self._seq), handle, callback))
        return handle

    def _prune(self) -> None:
        while self._heap and self._heap[0][2].cancelled:
            heapq.heappop(self._heap)

    def next_s(self) -> float | None:
        """Clock time of the earliest pending callback, or None."""
        self._prune()
        return self._heap[0][0] if self._heap else None

    def run_due(self) -> int:
        """Fire every callback due at the clock's current time; returns how many ran."""
        ran = 0
        now_s = self.clock.now_s()
        while True:
            self._prune()
            if not self._heap or self._heap[0][0] > now_s:
                return ran
            _, _, handle, callback = heapq.heappop(self._heap)
            handle.cancelled = True
            callback()
            ran += 1
