"""The port between the one front door (`Dispatcher`) and an admission state.

`Dispatcher` (scheduler/dispatcher.py) keeps every request's bookkeeping once,
whichever state decides: the entries and their `RequestState`, the waiter that
hears of the outcome, queue expiry, cancel and drop, the charges' guards,
finish, the idle sweep and the totals. What it asks of the state is
`AdmissionState`, implemented twice:

- in memory (`scheduler/local_admission.py`): the policy's heaps, the quota
  ledger, the reserve and the budget, a synchronous `decision.admit_round` on
  every event;
- shared (`scheduler/shared/admission.py`): local queues and a pump that hands
  the heads to a `Store` (Redis, or `MemoryStore`), with its outbox and failover.

A state reaches back through `Door` when its decision admits, drops or rejects
an entry. No rule lives here.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Iterable, Mapping
from dataclasses import dataclass
from typing import Protocol, TypeVar

from scheduler.budget import AdmissionBudget
from scheduler.errors import SchedulingError
from scheduler.gate import RequestState, TenantsView
from scheduler.gate_stats import GateStats, StoreMode, TenantBuckets
from scheduler.request import QueuedRequest
from scheduler.tenancy.tenants import TenantRegistry

_WITHDRAWN = frozenset({RequestState.CANCELLED, RequestState.EXPIRED, RequestState.REJECTED})
# The members the hot path reads, bound once: `RequestState.X` goes through the
# enum's metaclass (~70 ns, ~8x a module global) several times per request.
QUEUED, ADMITTED, STREAMING = RequestState.QUEUED, RequestState.ADMITTED, RequestState.STREAMING
SETTLED = RequestState.SETTLED


class AdmissionWaiter(Protocol):
    """The caller of `Dispatcher.submit`. Callbacks must not re-enter the dispatcher."""

    def wanted(self) -> bool:
        """False once the caller has gone: the request is dropped, uncharged."""
        ...

    def admitted(self) -> None: ...

    def rejected(self, error: SchedulingError) -> None:
        """Rejected while queued (queue wait or deadline exceeded, store failed closed)."""
        ...


class FutureWaiter:
    """`Dispatcher.admit`'s waiter: a future the caller awaits."""

    __slots__ = ("fut",)

    def __init__(self, fut: asyncio.Future[None]) -> None:
        self.fut = fut

    def wanted(self) -> bool:
        return not self.fut.done()

    def admitted(self) -> None:
        self.fut.set_result(None)

    def rejected(self, error: SchedulingError) -> None:
        self.fut.set_exception(error)


@dataclass(slots=True, eq=False)
class AdmissionEntry:
    """One request between arrival and settlement; a state adds what it keeps."""

    req: QueuedRequest
    waiter: AdmissionWaiter
    state: RequestState = RequestState.QUEUED
    output_tokens: int = 0

    @property
    def queued(self) -> bool:
        return self.state is QUEUED

    @property
    def started(self) -> bool:
        s = self.state  # per streamed chunk: two identity checks
        return s is STREAMING or s is ADMITTED

    @property
    def withdrawn(self) -> bool:
        """Left the queue without being admitted (its caller left, expired, refused)."""
        return self.state in _WITHDRAWN

    @property
    def wanted(self) -> bool:
        return self.queued and self.waiter.wanted()

    def withdraw(self, to: RequestState) -> None:
        assert self.queued and to in _WITHDRAWN, (self.state, to)
        self.state = to

    def start(self) -> None:
        assert self.queued, self.state
        self.state = ADMITTED

    def streamed(self, tokens: int) -> None:
        self.state = STREAMING
        self.output_tokens += tokens


E = TypeVar("E", bound=AdmissionEntry)


class Door(Protocol[E]):
    """What a state asks of the front door."""

    def entry_of(self, req: QueuedRequest) -> E | None:
        """The entry of a queued or in-flight request."""
        ...

    def started(self, entry: E) -> None:
        """The decision admitted `entry` (the state has taken its room)."""
        ...

    def drop(self, entry: E, to: RequestState) -> None:
        """Withdraw a queued entry and have the state give back what it holds."""
        ...

    def discard(self, entry: E, to: RequestState) -> None:
        """Withdraw a queued entry; the state gives back what it holds itself."""
        ...

    def reject(self, entry: E, error: SchedulingError) -> None:
        """Refuse a queued entry (the store failed closed)."""
        ...

    def wake_at(self, when_s: float, tenant_id: str) -> None:
        """Call `AdmissionState.resume(tenant_id)` at `when_s` (a paused tenant),
        once `arm` runs."""
        ...

    def decide_at(self, when_s: float) -> None:
        """Call `AdmissionState.decide` at `when_s` (something that holds the round
        lapses then, with no event to say so), once `arm` runs."""
        ...

    def arm(self) -> None:
        """Keep a timer armed for the earliest wake-up (after a decision)."""
        ...

    def stats(self, include: Iterable[str] = (), fleet: bool = False) -> GateStats:
        """The door's `stats()` (a replica publishes its usage with its heartbeat)."""
        ...


class AdmissionState(Protocol[E]):
    """Where admission is decided: the queues, the counters, the buckets, the room."""

    @property
    def quotas(self) -> TenantsView: ...

    @property
    def budget(self) -> AdmissionBudget:
        """This replica's in-flight requests and its limits."""
        ...

    @property
    def paused_until(self) -> Mapping[str, float]:
        """Tenants held for their own limits -> when they may go (inf: a finish)."""
        ...

    @property
    def reserve_holds_total(self) -> int: ...

    @property
    def queued(self) -> int:
        """Requests queued here."""
        ...

    @property
    def mode(self) -> StoreMode: ...

    def bind(self, door: Door[E]) -> None: ...

    def open(self, req: QueuedRequest, waiter: AdmissionWaiter) -> E:
        """Resolve the tenant and check the arrival (raises a SchedulingError)."""
        ...

    def reservation(self, entry: E) -> Awaitable[None] | None:
        """What must be awaited before `entry` queues (a store's bucket reservation),
        or None."""
        ...

    def queue(self, entry: E) -> None:
        """Queue `entry` (raises a SchedulingError having kept nothing of it)."""
        ...

    def max_queue_wait_s(self, entry: E) -> float | None: ...

    def withdraw(self, entry: E) -> None:
        """`entry` left the queue unadmitted: give back what it holds."""
        ...

    def decide(self) -> None:
        """Room, order or eligibility may have changed: decide (now, or soon)."""
        ...

    def resume(self, tenant_id: str) -> None: ...

    def charge_output(self, entry: E, tokens: int) -> None: ...

    def charge_cached(self, entry: E, reported: int) -> None: ...

    def release(self, entry: E) -> None:
        """`entry` left the engine: free its room, settle its quota."""
        ...

    def idle(self, tenant_id: str) -> bool:
        """Nothing of the tenant's is queued (or held) here."""
        ...

    def keep(self, tenant_id: str) -> bool:
        """Not to be forgotten although idle."""
        ...

    def forget(self, tenant_id: str) -> bool:
        """Drop an idle tenant's state; False if it cannot go yet."""
        ...

    def set_tenants(self, tenants: TenantRegistry) -> None: ...

    def stats(self, totals: GateTotals, include: Iterable[str], fleet: bool) -> GateStats: ...

    async def refresh_stats(self) -> None: ...

    async def tenant_buckets(self, tenant_id: str) -> TenantBuckets: ...

    async def start(self) -> None: ...

    async def aclose(self) -> None: ...


@dataclass(frozen=True, slots=True)
class GateTotals:
    """The front door's totals, for `stats()`."""

    admitted_total: int
    expired_total: int
    lent_total: int
    reserve_holds_total: int
    store: StoreMode
