"""The dispatcher of replicas that share their scheduling state in a `Store` (Redis).

Same front door as `Dispatcher` (`admit` / `on_output_tokens` / `finish`),
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

The dispatcher composes objects that each own their state: the `Outbox`
(settlements and batched charges owed to the store, shared_outbox.py), the
`Pump` (the task, due times, building and applying steps, shared_pump.py),
the `FailoverController` (health, the fail-open fallback, the probe and the
reconciliation, shared_failover.py), and the local queues and entries
(shared_local.py). The dispatcher itself keeps the per-request bookkeeping —
admit, start, drop, settle — which the pump and the controller reach through
the small protocols `Offers` and `ReplicaView`. Options: shared_options.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Iterable, Mapping, Set
from dataclasses import replace

from scheduler import rules
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.errors import (
    QuotaExceeded,
    RequestTooLarge,
    SchedulingError,
    StoreUnavailable,
)
from scheduler.gate import Admission, RequestState
from scheduler.gate_stats import GateStats, TenantBuckets, stored_buckets
from scheduler.idle import IdleTenants
from scheduler.quotas import BucketLimits, bucket_exceeded, check_arrival
from scheduler.request import QueuedRequest
from scheduler.shared import fleet_usage
from scheduler.shared.failover import FailoverController
from scheduler.shared.local import Entries, Entry, LocalQueues, Place
from scheduler.shared.options import FailureMode, QuotaView, SharedOptions, StoreHealth
from scheduler.shared.outbox import Outbox
from scheduler.shared.pump import Pump
from scheduler.shared.stats import GateTotals, Refusal, SharedStats
from scheduler.state.store import BucketReader, Candidate, Lease, SeenLevel, Settlement, Step, Store
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import AsyncioTimers, Timers

__all__ = ["FailureMode", "SharedDispatcher", "SharedOptions", "StoreHealth"]


class SharedDispatcher:
    def __init__(
        self,
        store: Store,
        limits: AdmissionLimits,
        clock: Clock,
        options: SharedOptions,
        *,
        tenants: TenantRegistry | None = None,
        timers: Timers | None = None,
    ) -> None:
        """`timers`: wake-ups on `clock` (default: the running event loop's)."""
        self.store = store
        self.clock = clock
        self.timers: Timers = timers or AsyncioTimers(clock)
        self.options = options
        self.replica_id = options.replica_id
        self.quotas = QuotaView(tenants or TenantRegistry.permissive())
        # This replica's in-flight requests (the fleet's count lives in the store).
        self.budget = AdmissionBudget(limits)
        self.admitted_total = 0
        self.lent_total = 0
        self._local = LocalQueues(options.batch_every_n, options.light_credit)
        self._entries = Entries()
        self._seq = itertools.count(1)
        self._outbox = Outbox(options.flush_s)
        self._failover = FailoverController(store, clock, options, self._outbox, self)
        self._pump = Pump(
            store,
            clock,
            self.timers,
            options,
            budget=self.budget,
            local=self._local,
            entries=self._entries,
            outbox=self._outbox,
            failover=self._failover,
            offers=self,
        )
        self._stats = SharedStats(clock)  # what stats() reports besides the above
        self._idle = IdleTenants(options.idle_ttl_s, clock.now_s())
        self.forgotten_total = 0

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
    def idle(self) -> bool:
        """The pump waits with nothing owed or due (tests settle on it)."""
        return self._pump.idle

    @property
    def queued(self) -> int:
        return len(self._local)

    @property
    def in_flight(self) -> int:
        return self.budget.engine.requests

    @property
    def pending_settlements(self) -> int:
        """Settlements not yet handed to the shared store."""
        return len(self._outbox.settlements)

    @property
    def paused_tenants(self) -> dict[str, float]:
        return dict(self._local.paused_until)

    def set_limits(self, limits: AdmissionLimits) -> None:
        self.budget.limits = limits
        self._pump.kick()

    def set_tenants(self, tenants: TenantRegistry) -> None:
        self.quotas.tenants = tenants
        self._local.paused_until.clear()
        self._pump.kick()

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
            self._drop(entry, RequestState.REJECTED)
            entry.fut.set_exception(exc)

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
        return fleet_usage.encode(self.stats().tenants)

    def buckets_of(self, tenant_id: str) -> BucketLimits:
        try:
            return BucketLimits.of(self.quotas.tenants.resolve(tenant_id).quotas)
        except SchedulingError:  # no longer served: no buckets to start
            return BucketLimits()

    # -- arrival -----------------------------------------------------------------
    async def admit(self, req: QueuedRequest) -> None:
        """Wait until `req` is admitted fleet-wide, or raise a SchedulingError."""
        if self.health.mode == "closed":
            raise StoreUnavailable("the shared state store is unreachable; retry later")
        self._sweep_idle()
        cfg = self.quotas.tenants.resolve(req.tenant_id, req.priority)
        req.tenant_id = cfg.tenant_id
        buckets = BucketLimits.of(cfg.quotas)
        try:
            check_arrival(cfg, req, self._local.queued(cfg.tenant_id), " on this replica")
        except (RequestTooLarge, QuotaExceeded) as exc:
            self._refused(exc)
            raise
        q = cfg.quotas
        req.seq = next(self._seq)
        req.arrival_s = self.clock.now_s()
        loop = asyncio.get_running_loop()
        entry = Entry(req, cfg, f"{self.replica_id}:{req.seq}", loop.create_future(), buckets)
        if cfg.over_quota == "reject" and buckets.any:
            await self._reserve(entry)
        self._entries.add(entry)
        self.quotas.open_reservations += 1
        self._local.push(req)
        self._idle.drop(req.tenant_id)
        self._outbox.forget.pop(req.tenant_id, None)
        # Deadlines are the gRPC layer's (it cancels the call).
        expires_s = rules.queue_expiry_s(req.arrival_s, q.max_queue_wait_s, None)
        if expires_s is not None:
            entry.expiry = self.timers.call_at(expires_s, lambda: self._expire(entry))
        self._pump.kick()
        try:
            await entry.fut
        except asyncio.CancelledError:
            if entry.started:
                self.finish(req)  # admitted in the same tick the caller was cancelled
            elif entry.queued:
                self._drop(entry, RequestState.CANCELLED)
            raise

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

    def _expire(self, entry: Entry) -> None:
        if not entry.wanted:
            return
        req = entry.req
        error = rules.queue_expired(
            req.request_id,
            req.tenant_id,
            req.arrival_s,
            self.clock.now_s(),
            entry.cfg.quotas.max_queue_wait_s,
            None,  # deadlines are the gRPC layer's (it cancels the call)
        )
        self._drop(entry, RequestState.EXPIRED)
        self._stats.expired_total += 1
        entry.fut.set_exception(error)

    def _drop(self, entry: Entry, to: RequestState) -> None:
        """Withdraw a queued entry: give back what it reserved."""
        entry.withdraw(to)
        self._local.remove(entry.req)
        self.quotas.open_reservations -= 1
        if self._pump.awaiting(entry.lease_id):
            return  # the step in flight may admit it; `after_offer` settles it then
        self._forget(entry)
        if entry.requests_taken or entry.tokens_taken:
            self._settle(entry)
        self._note_idle(entry.req.tenant_id)
        # Its tenant's next request may be the head now, and fit where it did not
        # (the Dispatcher pumps on a cancel too).
        self._pump.kick()

    # -- in flight -----------------------------------------------------------------
    def on_cached_tokens(self, req: QueuedRequest, reported: int) -> None:
        entry = self._entries.of(req)
        if entry is None or not entry.started:
            return
        o = self.options
        w_cached = rules.cached_weight(o.w_in, o.w_cached)
        delta = rules.cached_shortfall(
            o.w_in, w_cached, req.cached_estimate, reported, entry.cfg.weight
        )
        if delta > 0:
            self._charged(req.tenant_id, delta)

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        entry = self._entries.of(req)
        if entry is None or not entry.started or tokens <= 0:
            return
        entry.streamed(tokens)
        self._charged(
            req.tenant_id, rules.output_charge(self.options.w_out, tokens, entry.cfg.weight)
        )

    def _charged(self, tenant_id: str, delta: float) -> None:
        """A weighted charge after admission: mirrored here, owed to the store."""
        self._local.mirror[tenant_id] = self._local.mirror.get(tenant_id, 0.0) + delta
        self._failover.charge_locally(tenant_id, delta)
        if self._outbox.charge_output(tenant_id, delta, self.clock.now_s()):
            self._pump.wake()

    def finish(self, req: QueuedRequest) -> None:
        """The admitted request left the engine (done, cancelled or failed)."""
        entry = self._entries.of(req)
        if entry is None or not entry.started:
            raise AssertionError(f"finish({req.request_id!r}) for a request not in flight")
        self._forget(entry)
        self.budget.release(req)
        self.quotas.open_reservations -= 1
        self._settle(entry)
        entry.state = RequestState.SETTLED
        self._local.resume(req.tenant_id)  # it may have waited for max_concurrent
        self._note_idle(req.tenant_id)
        self._pump.kick()

    # -- idle tenants (scheduler/idle.py) -----------------------------------------
    def _refused(self, exc: Refusal) -> Refusal:
        """Count a refusal at arrival (its tenant's totals are state too)."""
        self._note_idle(exc.tenant_id)
        return self._stats.tally.refused(exc)

    def _note_idle(self, tenant_id: str) -> None:
        if not self._local.queued(tenant_id):
            self._idle.note(tenant_id, self.clock.now_s())

    def _sweep_idle(self) -> None:
        """Forget the unconfigured tenants idle here for the idle TTL; the store
        forgets them too where they are idle fleet-wide (Step.forget)."""
        busy: set[str] | None = None  # queued or in flight here (built when one is due)

        def keep(t: str) -> bool:
            nonlocal busy
            if busy is None:
                busy = {e.req.tenant_id for e in self._entries}
            return t in busy or self.quotas.tenants.configured(t)

        self.forgotten_total += self._idle.sweep(self.clock.now_s(), keep, self._forget_tenant)

    def _forget_tenant(self, t: str) -> bool:
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
        self, admitted: list[str], step: Step, decided_by: Place, lent: Set[str] = frozenset()
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
                entry.req.light = rules.light(c.queued)

                entry.req.lent = c.lease_id in lent
                self.lent_total += entry.req.lent
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
                self._note_idle(c.tenant_id)

    def give_back(self, c: Candidate) -> None:
        requests, tokens = (0.0, 0.0)
        entry = self._entries.get(c.lease_id)
        if entry is not None and c.take_buckets:
            requests, tokens = entry.taken(float(c.sent_tokens))
        self._outbox.settle(Settlement(c.lease_id, c.tenant_id, requests, tokens, c.buckets))
        if entry is not None and entry.queued:
            # A settled lease id is never opened again: a new one for the next offer.
            self._entries.remove(entry)
            entry.lease_id = f"{self.replica_id}:{next(self._seq)}"
            self._entries.add(entry)

    def _start(self, entry: Entry) -> None:
        if not entry.wanted:
            # Its caller left while the decision was made: give the lease and all it took back.
            if entry.queued:
                entry.withdraw(RequestState.CANCELLED)
                self._local.remove(entry.req)
                self.quotas.open_reservations -= 1
            self._forget(entry)
            self._settle(entry)
            return
        self._local.remove(entry.req, admitted=True)
        entry.start()
        self.budget.reserve(entry.req)
        self.admitted_total += 1
        entry.fut.set_result(None)

    # -- the front door and its stats (scheduler/gate.py) ----------------------------
    def admitted(self, req: QueuedRequest) -> Admission:
        """`async with dispatcher.admitted(req) as ticket:` (see scheduler/gate.py)."""
        return Admission(self, req)

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
        t = self.stats(include=(tenant_id,)).tenant(tenant_id)
        return (t.request_bucket, t.token_bucket) if t is not None else (None, None)

    def stats(self, include: Iterable[str] = (), fleet: bool = False) -> GateStats:
        """Live state for admin and telemetry (see shared/stats.py)."""
        return self._stats.build(
            list(self._entries),
            self._local,
            self.quotas.tenants,
            self.budget,
            GateTotals(
                self.admitted_total, self.reserve_holds_total, self.health.mode, self.lent_total
            ),
            include,
            fleet,
        )


def _seen_buckets(limits: BucketLimits, seen: Mapping[str, SeenLevel]) -> TenantBuckets:
    """A tenant's buckets from the levels the store read just now (`BucketReader`)."""
    r, t = seen.get("r"), seen.get("t")
    return stored_buckets(
        limits,
        (r.level if r else None, t.level if t else None),
        (r.age_s if r else None, t.age_s if t else None),
    )
