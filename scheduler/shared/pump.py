"""The pump of `SharedAdmission`: one `Step` to the shared store at a time.

An async task sleeps until something is due — a settlement or a backlog
change to send, batched output charges (`flush_s`), a heartbeat
(`heartbeat_s`), a paused tenant's resume time, or a decision once the engine
may have room again (`poll_s` after the store said it was full; at once after
a local arrival or finish) — then sends one step carrying everything owed
(the `Outbox`) and the heads of the eligible local tenants, and applies the
outcome. While the store is down it makes the fail-open decisions against the
`FailoverController`'s fallback, or probes (shared_failover.py). While the
store is suspect (a call failed, not yet failed over) it retries after the
controller's backoff.

After the store comes back from an outage, or is found wiped (the step that
recreates the state says so; the other replicas see counters go back), the
pump offers no candidate for `heartbeat_s + retry_s`: the time every live replica takes
to re-register its in-flight leases (a heartbeat, or a probe), so that no
admission is decided against a fleet count missing them (the engine limit).

The pump owns the task, the due times and what the fleet was told (announced
tenants, candidates in flight); the decisions reach the requests through
`Offers` (`SharedAdmission`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Callable, Iterable, Set
from typing import Protocol

from scheduler import rules
from scheduler.budget import AdmissionBudget
from scheduler.clock import Clock
from scheduler.errors import StoreUnavailable
from scheduler.quotas import BucketLimits
from scheduler.request import QueuedRequest
from scheduler.shared.failover import FailoverController
from scheduler.shared.local import Entries, Entry, LocalQueues, Place
from scheduler.shared.options import SharedOptions
from scheduler.shared.outbox import Outbox
from scheduler.state.store import Candidate, Step, StepOutcome, Store
from scheduler.tasks import raise_if_cancelling, stop_task
from scheduler.timers import Timers

log = logging.getLogger("scheduler.shared.dispatcher")


class Offers(Protocol):
    """Where the pump's decisions land (`SharedAdmission`)."""

    def after_offer(
        self,
        admitted: list[str],
        step: Step,
        decided_by: Place,
        lent: Set[str] = frozenset(),
        light: Set[str] = frozenset(),
    ) -> None:
        """Start what was admitted (its lease is in the store `decided_by`; `lent`:
        beyond the room, `light`: its tenant light across the fleet); settle what was
        dropped while the step was away."""
        ...

    def weights(self, tenants: Iterable[str]) -> dict[str, float]: ...

    def give_back(self, c: Candidate) -> None:
        """Undo the store's admission of `c` (release its lease and what it took); it
        stays queued, under a new lease id."""
        ...


class Pump:
    def __init__(
        self,
        store: Store,
        clock: Clock,
        timers: Timers,
        options: SharedOptions,
        *,
        budget: AdmissionBudget,
        local: LocalQueues,
        entries: Entries,
        entry_of: Callable[[QueuedRequest], Entry | None],
        outbox: Outbox,
        failover: FailoverController,
        offers: Offers,
    ) -> None:
        self._store = store
        self._clock = clock
        self._timers = timers
        self._options = options
        self._budget = budget
        self._local = local
        self._entries = entries
        self._entry_of = entry_of
        self._outbox = outbox
        self._failover = failover
        self._offers = offers
        self.decisions_total = 0
        # Candidates held out of the fair-share reserve (reserve.py).
        self.reserve_holds_total = 0
        # Largest batched counter increment sent at once: how stale a tenant's counter
        # was for the other replicas (weighted tokens).
        self.max_charge_lag = 0.0
        # Times the task died of an unexpected error and was restarted (a bug; logged).
        self.restarts_total = 0
        self._announced: set[str] = set()
        # Queue lengths (capped) the store has of this replica's backlogged tenants.
        self._sent_queued: dict[str, int] = {}
        self._offered: set[str] = set()  # lease ids in the step awaiting its answer
        self._full_until_s = -math.inf
        # Kicks so far: one during a step outdates that step's "full" (the finish
        # that freed room was not in it).
        self._kicks = 0
        # No candidates before this (re-registration after an outage or a wipe).
        self._hold_until_s = -math.inf
        # Suspect store: the next try after a failed call.
        self._retry_at_s = -math.inf
        self._next_heartbeat_s = -math.inf
        self._contacted = False  # a first step finding an empty store is no loss
        # Counters as the store last returned them: they only grow, unless wiped.
        self._store_counters: dict[str, float] = {}
        # The fleet's requests in flight after the last step (None: no step yet).
        self._fleet_in_flight: int | None = None
        self._wake = asyncio.Event()
        self._waiting = False  # the task waits for something to become due
        self._task: asyncio.Task[None] | None = None
        self._closing = False

    # -- life cycle ----------------------------------------------------------------
    def start(self) -> None:
        if self._closing:
            return
        name = f"shared-pump-{self._options.replica_id}"
        self._task = asyncio.create_task(self._run(), name=name)
        self._task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task[None]) -> None:
        """The task ends only when stopped: anything else is a bug, logged and restarted."""
        if self._closing or task.cancelled():
            return
        exc = task.exception()
        self.restarts_total += 1
        log.error("shared pump died (%r): restarting it", exc, exc_info=exc)
        self._offered = set()
        self._full_until_s = -math.inf
        # After `retry_s`: a bug that kills it at once must not spin.
        asyncio.get_running_loop().call_later(self._options.retry_s, self.start)

    async def stop(self) -> None:
        """Stop the task; hand the store what is owed and withdraw from the backlog."""
        self._closing = True
        await stop_task(self._task)
        await self._failover.aclose()
        if self._failover.ok:
            with contextlib.suppress(StoreUnavailable):
                step = self._outbox.take_into(self._options.step(self._budget.limits))
                step.withdraw = sorted(self._announced)
                await self._store.step(self._options.replica_id, step)

    def wake(self) -> None:
        """Something is due now (a settlement, a withdrawal)."""
        self._wake.set()

    def kick(self) -> None:
        """Room or eligibility changed: look for a decision at once."""
        self._kicks += 1
        self._full_until_s = -math.inf
        self._wake.set()

    def forget(self, tenant_id: str) -> None:
        """A tenant idle here for the idle TTL: drop what was told of it and seen."""
        self._store_counters.pop(tenant_id, None)
        self._sent_queued.pop(tenant_id, None)
        self._wake.set()  # the store forgets it too (Step.forget)

    def awaiting(self, lease_id: str) -> bool:
        """`lease_id` rides in the step in flight: its answer settles it."""
        return lease_id in self._offered

    @property
    def told_everything(self) -> bool:
        """No settlement owed, the backlog announced as it is, no step awaiting its answer."""
        return (
            not self._outbox.owed_now
            and self._announced == set(self._local.backlogged())
            and not self._offered
        )

    @property
    def idle(self) -> bool:
        """The task waits for something to become due, nothing is due at once and
        the store has been told everything (tests settle on it)."""
        return self._waiting and not self._wake.is_set() and self.told_everything

    # -- the loop ------------------------------------------------------------------
    async def _run(self) -> None:
        while not self._closing:
            due_s = self._next_due_s()
            delay_s = due_s - self._clock.now_s()
            if delay_s > 0:
                timer = self._timers.call_at(due_s, self._wake.set) if delay_s < 3600 else None
                self._waiting = True
                try:
                    await self._wake.wait()
                finally:
                    self._waiting = False
                if timer is not None:
                    timer.cancel()
            self._wake.clear()
            now_s = self._clock.now_s()
            self._local.resume_due(now_s)
            if self._failover.ok:
                await self._shared_tick(now_s)
            else:
                if now_s >= self._failover.next_probe_s:
                    await self._probe()
                if self._failover.mode == "open":
                    self._local_tick()

    def _next_due_s(self) -> float:
        if not self._failover.ok:
            due = self._failover.next_probe_s
            if self._failover.mode == "open" and self._local.eligible():
                due = min(due, self._full_until_s)
            return min(due, self._local.next_resume_s())
        if self._outbox.owed_now or set(self._local.backlogged()) != self._announced:
            return self._retry_at_s
        due = self._next_heartbeat_s
        if self._outbox.charges:
            due = min(due, self._outbox.flush_due_s)
        if self._local.eligible():
            due = min(due, max(self._full_until_s, self._hold_until_s))
        return max(self._retry_at_s, min(due, self._local.next_resume_s()))

    def _hold(self, now_s: float) -> None:
        """Admit nothing until every live replica has re-registered its leases."""
        self._hold_until_s = now_s + self._options.heartbeat_s + self._options.retry_s

    # -- shared decisions ------------------------------------------------------------
    def _build_step(self, now_s: float) -> Step:
        step = self._outbox.take_into(self._options.step(self._budget.limits))
        self.max_charge_lag = max(self.max_charge_lag, *step.charges.values(), 0.0)
        local = self._local
        backlogged = set(local.backlogged())
        eligible = set(local.eligible())
        # Backlogged here = something queued here, eligible or held by its own limits
        # (holding is not idling: it keeps its place and is no floor for lifts, its
        # queue length negative). One that left while held and comes back while
        # still held never stopped being backlogged: it rejoins without a lift.
        rejoin = (local.held_back & backlogged) - self._announced
        step.announce = sorted(backlogged - self._announced - rejoin)
        step.withdraw = sorted(self._announced - backlogged)
        withdrawn = local.held_back | set(step.withdraw)
        local.held_back = {t for t in withdrawn if local.held(t)} - rejoin
        if now_s >= self._next_heartbeat_s:
            step.backlogged = sorted((self._announced & backlogged) | rejoin)
            step.renew = self._entries.leases()
        elif rejoin:
            step.backlogged = sorted(rejoin)
        members = (self._announced | set(step.announce) | set(step.backlogged or ())) - set(
            step.withdraw
        )
        for t in members:
            n = min(local.queued(t), rules.LIGHT_QUEUE + 1)
            n = n if t in eligible and t not in local.at_cap else -n
            if self._sent_queued.get(t) != n:
                step.queued[t] = n
        named = {*step.announce, *(step.backlogged or ()), *(x.tenant_id for x in step.renew or ())}
        step.weights = self._offers.weights(named)
        # Output charges can change which tenant is next (VTC): a head waiting behind
        # one too big for the room may now be first and fit, so a step that carries
        # them decides again while the fleet has a free slot (as the Dispatcher
        # pumps on output tokens), in the same round trip.
        slot_free = self._fleet_in_flight is None or (
            self._fleet_in_flight < step.limits.max_requests
        )
        recheck = bool(step.charges) and slot_free
        if (now_s >= self._full_until_s or recheck) and now_s >= self._hold_until_s:
            # Beyond each tenant's head, as many more as the fleet's slots could take
            # (what was in flight at the last step, less what this step settles).
            room = None
            if self._fleet_in_flight is not None:
                room = step.limits.max_requests - self._fleet_in_flight + len(step.settlements)
            step.candidates = self._candidates(lambda e: e.buckets, room)
        return step

    def _candidates(
        self, buckets: Callable[[Entry], BucketLimits], room: int | None = None
    ) -> list[Candidate]:
        """The next requests of the eligible tenants (up to `per_tenant` each, and
        beyond their heads no more than `room` in all, when known), each with how
        many of its tenant's are queued here from it on."""
        out: list[Candidate] = []
        ahead: dict[str, int] = {}
        opts = self._options
        heads = self._local.heads(opts.max_candidates, opts.per_tenant)
        extra = math.inf if room is None else room - len({r.tenant_id for r in heads})
        for req in heads:
            t = req.tenant_id
            n = ahead.get(t, 0)
            if n:
                if extra <= 0:
                    continue
                extra -= 1
            entry = self._entry_of(req)
            assert entry is not None
            ahead[t] = n + 1
            if opts.locality is not None:
                # What it would add to the engine's KV, and charge (QueuedRequest.kv_tokens).
                req.cached_estimate = opts.locality(req)
            out.append(entry.candidate(buckets(entry), self._local.queued(t) - n))
        return out

    async def _shared_tick(self, now_s: float) -> None:
        step = self._build_step(now_s)
        if step.is_empty():
            return
        previous = set(self._announced)
        rejoined = set(step.backlogged or ()) - self._announced
        self._announced = (self._announced | set(step.announce) | rejoined) - set(step.withdraw)
        self._offered = {c.lease_id for c in step.candidates}
        kicks = self._kicks
        try:
            out = await self._store.step(self._options.replica_id, step)
        except StoreUnavailable as exc:
            self._announced = previous
            self._outbox.requeue(step)
            self._offered = set()
            if self._failover.failed(exc, now_s):
                self._full_until_s = -math.inf
            else:
                self._retry_at_s = self._clock.now_s() + self._failover.backoff_s()
            self._offers.after_offer([], step, Place.SHARED)
            raise_if_cancelling(exc)
            return
        finally:
            self._outbox.sent()
        self._offered = set()
        self._retry_at_s = -math.inf
        self._failover.succeeded()
        self._sent_queued.update(step.queued)
        for t in step.withdraw:
            self._sent_queued.pop(t, None)
        if step.renew is not None:
            self._next_heartbeat_s = now_s + self._options.heartbeat_s
            self._failover.observe_soon()
        self._apply(step, out, now_s, stale=self._kicks != kicks)

    def _apply(self, step: Step, out: StepOutcome, now_s: float, *, stale: bool) -> None:
        """`stale`: room or eligibility changed while the step was away."""
        self.decisions_total += bool(step.candidates)
        self._local.mirror.update(out.counters)
        # The step that recreates the state says so; the other replicas' see counters
        # that went back (they never decrease otherwise).
        went_back = any(c < self._store_counters.get(t, -math.inf) for t, c in out.counters.items())
        self._store_counters.update(out.counters)
        self._fleet_in_flight = out.in_flight
        admitted = [step.candidates[i].lease_id for i in out.admitted]
        if out.state_lost or went_back:
            if self._contacted:
                log.warning("shared state was lost (Redis wiped?): re-registering")
                self._hold(now_s)
                # Decided against a fleet count missing the leases not yet
                # re-registered: give them back; they wait out the hold, queued.
                for i in out.admitted:
                    self._offers.give_back(step.candidates[i])
                admitted = []
            self._next_heartbeat_s = -math.inf
            self._announced = set()
            self._sent_queued = {}
            self._wake.set()
        self._contacted = True
        self.reserve_holds_total += len(out.held)
        if (out.full or out.turn or (out.held and not out.admitted)) and not stale:
            # Held out of the reserve: room or shares change when a request
            # ends (a local finish kicks the pump; others' are polled). Another
            # replica's turn: it admits its tenant; this one looks again.
            self._full_until_s = now_s + self._options.poll_s
        elif step.candidates:
            # Decided without finding the engine full (e.g. a recheck after output
            # charges): the next step decides again at once.
            self._full_until_s = -math.inf
        self._offers.after_offer(admitted, step, Place.SHARED, *self._marked(step, out))
        # After starting what was admitted (which ends a tenant's hold at max_concurrent,
        # `LocalQueues.remove`): a candidate of the same tenant blocked in this step
        # holds it again, else it would count as eligible, a floor for others' lifts.
        self._pause_blocked(step, out, now_s)
        self._failover.saw(out)
        if admitted:
            self._wake.set()

    def _pause_blocked(self, step: Step, out: StepOutcome, now_s: float) -> None:
        for i, wait_s in out.blocked.items():
            # At max_concurrent (inf): offered again every poll, still held meanwhile.
            at_cap = math.isinf(wait_s)
            until = now_s + (self._options.poll_s if at_cap else wait_s)
            self._local.pause(step.candidates[i].tenant_id, until, at_cap)

    # -- while the store is down -------------------------------------------------------
    async def _probe(self) -> None:
        out = await self._failover.probe()
        if out is None:
            return
        self._failover.saw(out)
        now_s = self._clock.now_s()
        self._announced = set()
        self._sent_queued = {}
        self._next_heartbeat_s = now_s + self._options.heartbeat_s
        self._full_until_s = -math.inf
        self._retry_at_s = -math.inf
        self._hold(now_s)
        self._store_counters = dict(out.counters)
        self._local.mirror.update(out.counters)
        self._wake.set()

    def _local_tick(self) -> None:
        """Fail-open: decide against the local fallback, this replica's share of everything."""
        fb = self._failover.fallback
        assert fb is not None
        while True:
            limits = self._failover.local_limits()
            candidates = self._candidates(lambda e: self._failover.share(e.buckets))
            if not candidates or limits is None:
                return  # (no room at all: the fleet was full when the store went down)
            step = self._options.step(limits)
            step.candidates = candidates
            out = fb.step_now(self._options.replica_id, step)
            now_s = self._clock.now_s()
            self._local.mirror.update(out.counters)
            self.reserve_holds_total += len(out.held)
            if not out.admitted:
                self._pause_blocked(step, out, now_s)
                if out.full:
                    self._full_until_s = math.inf  # a local finish kicks the pump
                elif out.held:
                    self._full_until_s = now_s + self._options.poll_s
                return
            for i in out.admitted:
                c = step.candidates[i]
                self._outbox.charge(c.tenant_id, c.charge(step.w_in, step.w_cached))
            admitted = [step.candidates[i].lease_id for i in out.admitted]
            self._offers.after_offer(admitted, step, Place.LOCAL, *self._marked(step, out))
            self._pause_blocked(step, out, now_s)  # after it, as in a shared step

    @staticmethod
    def _marked(step: Step, out: StepOutcome) -> tuple[set[str], set[str]]:
        """The admitted leases lent room, and those whose tenant was light."""
        c = step.candidates
        return {c[i].lease_id for i in out.lent}, {c[i].lease_id for i in out.light}
