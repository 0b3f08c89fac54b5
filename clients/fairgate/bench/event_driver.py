"""A discrete-event driver: dispatcher + simulator core on a fake clock, no sleeping.

Arrivals, cancels and the dispatcher's wake-ups are events in time; the
engine (SimCore) advances by whole steps, each as long as its modelled
duration. Events that fall inside a step are handled at their own time, then
the step's tokens are reported at its end. After every dispatcher call the
driver checks work conservation and that every paused tenant will be woken.

The scheduler's property tests drive it, and `fairgate bench fairness
--virtual` replays its traces through it: the same admission rules and engine
model as a live run, on simulated time, so the numbers do not depend on the
machine's load and repeat exactly. The engines and what reaches them are
`sim_fleet.py`; a request's record is `driver_call.py`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict

from fairgate.bench.driver_call import Arrival, Call
from fairgate.bench.fairness_monitor import FairnessMonitor
from fairgate.bench.sim_fleet import SimFleet
from fairgate.bench.workload import distinct_prompt_ids
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.decision import judge
from scheduler.errors import SchedulingError
from scheduler.local_admission import local_dispatcher
from scheduler.ordering.policy import QueuePolicy
from scheduler.request import Locality, Priority, QueuedRequest
from scheduler.rules import Isolation, Verdict, admission_charge, cached_shortfall
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import ManualTimers
from service.engines.routing import Routing
from service.engines.simulator.core import SimConfig, SimCore
from service.engines.staged_prefill import StagedPrefill
from service.engines.stagger import Stagger

__all__ = ["Arrival", "Driver", "FairnessMonitor"]


class Driver:
    """`engines` simulated engines of one config (`sim_fleet.SimFleet`); with more
    than one (or a `routing`), requests go where `placement.Placement` puts them
    (what a pool of SGLang workers does live), and with `locality` routing
    admission asks the placement (unless `locality` is given).

    `replicas`: that many placements over the same engines, each request placed
    by the one of its replica (arrival i: replica i mod N), as N fairgate
    replicas in front of one pool; admission stays one fleet-wide decision (the
    shared store's). `share`: the replicas hear each other's routes and long
    prefills at once (prefix_share.py, live: within its ~50 ms read interval)."""

    def __init__(
        self,
        policy: QueuePolicy,
        limits: AdmissionLimits,
        sim: SimConfig,
        *,
        tenants: TenantRegistry | None = None,
        w_in: float = 1.0,
        w_out: float = 2.0,
        clock: FakeClock | None = None,
        reserve_fraction: float = 0.0,
        isolation: Isolation = Isolation.RESERVE,
        locality: Locality | None = None,
        allowance: float = 0.0,
        engines: int = 1,
        routing: Routing | None = None,
        stagger: Stagger | None = None,
        staged_prefill: StagedPrefill | None = None,
        replicas: int = 1,
        share: bool = True,
        kv_events: bool = False,
        lend_unsent: bool = False,
        round_trip: bool = True,
    ) -> None:
        self.clock = clock or FakeClock()
        self.timers = ManualTimers(self.clock)
        self.fleet = SimFleet(
            sim,
            self.clock,
            engines=engines,
            routing=routing,
            stagger=stagger,
            staged_prefill=staged_prefill,
            replicas=replicas,
            share_routes=share,
            kv_events=kv_events,
            # The priorities fairgate sends the engine (generation.py does the same).
            threshold=sim.priority_preemption_threshold if sim.priority_scheduling else None,
            tiered=isolation is Isolation.PREEMPT,
            takes_slot=isolation is Isolation.RESERVE_SLOTS,
            round_trip=round_trip,
        )
        self.workers = self.fleet.workers
        self.placement, self.placements = self.fleet.placement, self.fleet.placements
        self.staged_prefill = self.fleet.staged_prefill
        routed = self.placement is not None and self.placement.routing == "locality"
        if locality is None and routed:
            locality = self.fleet.cached_prefix
        self.dispatcher = local_dispatcher(
            policy,
            AdmissionBudget(limits),
            self.clock,
            tenants=tenants,
            timers=self.timers,
            expire_deadlines=True,
            reserve_fraction=reserve_fraction,
            isolation=isolation,
            locality=locality,
            allowance=allowance,
            # fair_light_takes_unsent_slots: the slots of the fleet's unsent requests.
            unsent=self.fleet.unsent if lend_unsent else None,
        )
        self.w_in, self.w_out = w_in, w_out
        # A cached prompt token's charge, as the policy makes it (the monitor's too).
        self.w_cached: float = getattr(policy, "w_cached", w_in)
        reg = tenants or TenantRegistry.permissive()
        self._weight = reg.weight_of
        self.monitor = FairnessMonitor(weights=defaultdict(lambda: 1.0))
        self.calls: list[Call] = []
        self._to_start: list[Call] = []
        self._events: list[tuple[float, int, str, Call | Arrival]] = []
        self._seq = itertools.count()
        # tenant -> priority -> queued count (the driver's own view of the backlog).
        self.queued: dict[str, dict[Priority, int]] = defaultdict(lambda: defaultdict(int))
        # tenant -> admissions in a row of interactive while batch waited.
        self.batch_streak: dict[str, int] = defaultdict(int)
        self.max_batch_streak = 0
        self.steps = 0

    @property
    def core(self) -> SimCore:
        """The first (with one engine, the only) engine."""
        return self.workers[0].core

    # -- bookkeeping ----------------------------------------------------------
    def backlogged(self) -> set[str]:
        return {t for t, by in self.queued.items() if sum(by.values()) > 0}

    def _dequeued(self, call: Call) -> None:
        self.queued[call.req.tenant_id][call.req.priority] -= 1
        self.monitor.update(self.backlogged())

    def _on_admitted(self, call: Call) -> None:
        tid = call.req.tenant_id
        # Service as the fair counter charges it (a cached prefix at w_cached).
        self.monitor.service[tid] += admission_charge(
            self.w_in, call.req.prompt_tokens, 1.0, call.req.charged_cached, self.w_cached
        )
        # Charged while still backlogged: update before dequeuing.
        self.monitor.update(self.backlogged())
        self._dequeued(call)
        batch_waiting = self.queued[tid][Priority.BATCH] > 0
        if call.req.priority is Priority.INTERACTIVE and batch_waiting:
            self.batch_streak[tid] += 1
            self.max_batch_streak = max(self.max_batch_streak, self.batch_streak[tid])
        else:
            self.batch_streak[tid] = 0
        call.state = "running"
        self._to_start.append(call)

    def _on_rejected(self, call: Call, error: SchedulingError) -> None:
        call.state = "expired"
        call.error = error
        self._dequeued(call)

    # -- invariants -------------------------------------------------------------
    def check(self) -> None:
        d = self.dispatcher
        s = d.state
        head = s.policy.peek_next()
        if head is not None:
            call = next(c for c in self.calls if c.req is head)
            if call.wanted():
                # Work conservation: the head waits only for room, or for the reserve.
                v, _ = judge(s.round(), head, s.reserve.fraction, s.isolation)
                waits = v in (Verdict.FULL, Verdict.HOLD)
                assert waits, "work conservation: an admissible request waits"
        next_timer = self.timers.next_s()
        for tenant_id, until_s in d.paused_tenants.items():
            if math.isinf(until_s):
                assert tenant_id in d.budget.engine, f"{tenant_id} paused forever"
            else:
                assert next_timer is not None and next_timer <= until_s, "no wake-up armed"

    # -- events -------------------------------------------------------------------
    def _push(self, at_s: float, kind: str, what: Call | Arrival) -> None:
        heapq.heappush(self._events, (at_s, next(self._seq), kind, what))

    def _next_event_s(self) -> float:
        times = [self._events[0][0]] if self._events else []
        t = self.timers.next_s()
        if t is not None:
            times.append(t)
        return min(times) if times else math.inf

    def _handle_events_until(self, until_s: float) -> None:
        while True:
            when_s = self._next_event_s()
            if when_s > until_s:
                return
            self.clock.set(max(when_s, self.clock.now_s()))
            timer_s = self.timers.next_s()
            if timer_s is not None and timer_s <= self.clock.now_s():
                self.timers.run_due()
            else:
                _, _, kind, what = heapq.heappop(self._events)
                if kind == "arrive":
                    assert isinstance(what, Arrival)
                    self._arrive(what)
                elif kind == "release":
                    pass  # a hold's time is up: `_start_admitted` below asks again
                else:
                    assert isinstance(what, Call)
                    self._cancel(what)
            self._start_admitted()
            self.check()

    def _arrive(self, a: Arrival) -> None:
        now_s = self.clock.now_s()
        deadline = now_s + a.deadline_after_s if a.deadline_after_s is not None else None
        req = QueuedRequest(
            request_id=f"r{len(self.calls)}",
            tenant_id=a.tenant_id,
            prompt_tokens=a.prompt_tokens,
            max_tokens=a.max_tokens,
            priority=a.priority,
            deadline_s=deadline,
        )
        call = Call(a, req, len(self.calls), driver=self)
        vocab = self.core.config.vocab_size
        if a.prompt_ids is not None:
            call.prompt_ids = list(a.prompt_ids)
        else:
            call.prompt_ids = distinct_prompt_ids(call.index, a.prompt_tokens, vocab)
        self.fleet.arrived(call)
        self.calls.append(call)
        self.monitor.weights[a.tenant_id] = self._weight(a.tenant_id)
        self.queued[a.tenant_id][a.priority] += 1
        call.state = "queued"
        self.monitor.update(self.backlogged())
        try:
            self.dispatcher.submit(req, call)
        except SchedulingError as exc:
            call.state = "rejected"
            call.error = exc
            self._dequeued(call)
            return
        if a.cancel_after_s is not None:
            self._push(now_s + a.cancel_after_s, "cancel", call)

    def _cancel(self, call: Call) -> None:
        if call.state == "queued":
            if call.arrival.cancel_silently:
                call.gone = True
                call.state = "cancelled"
                self._dequeued(call)
                self.dispatcher.state.decide()  # its next pump notices (or a later one does)
            else:
                assert self.dispatcher.cancel(call.req)
                call.state = "cancelled"
                self._dequeued(call)
        elif call.state == "running":
            self._end(call)

    def _start_admitted(self) -> None:
        self.fleet.release_held()
        while self._to_start:
            call = self._to_start.pop()
            if call.state != "running":
                continue
            until_s = self.fleet.start(call)
            if until_s is not None:  # held: a hold's time up is an event
                self._push(until_s, "release", call)

    def _first_token(self, call: Call) -> None:
        """Its prefill is done: the engine says what it had cached."""
        charged_cached = self.fleet.first_token(call)
        est = call.req.charged_cached
        short = cached_shortfall(self.w_in, self.w_cached, est, charged_cached, 1.0)
        self.monitor.service[call.req.tenant_id] += short
        self.dispatcher.on_cached_tokens(call.req, charged_cached)

    def _end(self, call: Call) -> None:
        """The request leaves the engine (or the hold): done, cancelled or failed."""
        self.fleet.end(call)
        call.state = "done"
        call.done_s = self.clock.now_s()
        self.dispatcher.finish(call.req)
        self._start_admitted()
        self.check()

    def run(
        self, arrivals: list[Arrival], max_steps: int = 200_000, until_s: float = math.inf
    ) -> None:
        """Until every request has ended, or the first engine step past `until_s`."""
        for a in arrivals:
            self._push(a.at_s, "arrive", a)
        while self.clock.now_s() < until_s:
            # Every engine with work steps; the one whose step ends first reports.
            for w in self.workers:
                if w.step is None and w.core.idle:
                    w.deliver_late()  # an idle engine takes them as they come
                if w.step is None and not w.core.idle:
                    w.step = w.core.step()
                    w.end_s = self.clock.now_s() + w.step.duration_s
                    self.steps += 1
                    assert self.steps < max_steps, "simulation does not terminate"
                    w.deliver_late()  # after the step it formed (sim_fleet.SimWorker.late)
            stepping = [w for w in self.workers if w.step is not None]
            if not stepping:
                if self._next_event_s() == math.inf:
                    break
                self._handle_events_until(self._next_event_s())
                continue
            w = min(stepping, key=lambda x: x.end_s)
            end_s = w.end_s
            next_s = self._next_event_s()
            if next_s < end_s:
                # An event inside the step, at its own time: an idle engine it gives
                # work to starts stepping then, not when another engine's step ends.
                self._handle_events_until(next_s)
                continue
            self._handle_events_until(end_s)
            self.clock.set(end_s)
            result, w.step = w.step, None
            assert result is not None
            if w.kv is not None:  # the step's stores and evictions, published
                w.kv.deliver()
            for em in result.emissions:
                call = self.fleet.emitted(em)
                if call is None:
                    continue  # a stage ended, or cancelled during the step
                call.output_tokens += 1
                call.token_times_s.append(end_s)
                call.output_ids.append(em.token_id)
                if call.first_token_s is None:
                    call.first_token_s = end_s
                    self._first_token(call)
                self.dispatcher.on_output_tokens(call.req, 1)
                # A charge can reorder the fair queue and admit a request now.
                self._start_admitted()
                self.monitor.service[call.req.tenant_id] += self.w_out
                self.monitor.update(self.backlogged())
                fail = call.arrival.fail_after_tokens
                if em.finish is not None:
                    self.fleet.finished(call)
                if em.finish is not None or (fail is not None and call.output_tokens >= fail):
                    self._end(call)
        if until_s == math.inf:
            assert not self.backlogged(), "requests left queued with nothing to wake them"
