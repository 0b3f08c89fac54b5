"""The dispatcher: moves requests from the policy's queues into the engine.

It is event-driven rather than a polling loop: every arrival, finish, wake-up
or capacity change "pumps" — admits queued requests in policy order while the
budget has room. That makes it work-conserving by construction: it never
leaves room idle while the policy's next eligible request fits.

Quotas (`QuotaLedger`) are checked at arrival (caps, queue slots, buckets in
reject mode), consulted before each admission (concurrency, buckets in wait
mode) and settled exactly once when the request ends. A tenant whose head
request may not start yet is paused in the policy (it keeps its place) and
resumed by a timer at the time its buckets allow it, or by its next finish
when it is at max_concurrent. Timers also expire requests that exceed their
tenant's max_queue_wait_s or their deadline while queued.

Two front doors: `admit` (async, for the service) and `submit` / `cancel`
(callbacks, for discrete-event drivers that never sleep).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Protocol

from scheduler import decision, rules
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.errors import SchedulingError
from scheduler.gate import Admission
from scheduler.gate_stats import (
    BucketStats,
    GateStats,
    TenantBuckets,
    configured_buckets,
    ledger_tenants,
)
from scheduler.idle import IdleTenants
from scheduler.ordering.policy import QueuePolicy
from scheduler.quotas import QuotaLedger, Reservation
from scheduler.request import Locality, QueuedRequest
from scheduler.reserve import FairShareReserve
from scheduler.rules import Verdict
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import AsyncioTimers, TimerHandle, Timers


class AdmissionWaiter(Protocol):
    """The caller of `submit`. Callbacks must not re-enter the dispatcher."""

    def wanted(self) -> bool:
        """False once the caller has gone: the request is dropped, uncharged."""
        ...

    def admitted(self) -> None: ...

    def rejected(self, error: SchedulingError) -> None:
        """Rejected while queued (queue wait or deadline exceeded)."""
        ...


@dataclass(slots=True, eq=False)
class _Entry:
    req: QueuedRequest
    waiter: AdmissionWaiter
    reservation: Reservation
    output_tokens: int = 0
    queued: bool = True


class _FutureWaiter:
    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut

    def wanted(self) -> bool:
        return not self.fut.done()

    def admitted(self) -> None:
        self.fut.set_result(None)

    def rejected(self, error: SchedulingError) -> None:
        self.fut.set_exception(error)


# A wake-up: resume a paused tenant (str) or expire a queued request (_Entry).
_Wakeup = tuple[float, int, str | _Entry]


class _QueueRound:
    """The dispatcher's queues, budget, quotas and reserve as a `decision.Round`:
    I/O for the one admission decision (no rule here)."""

    __slots__ = ("d", "entry")

    def __init__(self, d: Dispatcher) -> None:
        self.d = d
        self.entry: _Entry | None = None  # the last head's (`head` to `admit`)

    @property
    def limits(self) -> AdmissionLimits:
        return self.d.budget.limits

    @property
    def in_flight(self) -> int:
        return self.d.budget.engine.requests

    @property
    def in_flight_kv(self) -> int:
        return self.d.budget.engine.kv_tokens

    def head(self) -> QueuedRequest | None:
        d = self.d
        while (head := d.policy.peek_next()) is not None:
            entry = self._wanted(head)
            if entry is None:
                continue
            if d.locality is not None:
                # What it would add to the engine's KV, and charge (QueuedRequest.kv_tokens).
                head.cached_estimate = d.locality(head)
            self.entry = entry
            return head
        return None

    @property
    def local(self) -> bool:
        return self.d.locality is not None

    def queued(self, c: QueuedRequest) -> int:
        return self.d.reserve.queued(c.tenant_id)

    def within(self, c: QueuedRequest) -> list[QueuedRequest]:
        d = self.d
        if d.locality is None:
            return [c]
        end = decision.window_end(d.policy.order_key(c.tenant_id), d.allowance)
        heads = [c, *(h for h in d.policy.heads_upto(end) if h is not c and self._wanted(h))]
        for h in heads[1:]:  # the head's is set (`head`)
            h.cached_estimate = d.locality(h)
        return heads

    def cached(self, c: QueuedRequest) -> int:
        return c.cached_estimate

    def _wanted(self, req: QueuedRequest) -> _Entry | None:
        """Its entry, or None after dropping it: its caller was cancelled and has
        not run its cleanup yet."""
        entry = self.d._entries.get(id(req))
        if entry is None:
            raise AssertionError(f"policy returned unknown request {req.request_id}")
        if entry.waiter.wanted():
            return entry
        self.d._drop(entry)
        return None

    def _entry(self, req: QueuedRequest) -> _Entry:
        if self.entry is not None and self.entry.req is req:
            return self.entry
        entry = self.d._entries.get(id(req))
        if entry is None:
            raise AssertionError(f"{req.request_id!r} is not queued")
        return entry

    def own_wait_s(self, c: QueuedRequest) -> float:
        return self.d.quotas.wait_s(self._entry(c).reservation)

    def load(self, c: QueuedRequest) -> rules.TenantLoad:
        return self.d.reserve.load(c.tenant_id, self.d.budget.limits)

    def behind(self, c: QueuedRequest) -> bool:
        return False  # one process: every backlogged tenant is in these queues

    def hold(self, c: QueuedRequest, wait_s: float) -> None:
        self.d._pause(c.tenant_id, wait_s)

    def stopped(self, c: QueuedRequest, v: Verdict) -> None:
        if v is Verdict.HOLD:
            self.d.reserve_holds_total += 1

    def admit(self, c: QueuedRequest, lent: bool) -> bool:
        d, entry = self.d, self._entry(c)
        d.locality_picks_total += c is not d.policy.peek_next()
        if d.policy.pop_next(c) is not c:
            raise AssertionError("policy pop_next disagrees with heads_upto")
        c.lent = lent
        d.lent_total += lent
        d.budget.reserve(c)
        c.light = d.policy.fair and rules.light(d.reserve.queued(c.tenant_id))
        d.reserve.on_admitted(c)
        d.quotas.start(entry.reservation)
        entry.queued = False
        d.admitted_total += 1
        entry.waiter.admitted()
        return True


class Dispatcher:
    def __init__(
        self,
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
    ) -> None:
        """`expire_deadlines`: reject a queued request with DeadlineExpired when
        its `deadline_s` passes (off by default: the gRPC layer cancels it).
        `reserve_fraction`: share of the engine kept for tenants below their
        fair share (see `FairShareReserve`; 0 turns it off; never applied under a
        baseline policy, `policy.fair` False); `reserve_window_s`: how long a
        tenant counts as active after its last request left. `isolation`: keep
        that share idle (RESERVE) or lend it beyond the engine's room to light
        tenants, for an engine that preempts by priority (PREEMPT).
        `idle_ttl_s`: a tenant the registry does not configure (open mode: any
        id a caller names) is forgotten after this long idle, once its buckets
        are full again, so callers cannot grow the dispatcher's state at will.
        `locality`: how many of a request's prompt tokens a worker with room
        holds (an engine pool's prefix index); with it, the head of a tenant
        within `allowance` weighted tokens of the first in fair order may go first
        (`rules.locality_pick`)."""
        self.policy = policy
        self.budget = budget
        self.clock = clock
        self.quotas = QuotaLedger(tenants or TenantRegistry.permissive(), clock, budget.engine)
        self.timers: Timers = timers or AsyncioTimers(clock)
        self.expire_deadlines = expire_deadlines
        self.reserve = FairShareReserve(
            reserve_fraction if policy.fair else 0.0,
            lambda tenant_id: self.quotas.tenants.weight_of(tenant_id),
            clock,
            reserve_window_s,
            engine=budget.engine,
        )
        self.isolation = isolation
        self.locality = locality
        self.allowance = allowance
        self.locality_picks_total = 0
        self._seq = itertools.count(1)
        self._entries: dict[int, _Entry] = {}
        # Paused tenant -> resume time (inf: at the next finish of one of its requests).
        self._paused_until: dict[str, float] = {}
        self._wakeups: list[_Wakeup] = []
        self._wakeup_seq = itertools.count()
        self._armed: TimerHandle | None = None
        self._armed_s = math.inf
        self._pumping = False
        self.admitted_total = 0
        self.expired_total = 0
        self.pauses_total = 0
        self._idle = IdleTenants(idle_ttl_s, clock.now_s())
        self.forgotten_total = 0
        # Rounds stopped to keep the fair-share reserve for a tenant below its share.
        self.reserve_holds_total = 0
        self.lent_total = 0
        self._round = _QueueRound(self)

    @property
    def queued(self) -> int:
        return len(self.policy)

    @property
    def in_flight(self) -> int:
        return self.budget.engine.requests

    @property
    def paused_tenants(self) -> dict[str, float]:
        return dict(self._paused_until)

    # -- arrival ------------------------------------------------------------
    async def admit(self, req: QueuedRequest) -> None:
        """Wait until `req` is admitted, or raise a SchedulingError.

        Cancelled while queued: dequeued, nothing charged. The caller must call
        `finish(req)` exactly once after this returns.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.submit(req, _FutureWaiter(fut))
        try:
            await fut
        except asyncio.CancelledError:
            admitted = fut.done() and not fut.cancelled() and fut.exception() is None
            if not self.cancel(req) and admitted:
                # Admitted in the same tick the caller was cancelled: the
                # caller never saw the admission, so give the room back.
                self.finish(req)
            raise

    def submit(self, req: QueuedRequest, waiter: AdmissionWaiter) -> None:
        """Queue `req`; `waiter` hears of its admission. Raises if refused at once."""
        req.seq = next(self._seq)
        req.arrival_s = self.clock.now_s()
        res = self.quotas.open(req)
        self._idle.drop(req.tenant_id)
        try:
            self.policy.push(req)
        except SchedulingError:
            self.quotas.settle(res)
            raise
        entry = _Entry(req, waiter, res)
        self._entries[id(req)] = entry
        self.reserve.on_queued(req)
        expires_s = self._expiry_s(req)
        if expires_s is not None:
            self._schedule(expires_s, entry)
        self.pump()

    def cancel(self, req: QueuedRequest) -> bool:
        """Withdraw a queued request, charging nothing; False if it is not queued."""
        entry = self._entries.get(id(req))
        if entry is None or not entry.queued:
            return False
        self._drop(entry)
        self.pump()
        return True

    def _deadline_s(self, req: QueuedRequest) -> float | None:
        return req.deadline_s if self.expire_deadlines else None

    def _expiry_s(self, req: QueuedRequest) -> float | None:
        max_wait_s = self.quotas.max_queue_wait_s(req.tenant_id)
        return rules.queue_expiry_s(req.arrival_s, max_wait_s, self._deadline_s(req))

    def _drop(self, entry: _Entry) -> None:
        entry.queued = False
        del self._entries[id(entry.req)]
        self.policy.remove(entry.req)
        self.reserve.on_dequeued(entry.req)
        self.quotas.settle(entry.reservation)
        self._note_idle(entry.req.tenant_id)

    # -- admission ----------------------------------------------------------
    def pump(self) -> None:
        """Admit queued requests in policy order while the budget has room."""
        if self._pumping:
            # A waiter callback re-entered; the outer loop sees the new state.
            return
        self._pumping = True
        self._sweep_idle(self.clock.now_s())
        try:
            self._admit_while_room()
        finally:
            self._pumping = False
        self._arm()

    def _admit_while_room(self) -> None:
        decision.admit_round(self._round, self.reserve.fraction, self.isolation)

    def round(self) -> decision.Round[QueuedRequest]:
        """This dispatcher's state as the one decision sees it (scheduler/decision.py)."""
        return self._round

    def _pause(self, tenant_id: str, wait_s: float) -> None:
        until_s = math.inf if math.isinf(wait_s) else self.clock.now_s() + wait_s
        self.policy.pause(tenant_id)
        self.pauses_total += 1
        self._paused_until[tenant_id] = until_s
        if not math.isinf(until_s):
            self._schedule(until_s, tenant_id)

    def _resume(self, tenant_id: str) -> None:
        if self._paused_until.pop(tenant_id, None) is not None:
            self.policy.resume(tenant_id)

    # -- in flight ----------------------------------------------------------
    def on_cached_tokens(self, req: QueuedRequest, reported: int) -> None:
        entry = self._entries.get(id(req))
        if entry is None or entry.queued or reported >= req.cached_estimate:
            return
        self.policy.on_cached_tokens(req, reported)
        self._charged()

    def _charged(self) -> None:
        # A charge can change which tenant is next (VTC): a request that was
        # waiting behind a head too big for the room may now be the head and fit.
        if len(self.policy) and self.budget.engine.requests < self.budget.limits.max_requests:
            self.pump()

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        entry = self._entries.get(id(req))
        if entry is None or entry.queued or tokens <= 0:
            return
        entry.output_tokens += tokens
        self.policy.on_output_tokens(req, tokens)
        self._charged()

    def finish(self, req: QueuedRequest) -> None:
        """The admitted request left the engine (done, cancelled or failed)."""
        entry = self._entries.get(id(req))
        if entry is None or entry.queued:
            raise AssertionError(f"finish({req.request_id!r}) for a request not in flight")
        del self._entries[id(req)]
        self.budget.release(req)
        self.reserve.on_finished(req)
        self.quotas.settle(entry.reservation, entry.output_tokens)
        self.policy.on_finish(req)
        # Its tenant may be held for max_concurrent, or for its buckets, which the
        # settlement may just have refilled (unused max_tokens): check it again.
        self._resume(req.tenant_id)
        self._note_idle(req.tenant_id)
        self.pump()

    # -- idle tenants -------------------------------------------------------------
    def _note_idle(self, tenant_id: str) -> None:
        if self.quotas.idle(tenant_id):
            self._idle.note(tenant_id, self.clock.now_s())

    def _sweep_idle(self, now_s: float) -> None:
        """Forget the unconfigured tenants idle for the idle TTL (scheduler/idle.py)."""
        self.forgotten_total += self._idle.sweep(now_s, self._keep_tenant, self._forget_tenant)

    def _keep_tenant(self, tenant_id: str) -> bool:
        """Configured (its state is bounded by its config), or held for its limits."""
        return self.quotas.tenants.configured(tenant_id) or tenant_id in self._paused_until

    def _forget_tenant(self, tenant_id: str) -> bool:
        return self.quotas.forget(tenant_id) and self.policy.forget(tenant_id)

    # -- configuration ------------------------------------------------------
    def set_limits(self, limits: AdmissionLimits) -> None:
        self.budget.limits = limits
        self.pump()

    def set_tenants(self, tenants: TenantRegistry) -> None:
        """New tenant config: quotas apply to new arrivals; paused tenants are re-checked."""
        self.quotas.set_tenants(tenants)
        for tenant_id in list(self._paused_until):
            self._resume(tenant_id)
        self.pump()

    # -- wake-ups -----------------------------------------------------------
    def _schedule(self, when_s: float, what: str | _Entry) -> None:
        heapq.heappush(self._wakeups, (when_s, next(self._wakeup_seq), what))
        # Admitted requests leave stale expiry wake-ups behind; drop them before
        # they outnumber the live ones (long max_queue_wait_s, high rates).
        if len(self._wakeups) > 2 * (len(self._entries) + len(self._paused_until)) + 64:
            self._wakeups = [w for w in self._wakeups if self._is_live(w[0], w[2])]
            heapq.heapify(self._wakeups)

    def _is_live(self, when_s: float, what: str | _Entry) -> bool:
        if isinstance(what, str):
            return self._paused_until.get(what) == when_s
        return what.queued

    def _arm(self) -> None:
        """Keep one timer armed for the earliest live wake-up."""
        heap = self._wakeups
        while heap and not self._is_live(heap[0][0], heap[0][2]):
            heapq.heappop(heap)
        if not heap:
            return
        when_s = heap[0][0]
        if self._armed is not None and self._armed_s <= when_s:
            return  # an earlier (possibly stale) timer will re-arm when it fires
        if self._armed is not None:
            self._armed.cancel()
        self._armed_s = when_s
        self._armed = self.timers.call_at(when_s, self._on_wakeup)

    def _on_wakeup(self) -> None:
        self._armed, self._armed_s = None, math.inf
        now_s = self.clock.now_s()
        heap = self._wakeups
        while heap and heap[0][0] <= now_s:
            when_s, _, what = heapq.heappop(heap)
            if not self._is_live(when_s, what):
                continue
            if isinstance(what, str):
                self._resume(what)
            else:
                self._expire(what, now_s)
        self.pump()

    def _expire(self, entry: _Entry, now_s: float) -> None:
        req = entry.req
        max_wait_s = self.quotas.max_queue_wait_s(req.tenant_id)
        error = rules.queue_expired(
            req.request_id, req.tenant_id, req.arrival_s, now_s, max_wait_s, self._deadline_s(req)
        )
        self._drop(entry)
        self.expired_total += 1
        entry.waiter.rejected(error)

    # -- the front door and its stats (scheduler/gate.py) ----------------------
    def admitted(self, req: QueuedRequest) -> Admission:
        """`async with dispatcher.admitted(req) as ticket:` (see scheduler/gate.py)."""
        return Admission(self, req)

    def stats(self, include: Iterable[str] = (), fleet: bool = False) -> GateStats:
        """Live state for admin and telemetry (safe from the metric reader's thread).
        One replica, nothing shared: its own numbers are the fleet's (`fleet` ignored)."""
        # Only fair policies keep a virtual counter.
        counter: Callable[[str], float] | None = getattr(self.policy, "counter", None)
        return GateStats(
            in_flight=self.budget.engine.requests,
            in_flight_kv_tokens=self.budget.engine.kv_tokens,
            limits=self.budget.limits,
            queued=len(self.policy),
            admitted_total=self.admitted_total,
            expired_total=self.expired_total,
            store="memory",
            reserve_holds_total=self.reserve_holds_total,
            lent_total=self.lent_total,
            tenants=ledger_tenants(self.quotas, counter, set(self._paused_until), include),
        )

    async def refresh_stats(self) -> None:
        """Nothing to fetch: every number is in this process."""

    async def tenant_buckets(self, tenant_id: str) -> TenantBuckets:
        usage = self.quotas.usage(tenant_id)
        if usage is None:
            return configured_buckets(self.quotas.tenants, tenant_id)
        return BucketStats.of(usage.request_bucket), BucketStats.of(usage.token_bucket)

    async def aclose(self) -> None:
        """Nothing to hand over: the state dies with the process."""
