"""The discrete-event driver's engines: simulated engines behind the server's
placement (one per replica), and what reaches them — the cold-start hold,
staged prefill's lanes, whole requests — as the worker pool does it live."""

from __future__ import annotations

import dataclasses
import functools
import math
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from fairgate.bench.driver_call import Call
from fairgate.bench.kv_feed import KvFeed
from scheduler.clock import FakeClock
from scheduler.request import QueuedRequest
from service.engines.engine_request import engine_request
from service.engines.placement import Placement
from service.engines.protocol import EngineRequest, SamplingOptions
from service.engines.routing import Routing
from service.engines.simulator.core import Emission, SimConfig, SimCore, SimRequest, StepResult
from service.engines.staged_prefill import StagedPrefill, Staging, next_turn, steps_aside
from service.engines.stagger import Stagger


@dataclass(slots=True, eq=False)
class SimWorker:
    """One simulated engine of the fleet, as the placement sees it (`placed.Target`)."""

    core: SimCore
    url: str
    healthy: bool = True
    # The step under way and when it ends (None: not stepping).
    step: StepResult | None = None
    end_s: float = 0.0
    # Staged prefill's lane: the staged request whose stages go in now, and those
    # waiting for it (staged_prefill.StageLane).
    lane: Call | None = None
    lane_queue: deque[Call] = field(default_factory=deque)
    # Its KV events into the placement's exact view (lever 3); None: the index only.
    kv: KvFeed | None = None
    # Sent in answer to one of its emissions (a stage's successor, the lane's next
    # request): they reach it a gateway round trip after its step ended, when it
    # has formed its next step already (`deliver_late`).
    late: list[SimRequest] = field(default_factory=list)

    def deliver_late(self) -> None:
        """The late requests reach the engine: called once its next step is formed
        (or at once where it is idle and waits for work), as a sim-server's or
        SGLang's loop forms the next batch before a round trip can answer."""
        for r in self.late:
            self.core.add(r)
        self.late.clear()

    def slots(self) -> int:
        return self.core.config.max_running_requests

    def kv_capacity(self) -> int:
        return self.core.capacity

    def penalty(self, now_s: float) -> int:
        return 0


def share(placements: list[Placement]) -> None:
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

        def loaded(
            url: str, n: int, kv: int, quiet: int, k: int = k, others: list[Placement] = others
        ) -> None:
            for q in others:
                q.learn_load(url, str(k), n, kv, quiet)

        def light(others: list[Placement] = others) -> None:
            for q in others:
                q.learn_light()

        p.on_routed, p.on_prefill, p.on_load, p.on_light = routed, prefill, loaded, light
        # Heard at once and never lost: no replica's load expires here.
        p.remote_load.ttl_s = math.inf


class SimFleet:
    """`engines` simulated engines of one config; with more than one (or a
    `routing`), requests go where `placement.Placement` puts them (what a pool
    of SGLang workers does live). `replicas`: that many placements over the same
    engines, each request placed by the one of its replica (arrival i: replica
    i mod N); `share`: they hear each other at once (see `share`).

    `threshold` / `tiered` / `takes_slot`: the engine priorities fairgate sends
    (`engine_request.py`, as generation.py). `round_trip` False: a what-if, what
    is sent in answer to an emission reaches the engine at once (`SimWorker.late`)."""

    def __init__(
        self,
        sim: SimConfig,
        clock: FakeClock,
        *,
        engines: int,
        routing: Routing | None,
        stagger: Stagger | None,
        staged_prefill: StagedPrefill | None,
        replicas: int,
        share_routes: bool,
        kv_events: bool,
        threshold: int | None,
        tiered: bool,
        takes_slot: bool = False,
        round_trip: bool = True,
    ) -> None:
        self.clock = clock
        self.round_trip = round_trip
        self.workers = [SimWorker(SimCore(sim), f"sim://{i}") for i in range(engines)]
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
            if share_routes:
                share(self.placements)
            if kv_events:  # every replica follows every worker's events (as live)
                for i, w in enumerate(self.workers):
                    w.kv = KvFeed(w.core, w.url)
                    for p in self.placements:
                        p.exact[i] = w.kv.view
        self._threshold, self._tiered, self._takes_slot = threshold, tiered, takes_slot
        self.staged_prefill = staged_prefill or StagedPrefill()
        self._replica: dict[str, int] = {}  # request id -> its replica (more than one)
        self.running: dict[str, Call] = {}  # request id -> sent to its engine
        self._stages: dict[str, Call] = {}  # stage rid -> its request
        # Admitted, held unsent by the cold-start hold, oldest first.
        self._held: list[Call] = []
        # Times a staged request stepped aside for a short one (`StagingStats.yielded`).
        self.yielded = 0

    def unsent(self) -> int:
        """Admitted requests no engine has: held (as the pool's `_hold`) or waiting
        for a worker's lane (as `WorkerPool.unsent`)."""
        laned = sum(not c.lane_turned for w in self.workers for c in w.lane_queue)
        return len(self._held) + laned

    def cached_prefix(self, req: QueuedRequest) -> int:
        """Admission's locality estimate, from the placement of the request's replica."""
        return self._placement_of(req).cached_prefix(req)

    def _placement_of(self, req: QueuedRequest) -> Placement:
        return self.placements[self._replica.get(req.request_id, 0)]

    def arrived(self, call: Call) -> None:
        """Its replica, and the prefix keys placement and admission go by."""
        if len(self.placements) > 1:
            self._replica[call.req.request_id] = call.index % len(self.placements)
        if self.placement is not None:
            call.req.prefix_keys = self.placement.prefix_keys(call.prompt_ids)

    def start(self, call: Call) -> float | None:
        """Send an admitted request, or hold it: then when to ask again."""
        # As generation.py: the engine request, then (a pool) its placement.
        ereq = engine_request(
            call.req,
            call.req.request_id,
            call.prompt_ids,
            SamplingOptions(ignore_eos=False),
            self._threshold,
            self._tiered,
            takes_slot=self._takes_slot,
        )
        if self.placement is not None:
            now_s = self.clock.now_s()
            keys = call.req.prefix_keys
            until_s = self._placement_of(call.req).hold_until(ereq, keys, now_s, True)
            if until_s is not None:  # as the pool's `_hold`: unsent for now
                call.held_since_s, call.held_req = now_s, ereq
                self._held.append(call)
                return until_s
        self._send(call, ereq)
        return None

    def release_held(self) -> None:
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

    def _send(self, call: Call, ereq: EngineRequest) -> None:
        priority = ereq.priority
        call.sent_s = self.clock.now_s()
        if self.placement is not None:
            keys = list(call.req.prefix_keys)
            call.placed = self._placement_of(call.req).place(ereq, keys, set())
            assert call.placed is not None
            call.worker, priority = call.placed.worker, call.placed.priority
        w = self.workers[call.worker]
        call.engine_priority = priority
        self.running[call.req.request_id] = call
        if self.staged_prefill.in_lane(call.req.prompt_tokens, call.req.max_tokens):
            call.staging = Staging([])  # its stages are planned when its turn comes
            if w.lane is None or not self.staged_prefill.one_at_a_time:
                w.lane = call
                self._lane_turn(call)
            else:
                w.lane_queue.append(call)
        else:
            self._send_whole(call)

    def _lane_turn(self, call: Call, late: bool = False) -> None:
        """`call`'s turn in its worker's lane: its stages from what the worker holds
        of it now (`Placement.recheck`: evicted while it waited?), as `staged` does."""
        held, call.lane_turned = 0, True
        if call.placed is not None:
            held = self._placement_of(call.req).recheck(call.placed)
        plan = self.staged_prefill
        ends = plan.ends(call.req.prompt_tokens, call.req.max_tokens, held)
        call.staging = Staging(ends, 1, call.req.prompt_tokens, plan.stage_tokens)
        self._send_stage(call, late)

    def _sheltered(self, call: Call) -> Callable[[], bool] | None:
        """As the pool's `EngineRequest.sheltered`: asked of its placement."""
        if call.placed is None:
            return None
        return functools.partial(self._placement_of(call.req).sheltered, call.placed)

    def _send_whole(self, call: Call, late: bool = False) -> None:
        w = self.workers[call.worker]
        core = w.core
        sampling = SamplingOptions(ignore_eos=False)
        sim_req = core.make_request(
            call.req.request_id,
            call.prompt_ids,
            call.req.max_tokens,
            sampling,
            call.engine_priority,
        )
        self._submit(w, sim_req, late)
        call.sim_req = sim_req

    def _send_stage(self, call: Call, late: bool = False) -> None:
        """The next prefill-only stage, or the request whole (staged_prefill.py);
        `late`: sent in answer to an emission (see `SimWorker.late`)."""
        assert call.staging is not None
        end = call.staging.next_end(self.staged_prefill.wide(self._sheltered(call)))
        if end is None:
            call.stage_req = None
            self._send_whole(call, late)
            return
        w = self.workers[call.worker]
        rid = f"{call.req.request_id}/stage-{end}"
        call.stage_req = w.core.make_request(
            rid, call.prompt_ids[:end], 0, SamplingOptions(), call.engine_priority
        )
        self._submit(w, call.stage_req, late)
        self._stages[rid] = call

    def _submit(self, w: SimWorker, req: SimRequest, late: bool) -> None:
        """`req` to `w`'s engine; `late` (sent in answer to an emission): after its
        next step forms (`SimWorker.late`), unless the what-if has no round trip."""
        (w.late.append if late and self.round_trip else w.core.add)(req)

    def _overtakes(self, call: Call) -> bool:
        """As the pool's `EngineRequest.overtakes` (`StagedPrefill.short_first`)."""
        if not self.staged_prefill.short_first or call.placed is None:
            return False
        return self._placement_of(call.req).overtakes(call.placed)

    def _lane_free(self, call: Call) -> None:
        """`call` no longer holds its worker's lane (its first token, or it ended)."""
        w = self.workers[call.worker]
        if call in w.lane_queue:
            w.lane_queue.remove(call)
        if w.lane is call:
            self._lane_next(w)

    def _lane_next(self, w: SimWorker) -> None:
        """The lane's next turn, as `StageLane.release`: the first waiter that
        overtakes, else the first; its stages planned, or resumed."""
        nxt = next_turn(w.lane_queue, self._overtakes)
        w.lane = nxt
        if nxt is None:
            return
        w.lane_queue.remove(nxt)
        if nxt.lane_turned:
            self._send_stage(nxt, late=True)
        else:
            self._lane_turn(nxt, late=True)

    def emitted(self, em: Emission) -> Call | None:
        """The request an emission's token is for; None: a stage that ended (the
        next stage goes in) or a request no longer running."""
        call = self._stages.get(em.rid)
        if call is None:
            return self.running.get(em.rid)
        assert call.staging is not None and call.stage_req is not None
        del self._stages[em.rid]
        call.staging.stage_done(call.stage_req.cached_tokens)
        w = self.workers[call.worker]
        if steps_aside(self._overtakes(call), map(self._overtakes, w.lane_queue)):
            # As `StageLane.overtaken`: it steps aside for a short prompt, first in line.
            self.yielded += 1
            call.stage_req = None
            w.lane_queue.appendleft(call)
            self._lane_next(w)
        else:
            self._send_stage(call, late=True)
        return None

    def first_token(self, call: Call) -> int:
        """Its prefill is done: the engine says what it had cached. Returns the
        cached tokens charged at the cached rate."""
        assert call.sim_req is not None
        cached = call.cached_tokens = call.sim_req.cached_tokens
        if call.staging is not None:
            self._lane_free(call)
        # Its own stages' prefill is charged as prompt tokens (generation.py does the same).
        charged_cached = cached - (call.staging.staged_tokens(cached) if call.staging else 0)
        call.charged_cached = charged_cached
        if self.placement is not None and call.placed is not None:
            self._placement_of(call.req).first_token(call.placed, call.req.prompt_tokens, cached)
        return charged_cached

    def finished(self, call: Call) -> None:
        """The engine finished it: the placement learns its prompt and output."""
        if call.placed is not None:
            self._placement_of(call.req).finished(call.placed, call.prompt_ids, call.output_ids)

    def end(self, call: Call) -> None:
        """The request leaves its engine (or the hold): done, cancelled or failed."""
        if call in self._held:
            self._held.remove(call)
        w = self.workers[call.worker]
        w.core.abort(call.req.request_id)
        w.late = [r for r in w.late if r is not call.sim_req and r is not call.stage_req]
        if call.stage_req is not None:  # ended during a stage: that is aborted too
            w.core.abort(call.stage_req.rid)
            self._stages.pop(call.stage_req.rid, None)
            call.stage_req = None
        if w.kv is not None and w.step is None:  # what the abort cached, published
            w.kv.deliver()
        if call.staging is not None:
            self._lane_free(call)
        if self.placement is not None and call.placed is not None:
            self._placement_of(call.req).released(call.placed)
            self._replica.pop(call.req.request_id, None)
        self.running.pop(call.req.request_id, None)
