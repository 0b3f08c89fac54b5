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

Store failure (`failure_mode`): "open" continues with a local `MemoryStore`
holding this replica's share of the limits (buckets and engine room ÷
`replicas`) and local fairness; "closed" refuses new requests with
StoreUnavailable (UNAVAILABLE) and rejects the queued ones. Either way,
streams in flight continue; their settlements wait. When the store answers
again, the replica reconciles: replays settlements (idempotent), sends the
counter charges it owes, re-registers every in-flight request's lease, and
resumes. Every transition is logged and counted in `health`.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
from dataclasses import dataclass, field, replace
from typing import Literal

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.errors import QueueTimeout, QuotaExceeded, StoreUnavailable
from scheduler.memory_store import MemoryStore
from scheduler.quotas import TenantUsage, check_caps
from scheduler.request import QueuedRequest
from scheduler.shared_local import Entry, LocalQueues
from scheduler.store import BucketLimits, Lease, Settlement, Step, StepOutcome, Store
from scheduler.tenants import TenantRegistry
from scheduler.vtc import DEFAULT_BATCH_EVERY_N

log = logging.getLogger(__name__)

FailureMode = Literal["open", "closed"]


@dataclass(frozen=True, slots=True)
class SharedOptions:
    replica_id: str
    failure_mode: FailureMode = "open"
    # Replicas in the fleet: the fail-open fallback enforces limits ÷ replicas.
    replicas: int = 1
    w_in: float = 1.0
    w_out: float = 2.0
    flush_s: float = 0.005
    poll_s: float = 0.02
    heartbeat_s: float = 1.0
    retry_s: float = 0.5
    max_candidates: int = 16
    batch_every_n: int | None = DEFAULT_BATCH_EVERY_N


@dataclass(slots=True)
class StoreHealth:
    """The store's state as this replica sees it (exported by the observability work)."""

    mode: Literal["ok", "open", "closed"] = "ok"
    transitions_total: int = 0
    last_error: str = ""
    reconciled_settlements: int = 0
    reconciled_leases: int = 0

    @property
    def degraded(self) -> bool:
        return self.mode != "ok"


@dataclass(slots=True)
class _QuotaView:
    """What the service reads from `dispatcher.quotas`."""

    tenants: TenantRegistry
    open_reservations: int = 0

    def usages(self) -> list[TenantUsage]:
        """Per-tenant usage lives in the shared store; none is kept locally."""
        return []


@dataclass(slots=True)
class _Pending:
    """Work for the next step to the shared store."""

    settlements: list[Settlement] = field(default_factory=list)
    charges: dict[str, float] = field(default_factory=dict)

    def charge(self, tenant_id: str, delta: float) -> None:
        self.charges[tenant_id] = self.charges.get(tenant_id, 0.0) + delta


class SharedDispatcher:
    def __init__(
        self,
        store: Store,
        limits: AdmissionLimits,
        clock: Clock,
        options: SharedOptions,
        *,
        tenants: TenantRegistry | None = None,
    ) -> None:
        self.store = store
        self.clock = clock
        self.options = options
        self.replica_id = options.replica_id
        self.quotas = _QuotaView(tenants or TenantRegistry.permissive())
        # This replica's in-flight requests (the fleet's count lives in the store).
        self.budget = AdmissionBudget(limits)
        self.health = StoreHealth()
        self.admitted_total = 0
        self.decisions_total = 0
        # Largest batched counter increment sent at once: how stale a tenant's counter
        # was for the other replicas (weighted tokens).
        self.max_charge_lag = 0.0
        self._local = LocalQueues(options.batch_every_n)
        self._entries: dict[str, Entry] = {}  # lease id -> entry (queued or in flight)
        self._lease_ids: dict[int, str] = {}  # id(request) -> lease id
        self._seq = itertools.count(1)
        self._shared = _Pending()  # for the shared store
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
        check_caps(cfg, req, buckets.tokens_burst)
        q = cfg.quotas
        if q.max_queued is not None and self._local.queued(cfg.tenant_id) >= q.max_queued:
            raise QuotaExceeded(
                cfg.tenant_id,
                "max_queued",
                f"{self._local.queued(cfg.tenant_id)} requests already queued on this "
                f"replica; the limit is {q.max_queued}",
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
            entry.expiry = loop.call_later(q.max_queue_wait_s, self._expire, entry)
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
            q = entry.cfg.quotas
            rate = (
                f"{q.requests_per_s:g} requests/s"
                if limit == "requests_per_s"
                else f"{q.tokens_per_min:g} tokens/min"
            )
            raise QuotaExceeded(
                req.tenant_id,
                limit,
                f"over its {limit} quota ({rate}, fleet-wide); retry in {wait_s:.3f} s",
                retry_after_s=None if math.isinf(wait_s) else wait_s,
            )
        entry.requests_taken = 1.0 if entry.buckets.requests_per_s is not None else 0.0
        entry.tokens_taken = float(req.kv_tokens) if entry.buckets.tokens_per_s else 0.0

    def _expire(self, entry: Entry) -> None:
        if not entry.queued or not entry.wanted:
            return
        waited_s = self.clock.now_s() - entry.req.arrival_s
        limit = entry.cfg.quotas.max_queue_wait_s
        self._drop(entry)
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
        self._entries.pop(entry.lease_id, None)
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

    # -- the pump --------------------------------------------------------------------
    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while not self._closing:
            delay_s = self._next_due_s() - self.clock.now_s()
            if delay_s > 0:
                timer = loop.call_later(delay_s, self._wake.set) if delay_s < 3600 else None
                await self._wake.wait()
                if timer is not None:
                    timer.cancel()
            self._wake.clear()
            now_s = self.clock.now_s()
            self._local.resume_due(now_s)
            if self.health.mode == "ok":
                await self._shared_tick(now_s)
            else:
                if now_s >= self._next_probe_s:
                    await self._probe()
                if self.health.mode == "open":
                    self._local_tick()

    def _next_due_s(self) -> float:
        p = self._shared
        if self.health.mode != "ok":
            due = self._next_probe_s
            if self.health.mode == "open" and self._local.eligible():
                due = min(due, self._full_until_s)
            return min(due, self._local.next_resume_s())
        if p.settlements or set(self._local.eligible()) != self._announced:
            return -math.inf
        due = self._next_heartbeat_s
        if p.charges:
            due = min(due, self._next_flush_s)
        if self._local.eligible():
            due = min(due, self._full_until_s)
        return min(due, self._local.next_resume_s())

    def _take_pending(self, step: Step) -> Step:
        step.settlements, self._shared.settlements = self._shared.settlements, []
        step.charges, self._shared.charges = self._shared.charges, {}
        return step

    def _build_step(self, now_s: float) -> Step:
        step = self._take_pending(Step(self.budget.limits, w_in=self.options.w_in))
        self.max_charge_lag = max(self.max_charge_lag, *step.charges.values(), 0.0)
        eligible = set(self._local.eligible())
        step.announce = sorted(eligible - self._announced)
        step.withdraw = sorted(self._announced - eligible)
        if now_s >= self._next_heartbeat_s:
            step.backlogged = sorted(self._announced & eligible)
            step.renew = [
                Lease(e.lease_id, e.req.tenant_id, e.req.kv_tokens)
                for e in self._entries.values()
                if e.started
            ]
        if now_s >= self._full_until_s:
            heads = self._local.heads(self.options.max_candidates)
            step.candidates = [
                self._entries[self._lease_of(h)].candidate(self._entries[self._lease_of(h)].buckets)
                for h in heads
            ]
        return step

    async def _shared_tick(self, now_s: float) -> None:
        step = self._build_step(now_s)
        if step.is_empty():
            return
        previous = set(self._announced)
        self._announced = (self._announced | set(step.announce)) - set(step.withdraw)
        self._offered = {c.lease_id for c in step.candidates}
        try:
            out = await self.store.step(self.replica_id, step)
        except StoreUnavailable as exc:
            self._announced = previous
            self._shared.settlements[:0] = step.settlements
            for tenant, delta in step.charges.items():
                self._shared.charge(tenant, delta)
            self._offered = set()
            self._went_down(exc)
            self._after_offer([], step)
            return
        finally:
            self._next_flush_s = math.inf
        self._offered = set()
        if step.renew is not None:
            self._next_heartbeat_s = now_s + self.options.heartbeat_s
        self._apply(step, out, now_s)

    def _apply(self, step: Step, out: StepOutcome, now_s: float) -> None:
        self.decisions_total += bool(step.candidates)
        self._local.mirror.update(out.counters)
        if out.state_lost:
            if self._contacted:
                log.warning("shared state was lost (Redis restarted empty?): re-registering")
            self._next_heartbeat_s = -math.inf
            self._announced = set()
            self._wake.set()
        self._contacted = True
        admitted = [step.candidates[out.admitted].lease_id] if out.admitted is not None else []
        for i, wait_s in out.blocked.items():
            until = now_s + (self.options.poll_s if math.isinf(wait_s) else wait_s)
            self._local.pause(step.candidates[i].tenant_id, until)
        if out.full:
            self._full_until_s = now_s + self.options.poll_s
        self._after_offer(admitted, step)
        if admitted:
            self._wake.set()

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

    # -- failure and recovery ------------------------------------------------------
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
            fb.step_now(self.replica_id, Step(self.budget.limits, renew=renew))
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
            step = Step(self._local_limits(), w_in=self.options.w_in, candidates=cands)
            out = fb.step_now(self.replica_id, step)
            now_s = self.clock.now_s()
            self._local.mirror.update(out.counters)
            for i, wait_s in out.blocked.items():
                until = now_s + (self.options.poll_s if math.isinf(wait_s) else wait_s)
                self._local.pause(cands[i].tenant_id, until)
            if out.admitted is None:
                if out.full:
                    self._full_until_s = math.inf  # a local finish kicks the pump
                return
            entry = entries[out.admitted]
            c = cands[out.admitted]
            entry.in_shared = False
            self._shared.charge(c.tenant_id, self.options.w_in * c.prompt_tokens / c.weight)
            self._after_offer([c.lease_id], step)

    async def _probe(self) -> None:
        """Try the store; if it answers, reconcile and go back to shared decisions."""
        self._next_probe_s = self.clock.now_s() + self.options.retry_s
        in_flight = [e for e in self._entries.values() if e.started]
        step = self._take_pending(Step(self.budget.limits, w_in=self.options.w_in))
        step.renew = [Lease(e.lease_id, e.req.tenant_id, e.req.kv_tokens) for e in in_flight]
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
