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

Store failure (`failure_mode`, fail-open or fail-closed) and the
reconciliation when the store answers again: shared_failover.py. Options and
small state types: shared_options.py; local queues and per-request
bookkeeping: shared_local.py.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import math
from collections.abc import Iterable
from dataclasses import replace

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.errors import QueueTimeout, QuotaExceeded, RequestTooLarge, StoreUnavailable
from scheduler.gate import Admission
from scheduler.gate_stats import GateStats
from scheduler.memory_store import MemoryStore
from scheduler.quotas import bucket_exceeded, check_caps
from scheduler.request import QueuedRequest
from scheduler.shared_local import Entry, LocalQueues
from scheduler.shared_options import (
    FailureMode,
    Pending,
    QuotaView,
    SharedOptions,
    StoreHealth,
)
from scheduler.shared_pump import SharedPump
from scheduler.shared_stats import GateTotals, SharedStats
from scheduler.store import BucketLimits, Step, Store
from scheduler.tenants import TenantRegistry
from scheduler.timers import AsyncioTimers, Timers

__all__ = ["FailureMode", "SharedDispatcher", "SharedOptions", "StoreHealth"]


class SharedDispatcher(SharedPump):
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
        self.health = StoreHealth()
        self.admitted_total = 0
        self.decisions_total = 0
        # Candidates the store held out of the fair-share reserve (reserve.py).
        self.reserve_holds_total = 0
        # Largest batched counter increment sent at once: how stale a tenant's counter
        # was for the other replicas (weighted tokens).
        self.max_charge_lag = 0.0
        self._local = LocalQueues(options.batch_every_n)
        self._entries: dict[str, Entry] = {}  # lease id -> entry (queued or in flight)
        self._lease_ids: dict[int, str] = {}  # id(request) -> lease id
        self._seq = itertools.count(1)
        self._shared = Pending()  # for the shared store
        self._announced: set[str] = set()
        self._offered: set[str] = set()  # lease ids in the step awaiting its answer
        self._full_until_s = -math.inf
        self._next_flush_s = -math.inf
        self._next_heartbeat_s = -math.inf
        self._next_probe_s = math.inf
        self._fallback: MemoryStore | None = None
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._closing = False
        self._contacted = False  # a first step finding an empty store is no loss
        self._stats = SharedStats(clock)  # what stats() reports besides the above

    # -- life cycle ------------------------------------------------------------
    async def start(self) -> None:
        for cfg in self.quotas.tenants:
            with contextlib.suppress(StoreUnavailable):
                await self.store.put_tenant(cfg)
        self._task = asyncio.create_task(self._run(), name=f"shared-dispatcher-{self.replica_id}")

    async def aclose(self) -> None:
        """Stop the pump; hand the store what is pending (settlements, charges)."""
        self._closing = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        if self.health.mode == "ok":
            with contextlib.suppress(StoreUnavailable):
                step = self._take_pending(Step(self.budget.limits, w_in=self.options.w_in))
                step.withdraw = sorted(self._announced)
                await self.store.step(self.replica_id, step)
        await self.store.aclose()

    @property
    def queued(self) -> int:
        return len(self._local)

    @property
    def in_flight(self) -> int:
        return self.budget.in_flight_requests

    @property
    def pending_settlements(self) -> int:
        """Settlements not yet handed to the shared store."""
        return len(self._shared.settlements)

    @property
    def paused_tenants(self) -> dict[str, float]:
        return dict(self._local.paused_until)

    def set_limits(self, limits: AdmissionLimits) -> None:
        self.budget.limits = limits
        self._kick()

    def set_tenants(self, tenants: TenantRegistry) -> None:
        self.quotas.tenants = tenants
        self._local.paused_until.clear()
        self._kick()

    def _kick(self) -> None:
        self._full_until_s = -math.inf
        self._wake.set()

    # -- arrival -----------------------------------------------------------------
    async def admit(self, req: QueuedRequest) -> None:
        """Wait until `req` is admitted fleet-wide, or raise a SchedulingError."""
        if self.health.mode == "closed":
            raise StoreUnavailable("the shared state store is unreachable; retry later")
        cfg = self.quotas.tenants.resolve(req.tenant_id, req.priority)
        req.tenant_id = cfg.tenant_id
        buckets = BucketLimits.of(cfg.quotas)
        try:
            check_caps(cfg, req, buckets.tokens_burst)
        except RequestTooLarge as exc:
            self._stats.tally.refused(exc)
            raise
        q = cfg.quotas
        if q.max_queued is not None and self._local.queued(cfg.tenant_id) >= q.max_queued:
            raise self._stats.tally.refused(
                QuotaExceeded(
                    cfg.tenant_id,
                    "max_queued",
                    f"{self._local.queued(cfg.tenant_id)} requests already queued on this "
                    f"replica; the limit is {q.max_queued}",
                )
            )
        req.seq = next(self._seq)
        req.arrival_s = self.clock.now_s()
        loop = asyncio.get_running_loop()
        entry = Entry(req, cfg, f"{self.replica_id}:{req.seq}", loop.create_future(), buckets)
        if cfg.over_quota == "reject" and buckets.any:
            await self._reserve(entry)
        self._entries[entry.lease_id] = entry
        self._lease_ids[id(req)] = entry.lease_id
        self.quotas.open_reservations += 1
        self._local.push(req)
        if q.max_queue_wait_s is not None:
            expires_s = req.arrival_s + q.max_queue_wait_s
            entry.expiry = self.timers.call_at(expires_s, lambda: self._expire(entry))
        self._kick()
        try:
            await entry.fut
        except asyncio.CancelledError:
            if entry.started:
                self.finish(req)  # admitted in the same tick the caller was cancelled
            elif entry.queued:
                self._drop(entry)
            raise

    async def _reserve(self, entry: Entry) -> None:
        req = entry.req
        limit, wait_s = "", 0.0
        if self.health.mode == "ok":
            try:
                limit, wait_s = await self.store.reserve(
                    entry.lease_id, req.tenant_id, req.kv_tokens, entry.buckets
                )
            except StoreUnavailable as exc:
                self._went_down(exc)
                if self.options.failure_mode == "closed":
                    raise
            else:
                entry.buckets_shared = True
        if self.health.mode == "open":
            entry.in_shared = False
            assert self._fallback is not None
            limit, wait_s = await self._fallback.reserve(
                entry.lease_id, req.tenant_id, req.kv_tokens, self._share(entry.buckets)
            )
        if wait_s > 0:
            raise self._stats.tally.refused(
                bucket_exceeded(req.tenant_id, entry.cfg.quotas, limit, wait_s, ", fleet-wide")
            )
        entry.requests_taken = 1.0 if entry.buckets.requests_per_s is not None else 0.0
        entry.tokens_taken = float(req.kv_tokens) if entry.buckets.tokens_per_s else 0.0

    def _expire(self, entry: Entry) -> None:
        if not entry.queued or not entry.wanted:
            return
        waited_s = self.clock.now_s() - entry.req.arrival_s
        limit = entry.cfg.quotas.max_queue_wait_s
        self._drop(entry)
        self._stats.expired_total += 1
        entry.fut.set_exception(
            QueueTimeout(
                entry.req.tenant_id,
                "max_queue_wait_s",
                f"request {entry.req.request_id!r} waited {waited_s:.3f} s in the queue; "
                f"the limit is {limit:g} s",
            )
        )

    def _drop(self, entry: Entry) -> None:
        """Withdraw a queued entry: give back what it reserved."""
        entry.queued = False
        entry.cancelled = True
        if entry.expiry is not None:
            entry.expiry.cancel()
        self._local.remove(entry.req)
        self.quotas.open_reservations -= 1
        if entry.lease_id in self._offered:
            return  # the step in flight may admit it; `_after_offer` settles it then
        self._forget(entry)
        if entry.requests_taken or entry.tokens_taken:
            self._settle(entry)
        self._wake.set()

    # -- in flight -----------------------------------------------------------------
    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        entry = self._entries.get(self._lease_of(req))
        if entry is None or not entry.started or tokens <= 0:
            return
        entry.output_tokens += tokens
        delta = self.options.w_out * tokens / entry.cfg.weight
        self._local.mirror[req.tenant_id] = self._local.mirror.get(req.tenant_id, 0.0) + delta
        self._shared.charge(req.tenant_id, delta)
        if self._fallback is not None:
            self._fallback.counters[req.tenant_id] = (
                self._fallback.counters.get(req.tenant_id, 0.0) + delta
            )
        if self._next_flush_s == math.inf or self._next_flush_s < self.clock.now_s():
            self._next_flush_s = self.clock.now_s() + self.options.flush_s
            self._wake.set()

    def finish(self, req: QueuedRequest) -> None:
        """The admitted request left the engine (done, cancelled or failed)."""
        entry = self._entries.get(self._lease_of(req))
        if entry is None or not entry.started:
            raise AssertionError(f"finish({req.request_id!r}) for a request not in flight")
        self._forget(entry)
        self.budget.release(req)
        self.quotas.open_reservations -= 1
        self._settle(entry)
        self._local.resume(req.tenant_id)  # it may have waited for max_concurrent
        self._kick()

    def _lease_of(self, req: QueuedRequest) -> str:
        return self._lease_ids.get(id(req), "")

    def _forget(self, entry: Entry) -> None:
        if self._entries.pop(entry.lease_id, None) is not None:
            self._stats.ended(entry)
        self._lease_ids.pop(id(entry.req), None)

    def _settle(self, entry: Entry) -> None:
        """Give back the lease and the unused reservation, to whichever store holds them."""
        s = entry.settlement()
        none = replace(s, refund_requests=0.0, refund_tokens=0.0)
        if self._fallback is not None:
            local = none if entry.buckets_shared else s
            self._fallback.step_now(self.replica_id, Step(self.budget.limits, settlements=[local]))
        if entry.in_shared or entry.buckets_shared:
            self._shared.settlements.append(s if entry.buckets_shared else none)

    # -- decisions made (by the store, or the fail-open fallback) ---------------------
    def _after_offer(self, admitted: list[str], step: Step) -> None:
        """Start what was admitted; settle what was dropped while the step was away."""
        for c in step.candidates:
            entry = self._entries.get(c.lease_id)
            if entry is None:
                continue
            if c.lease_id in admitted:
                if c.take_buckets:
                    entry.buckets_shared = entry.in_shared
                    entry.requests_taken = 1.0 if entry.buckets.requests_per_s else 0.0
                    entry.tokens_taken = float(c.kv_tokens) if entry.buckets.tokens_per_s else 0.0
                self._start(entry)
            elif entry.cancelled:
                self._forget(entry)
                if entry.requests_taken or entry.tokens_taken:
                    self._settle(entry)

    def _start(self, entry: Entry) -> None:
        if not entry.wanted:
            # Its caller left while the decision was made: give the lease and all it took back.
            if entry.queued:
                entry.queued, entry.cancelled = False, True
                self._local.remove(entry.req)
                self.quotas.open_reservations -= 1
                if entry.expiry is not None:
                    entry.expiry.cancel()
            self._forget(entry)
            self._settle(entry)
            return
        self._local.remove(entry.req)
        if entry.expiry is not None:
            entry.expiry.cancel()
        entry.queued = False
        entry.started = True
        self.budget.reserve(entry.req)
        self.admitted_total += 1
        entry.fut.set_result(None)

    # -- the front door and its stats (scheduler/gate.py) ----------------------------
    def admitted(self, req: QueuedRequest) -> Admission:
        """`async with dispatcher.admitted(req) as ticket:` (see scheduler/gate.py)."""
        return Admission(self, req)

    async def refresh_stats(self) -> None:
        """Read the store's fleet-wide state (bucket levels, counters) for stats()."""
        await self._stats.refresh(self.store)

    def stats(self, include: Iterable[str] = ()) -> GateStats:
        """Live state for admin and telemetry (see shared_stats.py)."""
        return self._stats.build(
            list(self._entries.values()),
            self._local,
            self.quotas.tenants,
            self.budget,
            GateTotals(self.admitted_total, self.reserve_holds_total, self.health.mode),
            include,
        )
