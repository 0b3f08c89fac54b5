"""Token bucket: `rate_per_s` refill up to `burst`, on an injected clock.

Three operations: `try_take` (all or nothing, else the exact wait), `take`
(may go into debt: a stream already in flight is never cut), and `refund`.
The same model as the shared store's buckets (`StoredLevel`, kept by
`MemoryStore` too; the Redis STEP script its twin): a level and the time it was
set; reading computes the level now (`rules.bucket_level`) and writes nothing,
only an add (`rules.bucket_added`) stores a new level, so both round alike and
a read is safe from another thread (a metric reader) while the event loop
takes and refunds.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from scheduler.clock import Clock
from scheduler.rules import bucket_added, bucket_level, bucket_wait_s, refill_s


@dataclass(slots=True)
class StoredLevel:
    """A bucket as it is kept: the level it was set to and when (Redis: two fields
    of a hash). `TokenBucket` and `MemoryStore` keep this one model; the STEP
    script is its Lua twin (held to it by the store differential).
    `expires_s`: a forgotten bucket that is not full yet goes once full (Redis:
    the key's PEXPIRE); any add keeps it."""

    level: float
    updated_s: float
    expires_s: float = math.inf

    def at(self, now_s: float, rate_per_s: float, burst: float) -> float:
        """The level now (negative while in debt); writes nothing."""
        return bucket_level(self.level, self.updated_s, now_s, rate_per_s, burst)

    def add(self, n: float, now_s: float, rate_per_s: float, burst: float) -> None:
        """Add `n` (negative: take, debt allowed; never above the burst)."""
        self.level = bucket_added(self.at(now_s, rate_per_s, burst), n, burst)
        self.updated_s = now_s
        self.expires_s = math.inf


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
        self._stored = StoredLevel(burst if level is None else min(level, burst), clock.now_s())

    def level(self) -> float:
        """Tokens available now (negative while in debt)."""
        return self._stored.at(self._clock.now_s(), self.rate_per_s, self.burst)

    def _add(self, n: float) -> None:
        self._stored.add(n, self._clock.now_s(), self.rate_per_s, self.burst)

    def wait_s(self, n: float) -> float:
        """Seconds until `n` could be taken (0.0 now; inf if n exceeds the burst)."""
        return bucket_wait_s(self.level(), n, self.rate_per_s, self.burst)

    @property
    def full(self) -> bool:
        """Full again (`rules.refill_s`): forgetting it would change nothing."""
        return refill_s(self.level(), self.rate_per_s, self.burst) == 0.0

    def try_take(self, n: float) -> float:
        """Take `n` and return 0.0, or take nothing and return the wait in seconds."""
        wait_s = self.wait_s(n)
        if wait_s == 0.0:
            self._add(-n)
        return wait_s

    def take(self, n: float) -> None:
        """Take `n` even if that leaves the bucket in debt."""
        self._add(-n)

    def refund(self, n: float) -> None:
        """Give back `n` (never above the burst)."""
        self._add(n)

    def reconfigure(self, rate_per_s: float, burst: float) -> None:
        """New limits; the current level (and any debt) carries over."""
        level = self.level()
        if not rate_per_s > 0 or not burst > 0:
            raise ValueError("rate_per_s and burst must be > 0")
        self.rate_per_s = rate_per_s
        self.burst = burst
        self._stored = StoredLevel(min(level, burst), self._clock.now_s())


def reconfigured(
    old: TokenBucket | None, rate_per_s: float | None, burst: float | None, clock: Clock
) -> TokenBucket | None:
    """The bucket for these limits (None: not limited): `old`, its level carried
    over to new limits, or a new full one."""
    if rate_per_s is None or burst is None:
        return None
    if old is None:
        return TokenBucket(rate_per_s, burst, clock)
    if (old.rate_per_s, old.burst) != (rate_per_s, burst):
        old.reconfigure(rate_per_s, burst)
    return old
