"""Per-worker circuit breaker (outlier detection, as Envoy's): when to eject, for how long.

A worker can answer `/health` and still fail every stream (garbled output,
stalls). So stream failures count too: `consecutive_failures` in a row eject
it. Each ejection lasts `base_ejection_s · 2^(n-1)` (n = ejections in a row,
capped at `max_ejection_s`); the health loop may re-admit it only after
that, so a worker that keeps failing comes back ever more rarely instead of
flapping. The count of ejections in a row is forgiven once the worker has
served successfully for as long as its last ejection lasted.

Pure bookkeeping: time comes in as arguments.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class BreakerPolicy:
    consecutive_failures: int = 3
    base_ejection_s: float = 5.0
    max_ejection_s: float = 300.0
    # Routing weighs a worker's recent failures for this long after the last one,
    # so a worker with a transient failure is not starved forever at low load.
    failure_memory_s: float = 10.0

    def __post_init__(self) -> None:
        if self.consecutive_failures < 1:
            raise ValueError("consecutive_failures must be >= 1")
        if not 0 < self.base_ejection_s <= self.max_ejection_s:
            raise ValueError("need 0 < base_ejection_s <= max_ejection_s")


@dataclass(slots=True)
class Breaker:
    policy: BreakerPolicy
    # Stream failures since the last success.
    failures: int = 0
    # Ejections in a row (the backoff exponent).
    ejections: int = 0
    ejected_until_s: float = 0.0
    admitted_at_s: float = 0.0
    last_ejection_s: float = 0.0
    last_failure_at_s: float = 0.0

    def penalty(self, now_s: float) -> int:
        """Recent failures, for routing: a worker whose streams die fast looks idle."""
        if self.failures and now_s - self.last_failure_at_s < self.policy.failure_memory_s:
            return self.failures
        return 0

    def on_success(self, now_s: float) -> None:
        self.failures = 0
        if self.ejections and now_s - self.admitted_at_s >= self.last_ejection_s:
            self.ejections = 0

    def on_failure(self, now_s: float) -> bool:
        """Count a stream failure; True when the worker should be ejected."""
        self.failures += 1
        self.last_failure_at_s = now_s
        return self.failures >= self.policy.consecutive_failures

    def eject(self, now_s: float) -> float:
        """Start an ejection; returns how long it lasts."""
        self.ejections += 1
        p = self.policy
        duration_s = min(p.max_ejection_s, p.base_ejection_s * 2.0 ** min(self.ejections - 1, 62))
        self.last_ejection_s = duration_s
        self.ejected_until_s = now_s + duration_s
        return duration_s

    def may_readmit(self, now_s: float) -> bool:
        return now_s >= self.ejected_until_s

    def readmitted(self, now_s: float) -> None:
        self.failures = 0
        self.admitted_at_s = now_s
