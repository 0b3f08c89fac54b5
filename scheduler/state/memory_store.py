"""The in-memory `Store`: one replica's shared state, in plain Python.

Same rules as the Redis scripts (`redis_store.py`), on an injected clock, and
the same state model as the in-process dispatcher: its counters, in-flight
counts and reserve window are `admission_state.py`'s classes; what is its own
is the fleet (each replica's backlog, lease and done-set expiry, buckets as
stored levels: `StoredBuckets`, the Lua's keys). Each step's decision is
`decision.admit_round` over a `StoreRound` (store_round.py). Used by the
contract tests, by benchmarks as the no-network baseline, and by
`SharedAdmission` as the fail-open fallback while Redis is unreachable (then
with this replica's share of the limits).
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.admission_state import ActiveWindow, FairCounters, InFlight
from scheduler.clock import Clock
from scheduler.quotas import BucketLimits
from scheduler.state.memory_buckets import StoredBuckets
from scheduler.state.store import (
    Lease,
    SeenLevel,
    Settlement,
    Step,
    StepOutcome,
    StoreSnapshot,
    tenant_fields,
)
from scheduler.state.store_round import decide
from scheduler.tenancy.tenants import TenantConfig


@dataclass(slots=True)
class _Lease:
    tenant_id: str
    kv_tokens: int
    expires_s: float


class MemoryStore:
    kind = "memory"

    def __init__(
        self,
        clock: Clock,
        *,
        lease_ttl_s: float = 10.0,
        backlog_ttl_s: float = 3.0,
        done_ttl_s: float = 600.0,
    ) -> None:
        self.clock = clock
        self.lease_ttl_s = lease_ttl_s
        self.backlog_ttl_s = backlog_ttl_s
        self.done_ttl_s = done_ttl_s
        self.round_trips = 0
        # The counters, in-flight counts and activity window: the same model as
        # the in-process dispatcher's (admission_state.py), over the fleet.
        self.vtc = FairCounters()
        # (replica, tenant) -> expiry
        self.backlog: dict[tuple[str, str], float] = {}
        # (replica, tenant) -> its queue length there, capped (Step.queued)
        self.backlog_queued: dict[tuple[str, str], int] = {}
        self.leases: dict[str, _Lease] = {}
        self.engine = InFlight()
        # tenant -> weight (for the reserve's shares; unknown: 1)
        self.weights: dict[str, float] = {}
        self.done: dict[str, float] = {}
        self.buckets = StoredBuckets()
        self.tenants: dict[str, dict[str, str]] = {}
        # Tenants active for the reserve a while after one of their requests
        # ended or they stopped being backlogged on a replica.
        self.recent = ActiveWindow()

    @property
    def counters(self) -> dict[str, float]:
        return self.vtc.values

    async def bucket_levels(self, tenant_id: str) -> dict[str, SeenLevel]:
        return self.buckets.seen(tenant_id, self.clock.now_s())

    # -- leases ---------------------------------------------------------------
    def open_lease(self, lease_id: str, tenant: str, kv: int, now_s: float) -> None:
        self.leases[lease_id] = _Lease(tenant, kv, now_s + self.lease_ttl_s)
        self.engine.open(tenant, kv)

    def _release(self, lease_id: str) -> None:
        lease = self.leases.pop(lease_id, None)
        if lease is not None:
            self.engine.release(lease.tenant_id, lease.kv_tokens)

    def _expire(self, now_s: float) -> None:
        for lid in [lid for lid, lease in self.leases.items() if lease.expires_s <= now_s]:
            self._release(lid)
        for key in [k for k, exp in self.backlog.items() if exp <= now_s]:
            del self.backlog[key]
            self.backlog_queued.pop(key, None)
        for lid in [lid for lid, exp in self.done.items() if exp <= now_s]:
            del self.done[lid]
        self.recent.prune(now_s)
        self.buckets.expire(now_s)

    def _settle(self, s: Settlement, now_s: float) -> bool:
        if s.lease_id in self.done:
            return False
        self._release(s.lease_id)
        self.buckets.add(s.tenant_id, s.refund_requests, s.refund_tokens, s.buckets, now_s)
        self.done[s.lease_id] = now_s + self.done_ttl_s
        return True

    def _renew(self, lease: Lease, now_s: float) -> None:
        current = self.leases.get(lease.lease_id)
        if current is not None:
            current.expires_s = now_s + self.lease_ttl_s
        elif lease.lease_id not in self.done:
            self.open_lease(lease.lease_id, lease.tenant_id, lease.kv_tokens, now_s)

    def _lift(self, replica: str, tenant: str) -> None:
        # The floor: the smallest counter among the other tenants backlogged and
        # eligible somewhere (one held by its own limits has a negative length).
        others = {
            t for (r, t) in self.backlog if t != tenant and self.backlog_queued.get((r, t), 0) >= 0
        }
        if any(t == tenant and r != replica for (r, t) in self.backlog):
            return  # already backlogged on another replica
        self.vtc.lift(tenant, (self.vtc.get(t) for t in others))

    def _forget(self, tenant: str, lim: BucketLimits, now_s: float) -> None:
        """Forget a tenant idle fleet-wide (Step.forget); else nothing."""
        if tenant in self.engine or any(t == tenant for (_, t) in self.backlog):
            return
        self.vtc.forget(tenant)
        self.weights.pop(tenant, None)
        self.recent.back(tenant)
        self.buckets.forget(tenant, lim, now_s)

    # -- the Store protocol -----------------------------------------------------
    async def step(self, replica_id: str, step: Step) -> StepOutcome:
        return self.step_now(replica_id, step)

    def step_now(self, replica_id: str, step: Step) -> StepOutcome:
        now_s = self.clock.now_s()
        out = StepOutcome()
        self._expire(now_s)
        out.settled = sum(self._settle(s, now_s) for s in step.settlements)
        for tenant, delta in step.charges.items():
            self.vtc.charge(tenant, delta)
        for tenant, limits in step.forget.items():
            self._forget(tenant, limits, now_s)
        for tenant in step.withdraw:
            self.backlog.pop((replica_id, tenant), None)
            self.backlog_queued.pop((replica_id, tenant), None)
        # Still active for the reserve a while after its last request left.
        for tenant in [*step.withdraw, *(x.tenant_id for x in step.settlements)]:
            self.recent.left(tenant, now_s, step.reserve_window_s)
        if step.backlogged is not None:
            for tenant in step.backlogged:
                self.backlog[(replica_id, tenant)] = now_s + self.backlog_ttl_s
        for tenant, n in step.queued.items():
            self.backlog_queued[(replica_id, tenant)] = n
        for tenant in step.announce:
            self._lift(replica_id, tenant)
            self.backlog[(replica_id, tenant)] = now_s + self.backlog_ttl_s
            out.counters[tenant] = self.vtc.get(tenant)
        for lease in step.renew or ():
            self._renew(lease, now_s)
        self.weights.update(step.weights)
        decide(self, replica_id, step, now_s, out)
        out.in_flight = self.engine.requests
        return out

    async def reserve(
        self, lease_id: str, tenant_id: str, tokens: int, buckets: BucketLimits
    ) -> tuple[str, float]:
        now_s = self.clock.now_s()
        limit, wait_s = self.buckets.wait(tenant_id, tokens, buckets, now_s)
        if wait_s > 0:
            return limit, wait_s
        self.buckets.add(tenant_id, -1.0, -float(tokens), buckets, now_s)
        return "", 0.0

    def seed_levels(self, levels: dict[tuple[str, str], float]) -> None:
        """Start buckets at these levels, (tenant, "r" | "t") -> level (a fail-open
        fallback starts from the last levels seen in the shared store, not full)."""
        self.buckets.seed(levels, self.clock.now_s())

    def seed_counters(self, counters: dict[str, float]) -> None:
        """Start from known counters (the fail-open fallback takes Redis's last values)."""
        self.vtc.seed(counters)

    async def put_tenant(self, cfg: TenantConfig) -> None:
        self.tenants[cfg.tenant_id] = tenant_fields(cfg)

    async def snapshot(self) -> StoreSnapshot:
        now_s = self.clock.now_s()
        self._expire(now_s)
        backlog: dict[str, set[str]] = {}
        for replica, tenant in self.backlog:
            backlog.setdefault(tenant, set()).add(replica)
        levels, ages = self.buckets.snapshot(now_s)
        return StoreSnapshot(
            in_flight=self.engine.requests,
            in_flight_kv_tokens=self.engine.kv_tokens,
            concurrency={t: self.engine.requests_of(t) for t in self.engine.tenants()},
            counters=dict(self.vtc.values),
            leases=set(self.leases),
            backlog=backlog,
            bucket_levels=levels,
            bucket_ages_s=ages,
        )

    async def ping(self) -> None:
        return None

    async def aclose(self) -> None:
        return None
