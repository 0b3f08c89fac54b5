"""Store failure and recovery: the half of `SharedDispatcher` that runs without the store.

`failure_mode` "open" continues with a local `MemoryStore` holding this
replica's share of the limits (buckets and engine room ÷ `replicas`) and
local fairness; "closed" refuses new requests with StoreUnavailable
(UNAVAILABLE) and rejects the queued ones. Either way, streams in flight
continue; their settlements wait. When the store answers again (`_probe`,
every `retry_s`), the replica reconciles: replays settlements (idempotent),
sends the counter charges it owes, re-registers every in-flight request's
lease, and resumes. Every transition is logged and counted in `health`.

A mixin: `SharedDispatcher` (shared_dispatcher.py) owns the state declared
below and the bookkeeping methods declared abstract here.
"""

from __future__ import annotations

import asyncio
import logging
import math
from abc import ABC, abstractmethod
from collections.abc import Iterable

from scheduler import rules
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.errors import StoreUnavailable
from scheduler.memory_store import MemoryStore
from scheduler.request import QueuedRequest
from scheduler.shared_local import Entry, LocalQueues
from scheduler.shared_options import Pending, QuotaView, SharedOptions, StoreHealth
from scheduler.store import BucketLimits, Lease, Step, Store
from scheduler.timers import Timers

# The dispatcher's logger: operators filter on one name for the whole replica.
log = logging.getLogger("scheduler.shared_dispatcher")


class SharedFailover(ABC):
    # State owned by SharedDispatcher.
    store: Store
    clock: Clock
    timers: Timers
    options: SharedOptions
    replica_id: str
    budget: AdmissionBudget
    health: StoreHealth
    quotas: QuotaView
    reserve_holds_total: int
    _local: LocalQueues
    _entries: dict[str, Entry]
    _shared: Pending
    _announced: set[str]
    _full_until_s: float
    _next_heartbeat_s: float
    _next_probe_s: float
    _fallback: MemoryStore | None
    _wake: asyncio.Event

    # Bookkeeping implemented by SharedDispatcher.
    @abstractmethod
    def _lease_of(self, req: QueuedRequest) -> str: ...

    @abstractmethod
    def _drop(self, entry: Entry) -> None: ...

    @abstractmethod
    def _take_pending(self, step: Step) -> Step: ...

    @abstractmethod
    def _after_offer(self, admitted: list[str], step: Step) -> None: ...

    def _new_step(self, limits: AdmissionLimits) -> Step:
        o = self.options
        return Step(limits, w_in=o.w_in, reserve_fraction=o.reserve_fraction)

    def _weights(self, tenants: Iterable[str]) -> dict[str, float]:
        """The tenants' weights, for the store's fair-share reserve."""
        return {t: self.quotas.tenants.weight_of(t) for t in tenants}

    def _share(self, buckets: BucketLimits) -> BucketLimits:
        return buckets.share(self.options.replicas)

    def _went_down(self, exc: StoreUnavailable) -> None:
        if self.health.mode != "ok":
            return
        mode = self.options.failure_mode
        self.health.mode = mode
        self.health.transitions_total += 1
        self.health.last_error = str(exc)
        self._next_probe_s = self.clock.now_s() + self.options.retry_s
        log.warning(
            "shared store unavailable (%s): failing %s (%s)",
            exc,
            mode,
            f"local limits ÷ {self.options.replicas} replicas"
            if mode == "open"
            else "new requests get UNAVAILABLE",
        )
        if mode == "open":
            fb = MemoryStore(self.clock, lease_ttl_s=math.inf)
            fb.seed_counters(self._local.mirror)
            renew = [
                Lease(e.lease_id, e.req.tenant_id, e.req.kv_tokens)
                for e in self._entries.values()
                if e.started
            ]
            weights = self._weights({lease.tenant_id for lease in renew})
            fb.step_now(self.replica_id, Step(self.budget.limits, renew=renew, weights=weights))
            self._fallback = fb
            self._full_until_s = -math.inf
            return
        for entry in [e for e in self._entries.values() if e.queued and e.wanted]:
            self._drop(entry)
            entry.fut.set_exception(
                StoreUnavailable("the shared state store became unreachable while queued")
            )

    def _local_limits(self) -> AdmissionLimits:
        lim, n = self.budget.limits, max(1, self.options.replicas)
        return AdmissionLimits(max(1, lim.max_requests // n), max(1, lim.max_kv_tokens // n))

    def _local_tick(self) -> None:
        """Fail-open: decide against the local fallback, this replica's share of everything."""
        fb = self._fallback
        assert fb is not None
        while True:
            heads = self._local.heads(self.options.max_candidates)
            if not heads:
                return
            entries = [self._entries[self._lease_of(h)] for h in heads]
            cands = [e.candidate(self._share(e.buckets)) for e in entries]
            step = self._new_step(self._local_limits())
            step.candidates = cands
            out = fb.step_now(self.replica_id, step)
            now_s = self.clock.now_s()
            self._local.mirror.update(out.counters)
            for i, wait_s in out.blocked.items():
                until = now_s + (self.options.poll_s if math.isinf(wait_s) else wait_s)
                self._local.pause(cands[i].tenant_id, until)
            self.reserve_holds_total += len(out.held)
            if out.admitted is None:
                if out.full:
                    self._full_until_s = math.inf  # a local finish kicks the pump
                elif out.held:
                    self._full_until_s = now_s + self.options.poll_s
                return
            entry = entries[out.admitted]
            c = cands[out.admitted]
            entry.in_shared = False
            self._shared.charge(
                c.tenant_id, rules.admission_charge(self.options.w_in, c.prompt_tokens, c.weight)
            )
            self._after_offer([c.lease_id], step)

    async def _probe(self) -> None:
        """Try the store; if it answers, reconcile and go back to shared decisions."""
        self._next_probe_s = self.clock.now_s() + self.options.retry_s
        in_flight = [e for e in self._entries.values() if e.started]
        step = self._take_pending(self._new_step(self.budget.limits))
        step.renew = [Lease(e.lease_id, e.req.tenant_id, e.req.kv_tokens) for e in in_flight]
        step.weights = self._weights({e.req.tenant_id for e in in_flight})
        step.backlogged = []
        try:
            out = await self.store.step(self.replica_id, step)
        except StoreUnavailable:
            self._shared.settlements[:0] = step.settlements
            for tenant, delta in step.charges.items():
                self._shared.charge(tenant, delta)
            return
        for e in in_flight:
            e.in_shared = True  # adopted: its settlement releases the shared lease
        was = self.health.mode
        self.health.mode = "ok"
        self.health.transitions_total += 1
        self.health.reconciled_settlements += out.settled
        self.health.reconciled_leases += len(step.renew)
        self._fallback = None
        self._announced = set()
        self._next_probe_s = math.inf
        self._next_heartbeat_s = self.clock.now_s() + self.options.heartbeat_s
        self._full_until_s = -math.inf
        self._local.mirror.update(out.counters)
        log.warning(
            "shared store back after failing %s: reconciled %d settlements, %d leases",
            was,
            out.settled,
            len(step.renew),
        )
        self._wake.set()
