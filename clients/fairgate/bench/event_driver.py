"""A discrete-event driver: dispatcher + simulator core on a fake clock, no sleeping.

Arrivals, cancels and the dispatcher's wake-ups are events in time; the
engine (SimCore) advances by whole steps, each as long as its modelled
duration. Events that fall inside a step are handled at their own time, then
the step's tokens are reported at its end. After every dispatcher call the
driver checks work conservation and that every paused tenant will be woken.

The scheduler's property tests drive it, and `fairgate bench fairness
--virtual` replays its traces through it: the same admission rules and engine
model as a live run, on simulated time, so the numbers do not depend on the
machine's load and repeat exactly.
"""

from __future__ import annotations

import dataclasses
import heapq
import itertools
import math
from collections import defaultdict, deque
from dataclasses import dataclass, field

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
from service.engines.placement import Placed, Placement, engine_request
from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.routing import Routing
from service.engines.simulator.core import (
    Emission,
    SimConfig,
    SimCore,
    SimRequest,
    StepResult,
)
from service.engines.staged_prefill import StagedPrefill, Staging
from service.engines.stagger import Stagger


@dataclass(frozen=True, slots=True)
class Arrival:
    at_s: float
    tenant_id: str
    prompt_tokens: int
    max_tokens: int
    priority: Priority = Priority.INTERACTIVE
    # Client cancel this long after arrival (queued or running); None: never.
    cancel_after_s: float | None = None
    # The caller vanishes without calling cancel (the dispatcher finds out itself).
    cancel_silently: bool = False
    deadline_after_s: float | None = None
    # The engine fails the request after this many output tokens.
    fail_after_tokens: int | None = None
    # Its prompt (shared prefixes); None: ids of its own (`distinct_prompt_ids`).
    prompt_ids: tuple[int, ...] | None = None


@dataclass(slots=True, eq=False)
class _Call:
    arrival: Arrival
    req: QueuedRequest
    index: int  # arrival order: its prompt ids (shared with no other request)
    gone: bool = False
    state: str = "new"  # queued, running, done, rejected, cancelled, expired
    output_tokens: int = 0
    admitted_s: float | None = None
    first_token_s: float | None = None
    # When each output token arrived (the end of the engine step that made it).
    token_times_s: list[float] = field(default_factory=list)
    done_s: float | None = None
    error: SchedulingError | None = None
    driver: Driver | None = None
    prompt_ids: list[int] = field(default_factory=list)
    # Where it runs (the worker's index), and the placement's record of it there.
    worker: int = 0
    placed: Placed | None = None
    cached_tokens: int = 0
    # Of those, the ones charged at the cached rate (its own stages' are not).
    charged_cached: int = 0
    output_ids: list[int] = field(default_factory=list)
    sim_req: SimRequest | None = None
    # Staged prefill (as the engine adapters do it): its progress, the engine
    # priority its stages and itself go with, and the stage under way.
    staging: Staging | None = None
    engine_priority: int = 0
    stage_req: SimRequest | None = None
    # Sent to its engine (after any cold-start hold); held since, and the engine
    # request it waits with (Placement.hold_until).
    sent_s: float | None = None
    held_since_s: float | None = None
    held_req: EngineRequest | None = None

    def wanted(self) -> bool:
        return not self.gone

    def admitted(self) -> None:
        assert self.driver is not None
        self.admitted_s = self.driver.clock.now_s()
        self.driver._on_admitted(self)

    def rejected(self, error: SchedulingError) -> None:
        assert self.driver is not None
        self.driver._on_rejected(self, error)


@dataclass
class FairnessMonitor:
    """Largest spread of W_f/w_f - W_g/w_g over intervals where both are backlogged."""

    weights: dict[str, float]
    service: dict[str, float] = field(default_factory=lambda: defaultdict(float))
    worst: float = 0.0
    _ranges: dict[tuple[str, str], tuple[float, float]] = field(default_factory=dict)
    # Service at the last moment at least `full_size` tenants were backlogged (0: off).
    full_size: int = 0
    service_while_full: dict[str, float] = field(default_factory=dict)

    def update(self, backlogged: set[str]) -> None:
        if self.full_size and len(backlogged) >= self.full_size:
            self.service_while_full = dict(self.service)
        live = sorted(backlogged)
        keep: dict[tuple[str, str], tuple[float, float]] = {}
        for i, f in enumerate(live):
            for g in live[i + 1 :]:
                d = self.service[f] / self.weights[f] - self.service[g] / self.weights[g]
                lo, hi = self._ranges.get((f, g), (d, d))
                lo, hi = min(lo, d), max(hi, d)
                keep[(f, g)] = (lo, hi)
                self.worst = max(self.worst, hi - lo)
        self._ranges = keep


@dataclass(slots=True, eq=False)
class _Worker:
    """One simulated engine of the fleet, as the placement sees it (`placement.Target`)."""

    core: SimCore
    url: str
    healthy: bool = True
    # The step under way and when it ends (None: not stepping).
    step: StepResult | None = None
    end_s: float = 0.0
    # Staged prefill's lane: the staged request whose stages go in now, and those
    # waiting for it (staged_prefill.StageLane).
    lane: _Call | None = None
    lane_queue: deque[_Call] = field(default_factory=deque)

    def slots(self) -> int:
        return self.core.config.max_running_requests

    def kv_capacity(self) -> int:
        return self.core.capacity

    def penalty(self, now_s: float) -> int:
        return 0


def _share(placements: list[Placement]) -> None:
    """Each placement hears the others' routes, long prefills, loads on each worker
    and light requests as they happen (what prefix_share.py carries between live
    replicas)."""
    for k, p in enumerate(placements):
        others = [q for q in placements if q is not p]

        def routed(url: str, key: int, others: list[Placement] = others) -> None:
            for q in others:
                q.learn(url, key)

        def prefill(
            url: str, pid: str, n: int, k: int = k, others: list[Placement] = others
        ) -> None:
            for q in others:
                q.learn_prefill(url, f"{k}:{pid}", n)

        def loaded(url: str, n: int, kv: int, k: int = k, others: list[Placement] = others) -> None:
            for q in others:
                q.learn_load(url, str(k), n, kv)

        def light(others: list[Placement] = others) -> None:
            for q in others:
                q.learn_light()

        p.on_routed, p.on_prefill, p.on_load, p.on_light = routed, prefill, loaded, light
        # Heard at once and never lost: no replica's load expires here.
        p.remote_load.ttl_s = math.inf


class Driver:
    """`engines` simulated engines of one config; with more than one (or a
    `routing`), requests go where `placement.Placement` puts them (what a pool
    of SGLang workers does live), and with `locality` routing admission asks the
    placement (unless `locality` is given).

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
    ) -> None:
        self.clock = clock or FakeClock()
        self.timers = ManualTimers(self.clock)
        self.workers = [_Worker(SimCore(sim), f"sim://{i}") for i in range(engines)]
        # One engine without a routing is no pool (as engine=simulator live; one SGLang
        # URL is a pool of one, as with a routing here).
        self.placement: Placement | None = None
        self.placements: list[Placement] = []
        if engines > 1 or routing is not None:
            self.placements = [
                Placement(
                    self.workers,
                    routing=routing or "locality",
                    clock=self.clock.now_s,
                    kv_tokens=[w.core.capacity for w in self.workers],
                    # Each replica its own (the first: the one given, which callers read).
                    stagger=dataclasses.replace(stagger) if stagger and k else stagger,
                )
                for k in range(replicas)
            ]
            self.placement = self.placements[0]
            if share:
                _share(self.placements)
            if locality is None and self.placement.routing == "locality":
                locality = self._cached_prefix
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
        )
        # The priorities fairgate sends the engine (generation.py does the same).
        self._threshold = sim.priority_preemption_threshold if sim.priority_scheduling else None
        self._tiered = isolation is Isolation.PREEMPT
        self.w_in, self.w_out = w_in, w_out
        # A cached prompt token's charge, as the policy makes it (the monitor's too).
        self.w_cached: float = getattr(policy, "w_cached", w_in)
        reg = tenants or TenantRegistry.permissive()
        self._weight = reg.weight_of
        self.monitor = FairnessMonitor(weights=defaultdict(lambda: 1.0))
        self.calls: list[_Call] = []
        self._running: dict[str, _Call] = {}
        self._to_start: list[_Call] = []
        self._events: list[tuple[float, int, str, _Call | Arrival]] = []
        self._seq = itertools.count()
        # tenant -> priority -> queued count (the driver's own view of the backlog).
        self.queued: dict[str, dict[Priority, int]] = defaultdict(lambda: defaultdict(int))
        # tenant -> admissions in a row of interactive while batch waited.
        self.batch_streak: dict[str, int] = defaultdict(int)
        self.max_batch_streak = 0
        self.steps = 0
        self.staged_prefill = staged_prefill or StagedPrefill()
        self._replica: dict[str, int] = {}  # request id -> its replica (more than one)
        self._stages: dict[str, _Call] = {}  # stage rid -> its request
        # Admitted, held unsent by the cold-start hold, oldest first.
        self._held: list[_Call] = []

    def _cached_prefix(self, req: QueuedRequest) -> int:
        """Admission's locality estimate, from the placement of the request's replica."""
        return self._placement_of(req).cached_prefix(req)

    def _placement_of(self, req: QueuedRequest) -> Placement:
        return self.placements[self._replica.get(req.request_id, 0)]

    @property
    def core(self) -> SimCore:
        """The first (with one engine, the only) engine."""
        return self.workers[0].core

    # -- bookkeeping ----------------------------------------------------------
    def backlogged(self) -> set[str]:
        return {t for t, by in self.queued.items() if sum(by.values()) > 0}

    def _dequeued(self, call: _Call) -> None:
        self.queued[call.req.tenant_id][call.req.priority] -= 1
        self.monitor.update(self.backlogged())

    def _on_admitted(self, call: _Call) -> None:
        tid = call.req.tenant_id
        # Service as the fair counter charges it (a cached prefix at w_cached).
        self.monitor.service[tid] += admission_charge(
            self.w_in, call.req.prompt_tokens, 1.0, call.req.cached_estimate, self.w_cached
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

    def _on_rejected(self, call: _Call, error: SchedulingError) -> None:
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
    def _push(self, at_s: float, kind: str, what: _Call | Arrival) -> None:
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
                    assert isinstance(what, _Call)
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
        call = _Call(a, req, len(self.calls), driver=self)
        vocab = self.core.config.vocab_size
        if a.prompt_ids is not None:
            call.prompt_ids = list(a.prompt_ids)
        else:
            call.prompt_ids = distinct_prompt_ids(call.index, a.prompt_tokens, vocab)
        if len(self.placements) > 1:
            self._replica[req.request_id] = call.index % len(self.placements)
        if self.placement is not None:
            req.prefix_keys = self.placement.prefix_keys(call.prompt_ids)
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

    def _cancel(self, call: _Call) -> None:
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
        self._release_held()
        while self._to_start:
            call = self._to_start.pop()
            if call.state != "running":
                continue
            # As generation.py: the engine request, then (a pool) its placement.
            ereq = engine_request(
                call.req,
                call.req.request_id,
                call.prompt_ids,
                SamplingOptions(ignore_eos=False),
                self._threshold,
                self._tiered,
            )
            if self.placement is not None:
                now_s = self.clock.now_s()
                keys = call.req.prefix_keys
                until_s = self._placement_of(call.req).hold_until(ereq, keys, now_s, True)
                if until_s is not None:  # as the pool's `_hold`: unsent for now
                    call.held_since_s, call.held_req = now_s, ereq
                    self._held.append(call)
                    self._push(until_s, "release", call)
                    continue
            self._send(call, ereq)

    def _release_held(self) -> None:
        """Held prompts the placement now lets go, oldest first (asked after every
        event: a prefill that ended, a hold's time up)."""
        assert self.placement is not None or not self._held
        for call in list(self._held):
            assert self.placement is not None and call.held_req is not None
            assert call.held_since_s is not None
            keys, placement = call.req.prefix_keys, self._placement_of(call.req)
            if placement.hold_until(call.held_req, keys, call.held_since_s, False) is None:
                self._held.remove(call)
                self._send(call, call.held_req)

    def _send(self, call: _Call, ereq: EngineRequest) -> None:
        priority = ereq.priority
        call.sent_s = self.clock.now_s()
        if self.placement is not None:
            keys = list(call.req.prefix_keys)
            call.placed = self._placement_of(call.req).place(ereq, keys, set())
            assert call.placed is not None
            call.worker, priority = call.placed.worker, call.placed.priority
        w = self.workers[call.worker]
        call.engine_priority = priority
        self._running[call.req.request_id] = call
        held = call.placed.matched if call.placed is not None else 0
        ends = self.staged_prefill.ends(call.req.prompt_tokens, call.req.max_tokens, held)
        if self.staged_prefill.in_lane(call.req.prompt_tokens, call.req.max_tokens):
            call.staging = Staging(ends)
            if w.lane is None or not self.staged_prefill.one_at_a_time:
                w.lane = call
                self._send_stage(call)
            else:
                w.lane_queue.append(call)
        else:
            self._send_whole(call)

    def _send_whole(self, call: _Call) -> None:
        core = self.workers[call.worker].core
        sampling = SamplingOptions(ignore_eos=False)
        sim_req = core.make_request(
            call.req.request_id,
            call.prompt_ids,
            call.req.max_tokens,
            sampling,
            call.engine_priority,
        )
        core.add(sim_req)
        call.sim_req = sim_req

    def _send_stage(self, call: _Call) -> None:
        """The next prefill-only stage, or the request whole (staged_prefill.py)."""
        assert call.staging is not None
        end = call.staging.next_end()
        if end is None:
            call.stage_req = None
            self._send_whole(call)
            return
        core = self.workers[call.worker].core
        rid = f"{call.req.request_id}/stage-{end}"
        call.stage_req = core.make_request(
            rid, call.prompt_ids[:end], 0, SamplingOptions(), call.engine_priority
        )
        core.add(call.stage_req)
        self._stages[rid] = call

    def _lane_free(self, call: _Call) -> None:
        """`call` no longer holds its worker's lane (its first token, or it ended)."""
        w = self.workers[call.worker]
        if call in w.lane_queue:
            w.lane_queue.remove(call)
        if w.lane is not call:
            return
        w.lane = w.lane_queue.popleft() if w.lane_queue else None
        if w.lane is not None:
            self._send_stage(w.lane)

    def _stage_ended(self, call: _Call, em: Emission) -> None:
        assert call.staging is not None and call.stage_req is not None
        del self._stages[em.rid]
        call.staging.stage_done(call.stage_req.cached_tokens)
        self._send_stage(call)

    def _first_token(self, call: _Call) -> None:
        """Its prefill is done: the engine says what it had cached."""
        assert call.sim_req is not None
        cached = call.cached_tokens = call.sim_req.cached_tokens
        if call.staging is not None:
            self._lane_free(call)
        # Its own stages' prefill is charged as prompt tokens (generation.py does the same).
        charged_cached = cached - (call.staging.staged_tokens(cached) if call.staging else 0)
        call.charged_cached = charged_cached
        if self.placement is not None and call.placed is not None:
            self._placement_of(call.req).first_token(call.placed, call.req.prompt_tokens, cached)
        est = call.req.cached_estimate
        short = cached_shortfall(self.w_in, self.w_cached, est, charged_cached, 1.0)
        self.monitor.service[call.req.tenant_id] += short
        self.dispatcher.on_cached_tokens(call.req, charged_cached)

    def _end(self, call: _Call) -> None:
        """The request leaves the engine (or the hold): done, cancelled or failed."""
        if call in self._held:
            self._held.remove(call)
        w = self.workers[call.worker]
        w.core.abort(call.req.request_id)
        if call.stage_req is not None:  # ended during a stage: that is aborted too
            w.core.abort(call.stage_req.rid)
            self._stages.pop(call.stage_req.rid, None)
            call.stage_req = None
        if call.staging is not None:
            self._lane_free(call)
        if self.placement is not None and call.placed is not None:
            self._placement_of(call.req).released(call.placed)
            self._replica.pop(call.req.request_id, None)
        self._running.pop(call.req.request_id, None)
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
                if w.step is None and not w.core.idle:
                    w.step = w.core.step()
                    w.end_s = self.clock.now_s() + w.step.duration_s
                    self.steps += 1
                    assert self.steps < max_steps, "simulation does not terminate"
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
            for em in result.emissions:
                staged = self._stages.get(em.rid)
                if staged is not None:
                    self._stage_ended(staged, em)
                    continue
                call = self._running.get(em.rid)
                if call is None:
                    continue  # cancelled during the step
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
                if em.finish is not None and call.placed is not None:
                    placement = self._placement_of(call.req)
                    placement.finished(call.placed, call.prompt_ids, call.output_ids)
                if em.finish is not None or (fail is not None and call.output_tokens >= fail):
                    self._end(call)
        if until_s == math.inf:
            assert not self.backlogged(), "requests left queued with nothing to wake them"
