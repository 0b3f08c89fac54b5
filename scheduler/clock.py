"""Injected time. Scheduling code never reads a global clock."""

from __future__ import annotations

import time
from typing import Protocol


class Clock(Protocol):
    def now_s(self) -> float:
        """Monotonic seconds."""
        ...


class MonotonicClock:
    def now_s(self) -> float:
        return time.monotonic()


class FakeClock:
    """A clock tests move by hand."""

    def __init__(self, start_s: float = 0.0) -> None:
        self._now_s = start_s

    def now_s(self) -> float:
        return self._now_s

    def advance(self, delta_s: float) -> None:
        if delta_s < 0:
            raise ValueError("time does not go backwards")
        self._now_s += delta_s

    def set(self, now_s: float) -> None:
        if now_s < self._now_s:
            raise ValueError("time does not go backwards")
        self._now_s = now_s
