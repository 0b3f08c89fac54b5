"""`stats()` of a replica sharing a store (`SharedAdmission`): what it knows and
what the store holds.

This replica knows its queued and in-flight requests, a mirror of the fleet's
counters (updated by every step and by its own output charges) and the totals
of what ended or was refused here (`TenantTally`). The token buckets live in
the store: `refresh` reads its snapshot (one Redis round trip plus a SCAN of
the bucket keys, so only on demand: admin `GetUsage` awaits it) and `build`
reports each level refilled over its age, on the store's clock. `refresh`
also reads the other live replicas' published usage, which `build(fleet=True)`
adds to this replica's (fleet_usage.py).
"""

from __future__ import annotations

import contextlib
from collections import Counter
from collections.abc import Iterable
from typing import TypeVar

from scheduler.admission_port import GateTotals
from scheduler.budget import AdmissionBudget
from scheduler.clock import Clock
from scheduler.errors import QuotaExceeded, RequestTooLarge, StoreUnavailable
from scheduler.gate_stats import BucketStats, GateStats, TenantStats, stored_buckets
from scheduler.quotas import BucketLimits, UsageTotals
from scheduler.shared import fleet_usage
from scheduler.shared.fleet_usage import ReplicaUsage
from scheduler.shared.local import Entry, LocalQueues
from scheduler.state.store import FleetObserver, Store, StoreSnapshot
from scheduler.tenancy.tenants import TenantRegistry

Refusal = TypeVar("Refusal", bound=QuotaExceeded | RequestTooLarge)


class TenantTally:
    """Per-tenant totals of requests that ended (or were refused) on this replica; the
    single-replica `Dispatcher` keeps the same totals in its `QuotaLedger`."""

    def __init__(self) -> None:
        self._by_tenant: dict[str, UsageTotals] = {}

    def _of(self, tenant_id: str) -> UsageTotals:
        t = self._by_tenant.get(tenant_id)
        if t is None:
            t = self._by_tenant[tenant_id] = UsageTotals()
        return t

    def refused(self, exc: Refusal) -> Refusal:
        """Count a refusal at arrival; returns `exc` for `raise tally.refused(...)`."""
        self._of(exc.tenant_id).refused(exc.limit)
        return exc

    def ended(self, tenant_id: str, charged_requests: float, charged_tokens: float) -> None:
        """A request ended; what it kept of the buckets (net of its refund)."""
        t = self._of(tenant_id)
        t.finished_total += 1
        t.charged(charged_requests, charged_tokens)

    def tenants(self) -> list[str]:
        return list(self._by_tenant)

    def forget(self, tenant_id: str) -> None:
        self._by_tenant.pop(tenant_id, None)

    def get(self, tenant_id: str) -> UsageTotals:
        """A copy of the tenant's totals (zeros if it has none)."""
        t = self._by_tenant.get(tenant_id)
        return UsageTotals() if t is None else t.copy()


class SharedStats:
    def __init__(self, clock: Clock) -> None:
        self.clock = clock
        self.tally = TenantTally()
        # The store's last snapshot and the local time it was taken.
        self._snapshot: tuple[StoreSnapshot, float] | None = None
        # The other live replicas' usage as last read: replica -> tenant -> usage.
        self._others: dict[str, dict[str, ReplicaUsage]] = {}

    def ended(self, entry: Entry) -> None:
        """An entry is gone: count what it kept of its tenant's buckets (its
        settlement refunds the rest, see `Entry.settlement`)."""
        tid = entry.req.tenant_id
        if not entry.started:
            self.tally.ended(tid, 0.0, 0.0)
            return
        unused = entry.req.max_tokens - entry.output_tokens if entry.tokens_taken else 0
        self.tally.ended(tid, entry.requests_taken, entry.tokens_taken - unused)

    async def refresh(self, store: Store, replica_id: str) -> None:
        """Take the store's snapshot and the other replicas' usage; keep the previous
        ones while it is unreachable."""
        with contextlib.suppress(StoreUnavailable):
            snap = await store.snapshot()
            self._snapshot = (snap, self.clock.now_s())
            if isinstance(store, FleetObserver):
                published = await store.fleet_usage()
                self._others = {
                    r: fleet_usage.decode(blob) for r, blob in published.items() if r != replica_id
                }

    def build(
        self,
        entries: list[Entry],
        local: LocalQueues,
        registry: TenantRegistry,
        budget: AdmissionBudget,
        totals: GateTotals,
        include: Iterable[str] = (),
        fleet: bool = False,
    ) -> GateStats:
        """Buckets as of the last `refresh` (None before it), counters as of the last
        step or local charge. Copies before it iterates (metric reader's thread).
        `fleet`: per tenant, add the other replicas' usage as of the last `refresh`."""
        now_s = self.clock.now_s()
        cached = self._snapshot
        snap, taken_s = cached if cached is not None else (None, now_s)
        elapsed_s = max(0.0, now_s - taken_s)
        mirror = dict(local.mirror)
        paused = set(local.paused_until)
        # Per tenant: requests in flight here, and what live requests hold of the buckets.
        in_flight: Counter[str] = Counter()
        live: dict[str, tuple[float, float]] = {}
        for e in entries:
            tid = e.req.tenant_id
            in_flight[tid] += e.started
            r, t = live.get(tid, (0.0, 0.0))
            live[tid] = (r + e.requests_taken, t + e.tokens_taken)
        others = list(self._others.values()) if fleet else []
        names = {*self.tally.tenants(), *live, *include}
        for usage in others:
            names.update(usage)
        if snap is not None:
            names.update(snap.counters, snap.bucket_levels, snap.concurrency)
        out = []
        for tid in sorted(names):
            cfg = registry.get(tid)
            buckets: tuple[BucketStats | None, BucketStats | None] = (None, None)
            if cfg is not None and snap is not None:
                age_r, age_t = snap.bucket_ages_s.get(tid, (None, None))
                buckets = stored_buckets(
                    BucketLimits.of(cfg.quotas),
                    snap.bucket_levels.get(tid),
                    (
                        None if age_r is None else age_r + elapsed_s,
                        None if age_t is None else age_t + elapsed_s,
                    ),
                )
            ended = self.tally.get(tid)
            live_r, live_t = live.get(tid, (0.0, 0.0))
            # Counters only grow (charges, lifts): the larger copy is the fresher.
            counter = max(mirror.get(tid, 0.0), snap.counters.get(tid, 0.0) if snap else 0.0)
            mine = TenantStats(
                tenant_id=tid,
                weight=registry.weight_of(tid),
                virtual_counter=counter,
                queued=local.queued(tid),
                in_flight=in_flight[tid],
                request_bucket=buckets[0],
                token_bucket=buckets[1],
                charged_requests=ended.charged_requests + live_r,
                charged_tokens=ended.charged_tokens + live_t,
                rejected_total=ended.rejected_total,
                rejections=ended.rejections,
                finished_total=ended.finished_total,
                paused=tid in paused,
            )
            out.append(fleet_usage.add(mine, (u[tid] for u in others if tid in u)))
        return GateStats(
            in_flight=budget.engine.requests,
            in_flight_kv_tokens=budget.engine.kv_tokens,
            limits=budget.limits,
            queued=len(local),
            admitted_total=totals.admitted_total,
            expired_total=totals.expired_total,
            store=totals.store,
            reserve_holds_total=totals.reserve_holds_total,
            tenants=tuple(out),
            lent_total=totals.lent_total,
            replicas=1 + len(others),
        )
