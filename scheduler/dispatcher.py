"""The dispatcher: the one front door of admission, over an admission state.

Every request's bookkeeping lives here once, in both modes: its entry and
`RequestState`, the waiter that hears of its admission, queue expiry
(`max_queue_wait_s`, deadlines when asked), cancel and drop, the guards of
the charges it streams, finish, the idle sweep and the totals. Where the
request waits and what admits it is the state's (scheduler/admission_port.py):
in memory (`local_admission.py`, a synchronous decision on every event) or
shared by replicas through a `Store` (`shared/admission.py`, a pump).

It is event-driven: every arrival, finish, charge, wake-up or capacity change
asks the state to decide. Wake-ups (a queued request's expiry, a paused
tenant's resume, a decision the state asks for at a time with no event, such
as the fair-share reserve's activity window ending) share one armed timer.

Two front doors: `admit` (async, for the service) and `submit` / `cancel`
(callbacks, for discrete-event drivers that never sleep; in memory only when
a shared store must be asked first).
"""

from __future__ import annotations

import asyncio
import heapq
import itertools
import math
from collections.abc import Iterable
from typing import Any, Generic, TypeVar

from scheduler import rules
from scheduler.admission_port import (
    QUEUED,
    SETTLED,
    STREAMING,
    AdmissionEntry,
    AdmissionState,
    AdmissionWaiter,
    E,
    FutureWaiter,
    GateTotals,
)
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.errors import QuotaExceeded, RequestTooLarge, SchedulingError
from scheduler.gate import Admission, RequestState, TenantsView
from scheduler.gate_stats import GateStats, TenantBuckets
from scheduler.idle import IdleTenants
from scheduler.request import QueuedRequest
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import AsyncioTimers, TimerHandle, Timers

__all__ = ["AdmissionWaiter", "Dispatcher"]

S = TypeVar("S", bound=AdmissionState[Any])

# A wake-up: resume a paused tenant (str), expire a queued request (an entry), or
# decide again (None: `decide_at`).
_Wakeup = tuple[float, int, str | AdmissionEntry | None]


class Dispatcher(Generic[E, S]):
    def __init__(
        self,
        state: S,
        clock: Clock,
        *,
        timers: Timers | None = None,
        expire_deadlines: bool = False,
        idle_ttl_s: float = 600.0,
    ) -> None:
        """`expire_deadlines`: reject a queued request with DeadlineExpired when
        its `deadline_s` passes (off by default: the gRPC layer cancels it).
        `idle_ttl_s`: a tenant the registry does not configure (open mode: any
        id a caller names) is forgotten after this long idle (scheduler/idle.py),
        so callers cannot grow the state at will."""
        self.state = state
        self.clock = clock
        self.timers: Timers = timers or AsyncioTimers(clock)
        self.expire_deadlines = expire_deadlines
        self._seq = itertools.count(1)
        self._entries: dict[int, E] = {}
        self._wakeups: list[_Wakeup] = []
        self._wakeup_seq = itertools.count()
        self._armed: TimerHandle | None = None
        self._armed_s = math.inf
        self._decide_at_s = math.inf  # the live `decide_at` wake-up
        self.admitted_total = 0
        self.expired_total = 0
        self.lent_total = 0
        self._idle = IdleTenants(idle_ttl_s, clock.now_s())
        self.forgotten_total = 0
        state.bind(self)

    @property
    def quotas(self) -> TenantsView:
        return self.state.quotas

    @property
    def budget(self) -> AdmissionBudget:
        return self.state.budget

    @property
    def queued(self) -> int:
        return self.state.queued

    @property
    def in_flight(self) -> int:
        return self.state.budget.engine.requests

    @property
    def paused_tenants(self) -> dict[str, float]:
        return dict(self.state.paused_until)

    # -- arrival ------------------------------------------------------------
    async def admit(self, req: QueuedRequest) -> None:
        """Wait until `req` is admitted, or raise a SchedulingError.

        Cancelled while queued: dequeued, nothing charged. The caller must call
        `finish(req)` exactly once after this returns.
        """
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        entry = self._open(req, FutureWaiter(fut))
        pending = self.state.reservation(entry)
        if pending is not None:
            try:
                await pending
            except (QuotaExceeded, RequestTooLarge) as exc:
                self._note_idle(exc.tenant_id)
                raise
        self._queue(entry)
        try:
            await fut
        except asyncio.CancelledError:
            if entry.started:
                # Admitted in the same tick the caller was cancelled: the
                # caller never saw the admission, so give the room back.
                self.finish(req)
            elif entry.queued:
                self.cancel(req)
            raise

    def submit(self, req: QueuedRequest, waiter: AdmissionWaiter) -> None:
        """Queue `req`; `waiter` hears of its admission. Raises if refused at once."""
        entry = self._open(req, waiter)
        pending = self.state.reservation(entry)
        if pending is not None:
            if asyncio.iscoroutine(pending):
                pending.close()
            raise AssertionError("this state reserves in its store first: use admit")
        self._queue(entry)

    def _open(self, req: QueuedRequest, waiter: AdmissionWaiter) -> E:
        req.seq = next(self._seq)
        now_s = req.arrival_s = self.clock.now_s()
        self.forgotten_total += self._idle.sweep(now_s, self.state.keep, self.state.forget)
        try:
            entry: E = self.state.open(req, waiter)
        except (QuotaExceeded, RequestTooLarge) as exc:
            self._note_idle(exc.tenant_id)  # its refusal totals are state too
            raise
        return entry

    def _queue(self, entry: E) -> None:
        req = entry.req
        self._idle.drop(req.tenant_id)
        self.state.queue(entry)
        self._entries[id(req)] = entry
        deadline_s = req.deadline_s if self.expire_deadlines else None
        max_wait_s = self.state.max_queue_wait_s(entry)
        expires_s = rules.queue_expiry_s(req.arrival_s, max_wait_s, deadline_s)
        if expires_s is not None:
            self._schedule(expires_s, entry)
        self.state.decide()
        if expires_s is not None:
            self.arm()  # a state that decides later (shared) has not armed it yet

    def cancel(self, req: QueuedRequest) -> bool:
        """Withdraw a queued request, charging nothing; False if it is not queued."""
        entry = self._entries.get(id(req))
        if entry is None or not entry.queued:
            return False
        self.drop(entry, RequestState.CANCELLED)
        # Its tenant's next request may be the head now, and fit where it did not.
        self.state.decide()
        return True

    # -- what the state asks (admission_port.Door) ---------------------------------
    def entry_of(self, req: QueuedRequest) -> E | None:
        return self._entries.get(id(req))

    def started(self, entry: E) -> None:
        entry.start()
        self.admitted_total += 1
        self.lent_total += entry.req.lent
        entry.waiter.admitted()

    def discard(self, entry: E, to: RequestState) -> None:
        entry.withdraw(to)
        del self._entries[id(entry.req)]

    def drop(self, entry: E, to: RequestState) -> None:
        self.discard(entry, to)
        self.state.withdraw(entry)
        self._note_idle(entry.req.tenant_id)

    def reject(self, entry: E, error: SchedulingError) -> None:
        self.drop(entry, RequestState.REJECTED)
        entry.waiter.rejected(error)

    def wake_at(self, when_s: float, tenant_id: str) -> None:
        self._schedule(when_s, tenant_id)

    def decide_at(self, when_s: float) -> None:
        # Only the earliest is kept: the decision it runs asks again if still held.
        if when_s < self._decide_at_s:
            self._decide_at_s = when_s
            self._schedule(when_s, None)

    # -- in flight ----------------------------------------------------------
    def on_cached_tokens(self, req: QueuedRequest, reported: int) -> None:
        entry = self._entries.get(id(req))
        if entry is not None and entry.started:
            self.state.charge_cached(entry, reported)

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        entry = self._entries.get(id(req))
        # An entry here is queued or started (`discard` and `finish` remove it):
        # "not started" is one identity check, and `entry.streamed` is inline.
        if entry is None or entry.state is QUEUED or tokens <= 0:
            return
        entry.state = STREAMING
        entry.output_tokens += tokens
        self.state.charge_output(entry, tokens)

    def finish(self, req: QueuedRequest) -> None:
        """The admitted request left the engine (done, cancelled or failed)."""
        entry = self._entries.get(id(req))
        if entry is None or entry.state is QUEUED:
            raise AssertionError(f"finish({req.request_id!r}) for a request not in flight")
        del self._entries[id(req)]
        self.state.release(entry)
        entry.state = SETTLED
        self._note_idle(req.tenant_id)
        self.state.decide()

    def _note_idle(self, tenant_id: str) -> None:
        if self.state.idle(tenant_id):
            self._idle.note(tenant_id, self.clock.now_s())

    # -- configuration ------------------------------------------------------
    def set_limits(self, limits: AdmissionLimits) -> None:
        self.state.budget.limits = limits
        self.state.decide()

    def set_tenants(self, tenants: TenantRegistry) -> None:
        """New tenant config: quotas apply to new arrivals; paused tenants are re-checked."""
        self.state.set_tenants(tenants)
        self.state.decide()

    # -- wake-ups -----------------------------------------------------------
    def _schedule(self, when_s: float, what: str | AdmissionEntry | None) -> None:
        heapq.heappush(self._wakeups, (when_s, next(self._wakeup_seq), what))
        # Admitted requests leave stale expiry wake-ups behind; drop them before
        # they outnumber the live ones (long max_queue_wait_s, high rates).
        if len(self._wakeups) > 2 * (len(self._entries) + len(self.state.paused_until)) + 64:
            self._wakeups = [w for w in self._wakeups if self._is_live(w[0], w[2])]
            heapq.heapify(self._wakeups)

    def _is_live(self, when_s: float, what: str | AdmissionEntry | None) -> bool:
        if what is None:
            return self._decide_at_s == when_s
        if isinstance(what, str):
            return self.state.paused_until.get(what) == when_s
        return what.queued

    def arm(self) -> None:
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
            if what is None:
                self._decide_at_s = math.inf  # the decision below
            elif isinstance(what, str):
                self.state.resume(what)
            else:
                self._expire(self._entries[id(what.req)], now_s)
        self.state.decide()
        self.arm()

    def _expire(self, entry: E, now_s: float) -> None:
        req = entry.req
        deadline_s = req.deadline_s if self.expire_deadlines else None
        max_wait_s = self.state.max_queue_wait_s(entry)
        error = rules.queue_expired(
            req.request_id, req.tenant_id, req.arrival_s, now_s, max_wait_s, deadline_s
        )
        self.drop(entry, RequestState.EXPIRED)
        self.expired_total += 1
        entry.waiter.rejected(error)

    # -- the front door and its stats (scheduler/gate.py) ----------------------
    def admitted(self, req: QueuedRequest) -> Admission:
        """`async with dispatcher.admitted(req) as ticket:` (see scheduler/gate.py)."""
        return Admission(self, req)

    def stats(self, include: Iterable[str] = (), fleet: bool = False) -> GateStats:
        """Live state for admin and telemetry (safe from the metric reader's thread);
        `fleet`: per-tenant usage summed over the replicas sharing a store."""
        totals = GateTotals(
            self.admitted_total,
            self.expired_total,
            self.lent_total,
            self.state.reserve_holds_total,
            self.state.mode,
        )
        return self.state.stats(totals, include, fleet)

    async def refresh_stats(self) -> None:
        await self.state.refresh_stats()

    async def tenant_buckets(self, tenant_id: str) -> TenantBuckets:
        return await self.state.tenant_buckets(tenant_id)

    async def start(self) -> None:
        await self.state.start()

    async def aclose(self) -> None:
        await self.state.aclose()
