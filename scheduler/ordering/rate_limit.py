"""Baseline: FCFS plus a plain per-tenant request-rate limit, as common gateways do.

Each tenant gets the same token bucket of `requests_per_s` (burst `burst`);
a request over the rate is rejected at once with the exact retry delay. No
fairness beyond that: admitted requests are served first come, first served.
It exists so the benchmark can compare it with the fair policy.
"""

from __future__ import annotations

from scheduler.clock import Clock
from scheduler.errors import QuotaExceeded
from scheduler.ordering.fcfs import FcfsPolicy
from scheduler.request import QueuedRequest
from scheduler.token_bucket import TokenBucket


class RateLimitPolicy(FcfsPolicy):
    name = "rate-limit"
    fair = False

    def __init__(
        self, clock: Clock, requests_per_s: float = 10.0, burst: float | None = None
    ) -> None:
        super().__init__()
        if not requests_per_s > 0:
            raise ValueError(f"requests_per_s must be > 0, got {requests_per_s}")
        self.clock = clock
        self.requests_per_s = requests_per_s
        self.burst = burst if burst is not None else max(1.0, requests_per_s)
        self._buckets: dict[str, TokenBucket] = {}
        self.rejected_total = 0

    def push(self, req: QueuedRequest) -> None:
        bucket = self._buckets.get(req.tenant_id)
        if bucket is None:
            bucket = TokenBucket(self.requests_per_s, self.burst, self.clock)
            self._buckets[req.tenant_id] = bucket
        wait_s = bucket.try_take(1)
        if wait_s > 0:
            self.rejected_total += 1
            raise QuotaExceeded(
                req.tenant_id,
                "rate_limit",
                f"over the gateway rate limit of {self.requests_per_s:g} requests/s; "
                f"retry in {wait_s:.3f} s",
                retry_after_s=wait_s,
            )
        super().push(req)

    def forget(self, tenant_id: str) -> bool:
        bucket = self._buckets.get(tenant_id)
        if bucket is not None and not bucket.full:
            return False  # forgetting a drained bucket would refill it
        if not super().forget(tenant_id):
            return False
        self._buckets.pop(tenant_id, None)
        return True
