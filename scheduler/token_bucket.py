"""Token bucket: `rate_per_s` refill up to `burst`, on an injected clock.

Three operations: `try_take` (all or nothing, else the exact wait), `take`
(may go into debt: a stream already in flight is never cut), and `refund`.
The level is computed lazily from the time of the last update, so an idle
bucket costs nothing.
"""

from __future__ import annotations

import math

from scheduler.clock import Clock
from scheduler.rules import bucket_added, bucket_level, bucket_wait_s


class TokenBucket:
    def __init__(
        self, rate_per_s: float, burst: float, clock: Clock, *, level: float | None = None
    ) -> None:
        if not rate_per_s > 0 or not math.isfinite(rate_per_s):
            raise ValueError(f"rate_per_s must be a finite number > 0, got {rate_per_s}")
        if not burst > 0 or not math.isfinite(burst):
            raise ValueError(f"burst must be a finite number > 0, got {burst}")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._clock = clock
        self._level = burst if level is None else min(level, burst)
        self._updated_s = clock.now_s()

    def level(self) -> float:
        """Tokens available now (negative while in debt)."""
        now_s = self._clock.now_s()
        if now_s > self._updated_s:
            self._level = self._level_at(now_s)
            self._updated_s = now_s
        return self._level

    def peek_level(self) -> float:
        """`level()` without writing: safe from another thread (a metric reader)
        while the event loop takes and refunds."""
        return self._level_at(self._clock.now_s())

    def _level_at(self, now_s: float) -> float:
        if now_s > self._updated_s:
            return bucket_level(self._level, self._updated_s, now_s, self.rate_per_s, self.burst)
        return self._level

    def wait_s(self, n: float) -> float:
        """Seconds until `n` could be taken (0.0 now; inf if n exceeds the burst)."""
        return bucket_wait_s(self.level(), n, self.rate_per_s, self.burst)

    def try_take(self, n: float) -> float:
        """Take `n` and return 0.0, or take nothing and return the wait in seconds."""
        wait_s = self.wait_s(n)
        if wait_s == 0.0:
            self._level -= n
        return wait_s

    def take(self, n: float) -> None:
        """Take `n` even if that leaves the bucket in debt."""
        self.level()
        self._level -= n

    def refund(self, n: float) -> None:
        """Give back `n` (never above the burst)."""
        self._level = bucket_added(self.level(), n, self.burst)

    def reconfigure(self, rate_per_s: float, burst: float) -> None:
        """New limits; the current level (and any debt) carries over."""
        level = self.level()
        if not rate_per_s > 0 or not burst > 0:
            raise ValueError("rate_per_s and burst must be > 0")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._level = min(level, burst)
