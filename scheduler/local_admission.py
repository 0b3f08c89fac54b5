"""The admission state in memory: one process decides alone.

The policy's queues (heaps: O(log n) per head, no offer cap), the
`QuotaLedger` (caps, queue slots and buckets at arrival, concurrency and
wait-mode buckets before each admission, settled exactly once), the
`FairShareReserve` and the `AdmissionBudget`, decided by a synchronous
`decision.admit_round` on every event (`decide`): work-conserving by
construction, it never leaves room idle while the policy's next eligible
request fits. A tenant whose head may not start yet is paused in the policy
(it keeps its place) and resumed by a wake-up of the front door at the time
its buckets allow, or by its next finish when it is at max_concurrent. A
round held for the fair-share reserve runs again when the activity window
that held it ends (`Door.decide_at`): no event says so, and nothing polls.

The front door and every request's bookkeeping are `Dispatcher`'s
(scheduler/dispatcher.py); `local_dispatcher` builds one over this state.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from scheduler import decision, rules
from scheduler.admission_port import AdmissionEntry, AdmissionWaiter, Door, GateTotals
from scheduler.budget import AdmissionBudget
from scheduler.clock import Clock
from scheduler.dispatcher import Dispatcher
from scheduler.errors import SchedulingError
from scheduler.gate_stats import (
    BucketStats,
    GateStats,
    StoreMode,
    TenantBuckets,
    configured_buckets,
    ledger_tenants,
)
from scheduler.local_round import QueueRound
from scheduler.ordering.policy import QueuePolicy
from scheduler.quotas import QuotaLedger, Reservation
from scheduler.request import Locality, QueuedRequest, Unsent
from scheduler.reserve import FairShareReserve
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import Timers


@dataclass(slots=True, eq=False, kw_only=True)
class LocalEntry(AdmissionEntry):
    reservation: Reservation


class LocalAdmission:
    """`AdmissionState` in memory (scheduler/admission_port.py)."""

    def __init__(
        self,
        policy: QueuePolicy,
        budget: AdmissionBudget,
        clock: Clock,
        *,
        tenants: TenantRegistry | None = None,
        reserve_fraction: float = 0.0,
        reserve_window_s: float = 10.0,
        isolation: rules.Isolation = rules.Isolation.RESERVE,
        locality: Locality | None = None,
        allowance: float = 0.0,
        unsent: Unsent | None = None,
    ) -> None:
        """`reserve_fraction`: share of the engine kept for tenants below their
        fair share (see `FairShareReserve`; 0 turns it off; never applied under a
        baseline policy, `policy.fair` False); `reserve_window_s`: how long a
        tenant counts as active after its last request left. `isolation`: keep
        that share idle (RESERVE) or lend it beyond the engine's room to light
        tenants, for an engine that preempts by priority (PREEMPT).
        `locality`: how many of a request's prompt tokens a worker with room
        holds (an engine pool's prefix index); with it, the head of a tenant
        within `allowance` weighted tokens of the first in fair order may go first
        (`rules.locality_pick`). `unsent`: how many admitted requests the engine
        pool holds unsent (RESERVE_SLOTS lends their slots to light tenants)."""
        self.policy = policy
        self.budget = budget
        self.clock = clock
        self.ledger = QuotaLedger(tenants or TenantRegistry.permissive(), clock, budget.engine)
        self.reserve = FairShareReserve(
            reserve_fraction if policy.fair else 0.0,
            lambda tenant_id: self.ledger.tenants.weight_of(tenant_id),
            clock,
            reserve_window_s,
            engine=budget.engine,
        )
        self.isolation = isolation
        self.locality = locality
        self.allowance = allowance
        self.unsent = unsent
        self.locality_picks_total = 0
        # Paused tenant -> resume time (inf: at the next finish of one of its requests).
        self._paused_until: dict[str, float] = {}
        self._pumping = False
        self.pauses_total = 0
        # Rounds stopped to keep the fair-share reserve for a tenant below its share.
        self.reserve_holds_total = 0
        # The last round judged a HOLD it did not stop at (`Round.held_over`).
        self.reserve_held_over = False
        self._round = QueueRound(self)
        self.door: Door[LocalEntry]

    def bind(self, door: Door[LocalEntry]) -> None:
        self.door = door

    @property
    def quotas(self) -> QuotaLedger:
        return self.ledger

    @property
    def paused_until(self) -> Mapping[str, float]:
        return self._paused_until

    @property
    def queued(self) -> int:
        return len(self.policy)

    @property
    def mode(self) -> StoreMode:
        return "memory"

    # -- arrival ------------------------------------------------------------
    def open(self, req: QueuedRequest, waiter: AdmissionWaiter) -> LocalEntry:
        return LocalEntry(req, waiter, reservation=self.ledger.open(req))

    def reservation(self, entry: LocalEntry) -> None:
        return None  # taken by `open` (the ledger's buckets, reject mode)

    def queue(self, entry: LocalEntry) -> None:
        try:
            self.policy.push(entry.req)
        except SchedulingError:
            self.ledger.settle(entry.reservation)
            raise
        self.reserve.on_queued(entry.req)

    def max_queue_wait_s(self, entry: LocalEntry) -> float | None:
        return self.ledger.max_queue_wait_s(entry.req.tenant_id)

    def withdraw(self, entry: LocalEntry) -> None:
        self.policy.remove(entry.req)
        self.reserve.on_dequeued(entry.req)
        self.ledger.settle(entry.reservation)

    # -- admission ----------------------------------------------------------
    def decide(self) -> None:
        """Admit queued requests in policy order while the budget has room."""
        if self._pumping:
            # A waiter callback re-entered; the outer loop sees the new state.
            return
        self._pumping = True
        holds = self.reserve_holds_total
        self.reserve_held_over = False
        try:
            decision.admit_round(self._round, self.reserve.fraction, self.isolation)
        finally:
            self._pumping = False
        if self.reserve_holds_total != holds or self.reserve_held_over:
            # Held for a tenant that may be active only by the reserve's window: the
            # round must run again when that ends, with no event to say so.
            end_s = self.reserve.seen.next_end_s(self.clock.now_s())
            if end_s is not None:
                self.door.decide_at(end_s)
        self.door.arm()

    def round(self) -> decision.Round[QueuedRequest]:
        """This state as the one decision sees it (scheduler/decision.py)."""
        return self._round

    def pause(self, tenant_id: str, wait_s: float) -> None:
        until_s = math.inf if math.isinf(wait_s) else self.clock.now_s() + wait_s
        self.policy.pause(tenant_id)
        self.pauses_total += 1
        self._paused_until[tenant_id] = until_s
        if not math.isinf(until_s):
            self.door.wake_at(until_s, tenant_id)

    def resume(self, tenant_id: str) -> None:
        if self._paused_until.pop(tenant_id, None) is not None:
            self.policy.resume(tenant_id)

    # -- in flight ----------------------------------------------------------
    def charge_cached(self, entry: LocalEntry, reported: int) -> None:
        if reported >= entry.req.charged_cached:
            return
        self.policy.on_cached_tokens(entry.req, reported)
        self._charged()

    def charge_output(self, entry: LocalEntry, tokens: int) -> None:
        self.policy.on_output_tokens(entry.req, tokens)
        self._charged()

    def _charged(self) -> None:
        # A charge can change which tenant is next (VTC): a request that was
        # waiting behind a head too big for the room may now be the head and fit.
        # Room first: the cheaper test, and mostly false under load.
        if self.budget.engine.requests < self.budget.limits.max_requests and len(self.policy):
            self.decide()

    def release(self, entry: LocalEntry) -> None:
        req = entry.req
        self.budget.release(req)
        self.reserve.on_finished(req)
        self.ledger.settle(entry.reservation, entry.output_tokens)
        self.policy.on_finish(req)
        # Its tenant may be held for max_concurrent, or for its buckets, which the
        # settlement may just have refilled (unused max_tokens): check it again.
        self.resume(req.tenant_id)

    # -- idle tenants (scheduler/idle.py) --------------------------------------------
    def idle(self, tenant_id: str) -> bool:
        return self.ledger.idle(tenant_id)

    def keep(self, tenant_id: str) -> bool:
        """Configured (its state is bounded by its config), or held for its limits."""
        return self.ledger.tenants.configured(tenant_id) or tenant_id in self._paused_until

    def forget(self, tenant_id: str) -> bool:
        """Its queues, counter and quota record, once its buckets are full again."""
        return self.ledger.forget(tenant_id) and self.policy.forget(tenant_id)

    # -- configuration ------------------------------------------------------
    def set_tenants(self, tenants: TenantRegistry) -> None:
        self.ledger.set_tenants(tenants)
        for tenant_id in list(self._paused_until):
            self.resume(tenant_id)

    # -- stats --------------------------------------------------------------
    def stats(self, totals: GateTotals, include: Iterable[str], fleet: bool) -> GateStats:
        """One replica, nothing shared: its own numbers are the fleet's (`fleet` ignored)."""
        # Only fair policies keep a virtual counter.
        counter: Callable[[str], float] | None = getattr(self.policy, "counter", None)
        return GateStats(
            in_flight=self.budget.engine.requests,
            in_flight_kv_tokens=self.budget.engine.kv_tokens,
            limits=self.budget.limits,
            queued=len(self.policy),
            admitted_total=totals.admitted_total,
            expired_total=totals.expired_total,
            store=totals.store,
            reserve_holds_total=totals.reserve_holds_total,
            lent_total=totals.lent_total,
            tenants=ledger_tenants(self.ledger, counter, set(self._paused_until), include),
        )

    async def refresh_stats(self) -> None:
        """Nothing to fetch: every number is in this process."""

    async def tenant_buckets(self, tenant_id: str) -> TenantBuckets:
        usage = self.ledger.usage(tenant_id)
        if usage is None:
            return configured_buckets(self.ledger.tenants, tenant_id)
        return BucketStats.of(usage.request_bucket), BucketStats.of(usage.token_bucket)

    async def start(self) -> None:
        """Nothing to start: every number is in this process."""

    async def aclose(self) -> None:
        """Nothing to hand over: the state dies with the process."""


LocalDispatcher = Dispatcher[LocalEntry, "LocalAdmission"]


def local_dispatcher(
    policy: QueuePolicy,
    budget: AdmissionBudget,
    clock: Clock,
    *,
    tenants: TenantRegistry | None = None,
    timers: Timers | None = None,
    expire_deadlines: bool = False,
    reserve_fraction: float = 0.0,
    reserve_window_s: float = 10.0,
    isolation: rules.Isolation = rules.Isolation.RESERVE,
    idle_ttl_s: float = 600.0,
    locality: Locality | None = None,
    allowance: float = 0.0,
    unsent: Unsent | None = None,
) -> LocalDispatcher:
    """The dispatcher of one process (arguments: `Dispatcher`, `LocalAdmission`)."""
    state = LocalAdmission(
        policy,
        budget,
        clock,
        tenants=tenants,
        reserve_fraction=reserve_fraction,
        reserve_window_s=reserve_window_s,
        isolation=isolation,
        locality=locality,
        allowance=allowance,
        unsent=unsent,
    )
    return Dispatcher(
        state, clock, timers=timers, expire_deadlines=expire_deadlines, idle_ttl_s=idle_ttl_s
    )
