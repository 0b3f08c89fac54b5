"""The admission state of replicas that share it in a `Store` (Redis).

The front door and every request's bookkeeping are `Dispatcher`'s
(scheduler/dispatcher.py; `shared_dispatcher` builds one over this state),
but admission is decided fleet-wide: an async pump task sends the store one
`Step` per iteration — pending settlements, batched output charges, backlog
changes, heartbeat renewals, and the heads of this replica's eligible tenants
— and the store (one Lua script in Redis) picks the head whose tenant has the
smallest counter and whose quotas allow it, if the engine has room across the
whole fleet. One round trip per admission decision; settlements and charges
ride along, or go alone when no decision is due.

Output tokens are charged per replica in batches (every `flush_s`, or with
the next step): another replica sees a tenant's counter up to `flush_s` late,
which widens the VTC bound by the weighted output the fleet produces in one
flush interval (see docs/architecture.md for the measurement).

While the engine is full, a replica learns of room freed by other replicas by
polling (`poll_s`); its own finishes wake it at once. Tenants over their
fleet-wide quota are paused locally until the store says they may go.

`SharedAdmission` composes objects that each own their state: the `Outbox`
(settlements and batched charges owed to the store, outbox.py), the `Pump`
(the task, due times, building and applying steps, pump.py), the
`FailoverController` (health, the fail-open fallback, the probe and the
reconciliation, failover.py), and the local queues and lease-keyed entries
(local.py). It keeps where each request's lease and bucket charges live —
start, withdraw, settle — which the pump and the controller reach through
the small protocols `Offers` and `ReplicaView`. Options: options.py.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Iterable, Mapping, Set
from dataclasses import replace

from scheduler import rules
from scheduler.admission_port import AdmissionWaiter, Door, GateTotals
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.dispatcher import Dispatcher
from scheduler.errors import (
    QuotaExceeded,
    RequestTooLarge,
    SchedulingError,
    StoreUnavailable,
)
from scheduler.gate import RequestState
from scheduler.gate_stats import GateStats, StoreMode, TenantBuckets, stored_buckets
from scheduler.quotas import BucketLimits, bucket_exceeded, check_arrival
from scheduler.request import QueuedRequest
from scheduler.shared import fleet_usage
from scheduler.shared.failover import FailoverController
from scheduler.shared.local import Entries, Entry, LocalQueues, Place
from scheduler.shared.options import FailureMode, QuotaView, SharedOptions, StoreHealth
from scheduler.shared.outbox import Outbox
from scheduler.shared.pump import Pump
from scheduler.shared.stats import Refusal, SharedStats
from scheduler.state.store import BucketReader, Candidate, Lease, SeenLevel, Settlement, Step, Store
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import AsyncioTimers, Timers

__all__ = [
    "FailureMode",
    "SharedAdmission",
    "SharedDispatcher",
    "SharedOptions",
    "StoreHealth",
    "shared_dispatcher",
]


class SharedAdmission:
    """`AdmissionState` shared through a `Store` (scheduler/admission_port.py)."""

    def __init__(
        self,
        store: Store,
        limits: AdmissionLimits,
        clock: Clock,
        options: SharedOptions,
        timers: Timers,
        *,
        tenants: TenantRegistry | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.options = options
        self.replica_id = options.replica_id
        self.quotas = QuotaView(tenants or TenantRegistry.permissive())
        # This replica's in-flight requests (the fleet's count lives in the store).
        self.budget = AdmissionBudget(limits)
        self._local = LocalQueues(options.batch_every_n, options.light_credit)
        self._entries = Entries()
        self._lease_seq = 0
        self._outbox = Outbox(options.flush_s)
        self._failover = FailoverController(store, clock, options, self._outbox, self)
        self._pump = Pump(
            store,
            clock,
            timers,
            options,
            budget=self.budget,
            local=self._local,
            entries=self._entries,
            entry_of=lambda req: self.door.entry_of(req),
            outbox=self._outbox,
            failover=self._failover,
            offers=self,
        )
        self._stats = SharedStats(clock)  # what stats() reports besides the door's totals
        self.door: Door[Entry]

    def bind(self, door: Door[Entry]) -> None:
        self.door = door

    # -- life cycle ------------------------------------------------------------
    async def start(self) -> None:
        for cfg in self.quotas.tenants:
            with contextlib.suppress(StoreUnavailable):
                await self.store.put_tenant(cfg)
        self._pump.start()

    async def aclose(self) -> None:
        """Stop the pump; hand the store what is pending (settlements, charges)."""
        await self._pump.stop()
        await self.store.aclose()

    @property
    def health(self) -> StoreHealth:
        return self._failover.health

    @property
    def mode(self) -> StoreMode:
        return self.health.mode

    @property
    def decisions_total(self) -> int:
        return self._pump.decisions_total

    @property
    def reserve_holds_total(self) -> int:
        return self._pump.reserve_holds_total

    @property
    def fail_open_divisor(self) -> int:
        """Replicas sharing the limits if the store failed now (live ones, at least
        `options.replicas`)."""
        return self._failover.divisor

    @property
    def pump_restarts_total(self) -> int:
        """Times the pump task died of an unexpected error and was restarted."""
        return self._pump.restarts_total

    @property
    def max_charge_lag(self) -> float:
        return self._pump.max_charge_lag

    @property
    def told_everything(self) -> bool:
        """Nothing left for the pump to tell the store (tests wait for it)."""
        return self._pump.told_everything

    @property
    def idle_pump(self) -> bool:
        """The pump waits with nothing owed or due (tests settle on it)."""
        return self._pump.idle

    @property
    def queued(self) -> int:
        return len(self._local)

    @property
    def pending_settlements(self) -> int:
        """Settlements not yet handed to the shared store."""
        return len(self._outbox.settlements)

    @property
    def paused_until(self) -> Mapping[str, float]:
        return self._local.paused_until

    def set_tenants(self, tenants: TenantRegistry) -> None:
        self.quotas.tenants = tenants
        self._local.resume_all()

    # -- what the failover controller and the pump see (ReplicaView, Offers) ---------
    @property
    def limits(self) -> AdmissionLimits:
        return self.budget.limits

    def in_flight_leases(self) -> list[Lease]:
        return self._entries.leases()

    def weights(self, tenants: Iterable[str]) -> dict[str, float]:
        """The tenants' weights, for the store's fair-share reserve."""
        return {t: self.quotas.tenants.weight_of(t) for t in tenants}

    def counters(self) -> dict[str, float]:
        return self._local.mirror

    def refuse_queued(self, exc: StoreUnavailable) -> None:
        for entry in [e for e in self._entries if e.wanted]:
            self.door.reject(entry, exc)

    def adopt_in_flight(self, renewed: list[Lease]) -> None:
        for lease in renewed:
            entry = self._entries.get(lease.lease_id)
            if entry is not None and entry.started:
                entry.lease_at = Place.SHARED  # its settlement releases the shared lease
            else:  # ended while the probe was away: release the lease it re-registered
                self._outbox.settle(Settlement(lease.lease_id, lease.tenant_id, 0.0, 0.0))
        self._pump.wake()

    def bucket_tenants(self) -> list[str]:
        tenants = {e.req.tenant_id for e in self._entries if e.buckets.any}
        tenants.update(c.tenant_id for c in self.quotas.tenants if BucketLimits.of(c.quotas).any)
        return sorted(tenants)

    def usage(self) -> bytes:
        return fleet_usage.encode(self.door.stats().tenants)

    def buckets_of(self, tenant_id: str) -> BucketLimits:
        try:
            return BucketLimits.of(self.quotas.tenants.resolve(tenant_id).quotas)
        except SchedulingError:  # no longer served: no buckets to start
            return BucketLimits()

    # -- arrival -----------------------------------------------------------------
    def _lease_id(self) -> str:
        self._lease_seq += 1
        return f"{self.replica_id}:{self._lease_seq}"

    def open(self, req: QueuedRequest, waiter: AdmissionWaiter) -> Entry:
        if self.health.mode == "closed":
            raise StoreUnavailable("the shared state store is unreachable; retry later")
        cfg = self.quotas.tenants.resolve(req.tenant_id, req.priority)
        req.tenant_id = cfg.tenant_id
        try:
            check_arrival(cfg, req, self._local.queued(cfg.tenant_id), " on this replica")
        except (RequestTooLarge, QuotaExceeded) as exc:
            raise self._stats.tally.refused(exc) from None
        buckets = BucketLimits.of(cfg.quotas)
        return Entry(req, waiter, cfg=cfg, lease_id=self._lease_id(), buckets=buckets)

    def reservation(self, entry: Entry) -> Awaitable[None] | None:
        if entry.cfg.over_quota == "reject" and entry.buckets.any:
            return self._reserve(entry)
        return None

    async def _reserve(self, entry: Entry) -> None:
        req = entry.req
        limit, wait_s = "", 0.0
        while self._failover.ok:
            started_s = self.clock.now_s()
            try:
                limit, wait_s = await self.store.reserve(
                    entry.lease_id, req.tenant_id, req.kv_tokens, entry.buckets
                )
            except StoreUnavailable as exc:
                if self._failover.failed(exc, started_s):
                    self._pump.kick()
                elif self._failover.ok:  # suspect: try again shortly
                    await asyncio.sleep(self._failover.backoff_s())
            else:
                self._failover.succeeded()
                entry.buckets_at = Place.SHARED
                self._failover.took(req.tenant_id, *entry.taken(float(req.kv_tokens)))
                break
        if self.health.mode == "closed":
            raise StoreUnavailable("the shared state store is unreachable; retry later")
        fb = self._failover.fallback
        if fb is not None:
            limit, wait_s = await fb.reserve(
                entry.lease_id, req.tenant_id, req.kv_tokens, self._failover.share(entry.buckets)
            )
        if wait_s > 0:
            raise self._refused(
                bucket_exceeded(req.tenant_id, entry.cfg.quotas, limit, wait_s, ", fleet-wide")
            )
        entry.requests_taken, entry.tokens_taken = entry.taken(float(req.kv_tokens))

    def _refused(self, exc: Refusal) -> Refusal:
        """Count a refusal at arrival (its tenant's totals are state too)."""
        return self._stats.tally.refused(exc)

    def queue(self, entry: Entry) -> None:
        self._entries.add(entry)
        self.quotas.open_reservations += 1
        self._local.push(entry.req)
        self._outbox.forget.pop(entry.req.tenant_id, None)

    def max_queue_wait_s(self, entry: Entry) -> float | None:
        return entry.cfg.quotas.max_queue_wait_s

    def _unqueue(self, entry: Entry) -> None:
        self._local.remove(entry.req)
        self.quotas.open_reservations -= 1

    def withdraw(self, entry: Entry) -> None:
        """Withdrawn while queued: give back what it reserved."""
        self._unqueue(entry)
        if self._pump.awaiting(entry.lease_id):
            return  # the step in flight may admit it; `after_offer` settles it then
        self._forget(entry)
        if entry.requests_taken or entry.tokens_taken:
            self._settle(entry)

    def decide(self) -> None:
        self._pump.kick()

    def resume(self, tenant_id: str) -> None:
        self._local.resume(tenant_id)

    # -- in flight -----------------------------------------------------------------
    def charge_cached(self, entry: Entry, reported: int) -> None:
        o = self.options
        w_cached = rules.cached_weight(o.w_in, o.w_cached)
        delta = rules.cached_shortfall(
            o.w_in, w_cached, entry.req.charged_cached, reported, entry.cfg.weight
        )
        if delta > 0:
            self._charged(entry.req.tenant_id, delta)

    def charge_output(self, entry: Entry, tokens: int) -> None:
        delta = rules.output_charge(self.options.w_out, tokens, entry.cfg.weight)
        self._charged(entry.req.tenant_id, delta)

    def _charged(self, tenant_id: str, delta: float) -> None:
        """A weighted charge after admission: mirrored here, owed to the store."""
        self._local.mirror[tenant_id] = self._local.mirror.get(tenant_id, 0.0) + delta
        self._failover.charge_locally(tenant_id, delta)
        if self._outbox.charge_output(tenant_id, delta, self.clock.now_s()):
            self._pump.wake()

    def release(self, entry: Entry) -> None:
        self._forget(entry)
        self.budget.release(entry.req)
        self.quotas.open_reservations -= 1
        self._settle(entry)
        self._local.resume(entry.req.tenant_id)  # it may have waited for max_concurrent

    # -- idle tenants (scheduler/idle.py) -----------------------------------------
    def idle(self, tenant_id: str) -> bool:
        return not self._local.queued(tenant_id)

    def keep(self, tenant_id: str) -> bool:
        """Queued or in flight here, or configured."""
        busy = any(e.req.tenant_id == tenant_id for e in self._entries)
        return busy or self.quotas.tenants.configured(tenant_id)

    def forget(self, t: str) -> bool:
        """Drop what the replica keeps; the store forgets the tenant too where it is
        idle fleet-wide (Step.forget)."""
        self._local.forget(t)
        self._pump.forget(t)
        self._stats.tally.forget(t)
        self._failover.forget(t)
        self._outbox.forget[t] = self.buckets_of(t)
        return True

    def _forget(self, entry: Entry) -> None:
        if self._entries.remove(entry):
            self._stats.ended(entry)

    def _settle(self, entry: Entry) -> None:
        """Give back the lease and the unused reservation, to whichever store holds them."""
        s = entry.settlement()
        none = replace(s, refund_requests=0.0, refund_tokens=0.0)
        buckets_shared = entry.buckets_at is Place.SHARED
        self._failover.settle_locally(none if buckets_shared else s)
        if entry.lease_at is Place.SHARED or buckets_shared:
            self._outbox.settle(s if buckets_shared else none)
        if buckets_shared:
            self._failover.took(s.tenant_id, -s.refund_requests, -s.refund_tokens)

    # -- decisions made (by the store, or the fail-open fallback) ---------------------
    def after_offer(
        self,
        admitted: list[str],
        step: Step,
        decided_by: Place,
        lent: Set[str] = frozenset(),
        light: Set[str] = frozenset(),
    ) -> None:
        """Start what was admitted, in the order decided (the engine queues in the
        order it is sent; its lease is where `decided_by` says); settle what was
        dropped while the step was away."""
        order = {lease_id: k for k, lease_id in enumerate(admitted)}
        decided = sorted(step.candidates, key=lambda c: order.get(c.lease_id, len(order)))
        for c in decided:
            entry = self._entries.get(c.lease_id)
            if entry is None:
                continue
            if c.lease_id in order:
                entry.lease_at = decided_by
                entry.req.light = c.lease_id in light
                entry.req.lent = c.lease_id in lent
                if c.take_buckets:
                    entry.buckets_at = entry.lease_at
                    entry.requests_taken, entry.tokens_taken = entry.taken(float(c.sent_tokens))
                    if entry.buckets_at is Place.SHARED:
                        self._failover.took(c.tenant_id, entry.requests_taken, entry.tokens_taken)
                self._start(entry)
            elif entry.withdrawn:
                self._forget(entry)
                if entry.requests_taken or entry.tokens_taken:
                    self._settle(entry)

    def give_back(self, c: Candidate) -> None:
        requests, tokens = (0.0, 0.0)
        entry = self._entries.get(c.lease_id)
        if entry is not None and c.take_buckets:
            requests, tokens = entry.taken(float(c.sent_tokens))
        self._outbox.settle(Settlement(c.lease_id, c.tenant_id, requests, tokens, c.buckets))
        if entry is not None and entry.queued:
            # A settled lease id is never opened again: a new one for the next offer.
            self._entries.remove(entry)
            entry.lease_id = self._lease_id()
            self._entries.add(entry)

    def _start(self, entry: Entry) -> None:
        if not entry.wanted:
            # Its caller left while the decision was made: give the lease and all it took back.
            if entry.queued:
                self.door.discard(entry, RequestState.CANCELLED)
                self._unqueue(entry)
            self._forget(entry)
            self._settle(entry)
            return
        self._local.remove(entry.req, admitted=True)
        self.budget.reserve(entry.req)
        self.door.started(entry)

    # -- stats ----------------------------------------------------------------------
    async def refresh_stats(self) -> None:
        """Read the store's fleet-wide state (bucket levels, counters, the other
        replicas' usage) for stats()."""
        await self._stats.refresh(self.store, self.options.replica_id)

    async def tenant_buckets(self, tenant_id: str) -> TenantBuckets:
        # A failing store is not asked (each read would wait out its timeout): the
        # last snapshot's levels, refilled over their age, until it is back.
        if isinstance(self.store, BucketReader) and self.health.mode == "ok":
            cfg = self.quotas.tenants.get(tenant_id)
            if cfg is None:
                return None, None
            with contextlib.suppress(StoreUnavailable):
                seen = await self.store.bucket_levels(tenant_id)
                return _seen_buckets(BucketLimits.of(cfg.quotas), seen)
        t = self.door.stats(include=(tenant_id,)).tenant(tenant_id)
        return (t.request_bucket, t.token_bucket) if t is not None else (None, None)

    def stats(self, totals: GateTotals, include: Iterable[str], fleet: bool) -> GateStats:
        """Live state for admin and telemetry (see shared/stats.py)."""
        return self._stats.build(
            list(self._entries),
            self._local,
            self.quotas.tenants,
            self.budget,
            totals,
            include,
            fleet,
        )


SharedDispatcher = Dispatcher[Entry, SharedAdmission]


def shared_dispatcher(
    store: Store,
    limits: AdmissionLimits,
    clock: Clock,
    options: SharedOptions,
    *,
    tenants: TenantRegistry | None = None,
    timers: Timers | None = None,
) -> SharedDispatcher:
    """A replica's dispatcher over `store`; `timers`: wake-ups on `clock` (default:
    the running event loop's). Call `start()` before the first request."""
    timers = timers or AsyncioTimers(clock)
    state = SharedAdmission(store, limits, clock, options, timers, tenants=tenants)
    return Dispatcher(state, clock, timers=timers, idle_ttl_s=options.idle_ttl_s)


def _seen_buckets(limits: BucketLimits, seen: Mapping[str, SeenLevel]) -> TenantBuckets:
    """A tenant's buckets from the levels the store read just now (`BucketReader`)."""
    r, t = seen.get("r"), seen.get("t")
    return stored_buckets(
        limits,
        (r.level if r else None, t.level if t else None),
        (r.age_s if r else None, t.age_s if t else None),
    )
