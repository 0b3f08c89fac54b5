"""What an admission gate reports: `GateStats`, one frozen snapshot for every reader.

Admin `GetUsage` and the telemetry gauges read `gate.stats()` and nothing
else, so they never ask which state runs. In memory, `Dispatcher.stats()` builds it
from its quota ledger, policy and budget; over a shared store, from its
local requests, its counter mirror, totals of what ended here and the store's
last snapshot (`refresh_stats`), which holds the fleet-wide buckets
(shared_stats.py).

Per tenant, `queued`, `in_flight` and the totals are this replica's, or with
`stats(fleet=True)` (admin `GetUsage`) the sum over every live replica
sharing the store (shared/fleet_usage.py); the bucket levels and the virtual
counter are the tenant's own (fleet-wide in Redis mode, since the buckets
and counters live there).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from scheduler.budget import AdmissionLimits
from scheduler.quotas import BucketLimits, QuotaLedger
from scheduler.rules import bucket_level
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.token_bucket import TokenBucket

# "memory": one replica, nothing shared; else the shared store's health as this
# replica sees it ("ok", or failing "open" / "closed").
StoreMode = Literal["memory", "ok", "open", "closed"]


@dataclass(frozen=True, slots=True)
class BucketStats:
    level: float
    burst: float
    rate_per_s: float

    @property
    def used(self) -> float:
        """What the bucket has lent out (burst - level): used in the refill window."""
        return self.burst - self.level

    @classmethod
    def of(cls, bucket: TokenBucket | None) -> BucketStats | None:
        if bucket is None:
            return None
        return cls(bucket.level(), bucket.burst, bucket.rate_per_s)


def stored_buckets(
    limits: BucketLimits,
    levels: tuple[float | None, float | None] | None,
    ages_s: tuple[float | None, float | None] | None,
) -> tuple[BucketStats | None, BucketStats | None]:
    """A tenant's (request, token) buckets from a store snapshot: the level last
    written, refilled over its age (a bucket the store never wrote is full)."""

    def one(
        rate: float | None, burst: float | None, level: float | None, age_s: float | None
    ) -> BucketStats | None:
        if rate is None or burst is None:
            return None
        if level is None:
            return BucketStats(burst, burst, rate)
        return BucketStats(bucket_level(level, 0.0, age_s or 0.0, rate, burst), burst, rate)

    r_level, t_level = levels or (None, None)
    r_age, t_age = ages_s or (None, None)
    return (
        one(limits.requests_per_s, limits.requests_burst, r_level, r_age),
        one(limits.tokens_per_s, limits.tokens_burst, t_level, t_age),
    )


# A tenant's (request, token) buckets; None where it has no such bucket.
TenantBuckets = tuple[BucketStats | None, BucketStats | None]


def configured_buckets(registry: TenantRegistry, tenant_id: str) -> TenantBuckets:
    """A tenant's buckets before it has sent anything: full, or none."""
    cfg = registry.get(tenant_id)
    return stored_buckets(BucketLimits.of(cfg.quotas), None, None) if cfg else (None, None)


@dataclass(frozen=True, slots=True)
class TenantStats:
    tenant_id: str
    weight: float
    # The fair policy's virtual counter (None: a policy without one, e.g. fcfs).
    virtual_counter: float | None
    # The rest defaults to a tenant that has sent nothing (no bucket: full or none).
    queued: int = 0
    in_flight: int = 0
    request_bucket: BucketStats | None = None
    token_bucket: BucketStats | None = None
    # What the buckets were charged, net of refunds (reservations in flight included).
    charged_requests: float = 0.0
    charged_tokens: float = 0.0
    # Refused at arrival (caps, max_queued, reject-mode buckets), by the limit.
    rejected_total: int = 0
    rejections: Mapping[str, int] = field(default_factory=dict)
    # Requests that ended here: finished, cancelled, expired while queued.
    finished_total: int = 0
    # Held back by its own limits (max_concurrent, wait-mode buckets).
    paused: bool = False


@dataclass(frozen=True, slots=True)
class GateStats:
    in_flight: int
    in_flight_kv_tokens: int
    limits: AdmissionLimits
    queued: int
    admitted_total: int
    # Queued requests that ran out of queue time (max_queue_wait_s, deadline).
    expired_total: int
    store: StoreMode
    # Candidates held out of the fair-share reserve (reserve.py).
    reserve_holds_total: int
    tenants: tuple[TenantStats, ...]
    # Admissions beyond the engine's room (Isolation.PREEMPT, or a slot under
    # RESERVE_SLOTS): each one has the engine retract a running request if it is full.
    lent_total: int = 0
    # Replicas whose per-tenant usage the tenants' numbers sum (1: this one only).
    replicas: int = 1

    def tenant(self, tenant_id: str) -> TenantStats | None:
        for t in self.tenants:
            if t.tenant_id == tenant_id:
                return t
        return None


def ledger_tenants(
    ledger: QuotaLedger,
    counter: Callable[[str], float] | None,
    paused: set[str],
    include: Iterable[str] = (),
) -> tuple[TenantStats, ...]:
    """Per-tenant stats of the single-replica `Dispatcher`, from its quota ledger:
    every tenant seen, plus `include` (a tenant that has sent nothing has full buckets)."""
    registry = ledger.tenants
    out: dict[str, TenantStats] = {}
    for u in ledger.usages():
        tid = u.config.tenant_id
        out[tid] = TenantStats(
            tenant_id=tid,
            weight=registry.weight_of(tid),
            virtual_counter=counter(tid) if counter is not None else None,
            queued=u.queued,
            in_flight=ledger.in_flight.requests_of(tid),
            request_bucket=BucketStats.of(u.request_bucket),
            token_bucket=BucketStats.of(u.token_bucket),
            charged_requests=u.charged_requests,
            charged_tokens=u.charged_tokens,
            rejected_total=u.rejected_total,
            rejections=dict(u.rejections),
            finished_total=u.finished_total,
            paused=tid in paused,
        )
    for tid in include:
        if tid in out:
            continue
        buckets = configured_buckets(registry, tid)
        out[tid] = TenantStats(
            tenant_id=tid,
            weight=registry.weight_of(tid),
            virtual_counter=counter(tid) if counter is not None else None,
            request_bucket=buckets[0],
            token_bucket=buckets[1],
        )
    return tuple(out[t] for t in sorted(out))
