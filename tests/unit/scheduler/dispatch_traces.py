"""Traces for the dispatcher differential (test_dispatch_differential.py): random
heterogeneous events, the one `Dispatcher` built over either admission state,
and how each event is applied alike to both (the clock moving on included)."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

from hypothesis import strategies as st

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.errors import SchedulingError
from scheduler.local_admission import LocalAdmission, LocalDispatcher, local_dispatcher
from scheduler.ordering.vtc import VtcPolicy
from scheduler.request import Priority, QueuedRequest
from scheduler.rules import LIGHT_QUEUE
from scheduler.shared.admission import (
    SharedDispatcher,
    SharedOptions,
    shared_dispatcher,
)
from scheduler.state.memory_store import MemoryStore
from scheduler.tenancy.tenants import OverQuotaMode, TenantConfig, TenantQuotas, TenantRegistry
from scheduler.timers import ManualTimers

Gate = LocalDispatcher | SharedDispatcher
TENANTS = ["a", "b", "c", "d"]
# Shapes (prompt, max_tokens): chat, long prompt / short output, short prompt / long output.
SHAPES = [(60, 40), (900, 20), (30, 600), (200, 200)]


@dataclass
class Trace:
    limits: AdmissionLimits
    reserve_fraction: float
    light_credit: float
    tenants: list[TenantConfig]
    # Locality (an engine pool's prefix index, here a fixed function of the
    # request) within the allowance, and the cached tokens' cost.
    local: bool = False
    allowance: float = 4096.0
    w_cached: float = 1.0
    # How long a tenant stays active for the reserve after its last request left.
    reserve_window_s: float = 10.0
    events: list[tuple[str, int, int]] = field(default_factory=list)


@st.composite
def traces(
    draw: st.DrawFn,
    modes: Sequence[OverQuotaMode] = ("wait",),
    max_waits_s: Sequence[float | None] = (None,),
    extra_kinds: Sequence[str] = (),
    max_events: int = 40,
    tokens_per_min: Sequence[float] = (1.0,),
) -> Trace:
    """`modes`, `max_waits_s`, `tokens_per_min`: the tenants' over-quota modes,
    max_queue_wait_s and token bucket rates to draw from; `extra_kinds`: more
    kinds of events (`apply_event` or the caller applies them)."""
    limits = AdmissionLimits(draw(st.integers(2, 6)), draw(st.sampled_from([800, 1500, 3000])))
    tenants = []
    for t in TENANTS:
        # Buckets refilling too slowly to matter while time stands still: a tenant
        # that runs dry stays held by its own limits (wait) or is refused at
        # arrival (reject) until the clock moves on.
        bucket = draw(st.booleans()) and draw(st.booleans())
        quotas = TenantQuotas(
            max_concurrent=draw(st.sampled_from([None, None, 1, 2])),
            tokens_per_min=draw(st.sampled_from(tokens_per_min)) if bucket else None,
            tokens_burst=draw(st.sampled_from([2000.0, 4000.0])) if bucket else None,
            max_queue_wait_s=draw(st.sampled_from(max_waits_s)),
        )
        weight = draw(st.sampled_from([1.0, 1.0, 2.0, 4.0]))
        mode = draw(st.sampled_from(modes))
        tenants.append(TenantConfig(t, weight=weight, quotas=quotas, over_quota=mode))
    trace = Trace(
        limits,
        draw(st.sampled_from([0.0, 0.25, 0.5])),
        draw(st.sampled_from([0.0, 300.0])),
        tenants,
        draw(st.booleans()),
        draw(st.sampled_from([0.0, 300.0, 4096.0])),
        draw(st.sampled_from([1.0, 0.1])),
    )
    kinds = ["arrive", "arrive", "arrive", "burst", "charge", "finish", "finish", "cancel"]
    kinds += ["cached", *extra_kinds]
    for _ in range(draw(st.integers(5, max_events))):
        kind = draw(st.sampled_from(kinds))
        trace.events.append((kind, draw(st.integers(0, 1000)), draw(st.integers(0, 1000))))
    return trace


class Side:
    """One dispatcher and the requests sent to it, in the order it admitted them."""

    def __init__(self, gate: Gate) -> None:
        self.gate = gate
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.reqs: dict[str, QueuedRequest] = {}
        # In the order decided: each dispatcher books an admitted request into its
        # budget as it starts it (the callers' tasks may resume in another order).
        self.admitted: list[str] = []
        self.ended: set[str] = set()
        book = gate.budget.reserve

        def reserve(req: QueuedRequest) -> None:
            self.admitted.append(req.request_id)
            book(req)

        gate.budget.reserve = reserve  # type: ignore[method-assign]

    def send(self, rid: str, tenant: str, prompt: int, max_tokens: int, batch: bool) -> None:
        priority = Priority.BATCH if batch else Priority.INTERACTIVE
        req = QueuedRequest(rid, tenant, prompt, max_tokens, priority)
        self.reqs[rid] = req

        self.tasks[rid] = asyncio.create_task(self.gate.admit(req))

    def running(self) -> list[str]:
        return [rid for rid in self.admitted if rid not in self.ended]

    def queued(self) -> list[str]:
        return [rid for rid, t in self.tasks.items() if not t.done()]

    def failed(self, kind: type[SchedulingError]) -> set[str]:
        return {
            rid
            for rid, t in self.tasks.items()
            if t.done() and not t.cancelled() and isinstance(t.exception(), kind)
        }


async def quiesce() -> None:
    # No I/O on either side (a memory store; timers fired by hand): the loop runs
    # every ready callback in order, so a bounded number of turns drains it.
    for _ in range(30):
        await asyncio.sleep(0)


def counters(side: Side) -> dict[str, float]:
    state = side.gate.state
    if isinstance(state, LocalAdmission):
        policy = state.policy
        assert isinstance(policy, VtcPolicy)
        return {t: policy.counter(t) for t in TENANTS}
    store = state.store
    assert isinstance(store, MemoryStore)
    return {t: store.counters.get(t, 0.0) for t in TENANTS}


def cached_of(req: QueuedRequest) -> int:
    """What a worker with room holds of the request's prompt, and the most any
    worker holds (charged cached when more: `QueuedRequest.charged_cached`), as
    an engine pool's `Placement.cached_prefix` sets it (fixed guesses)."""
    n = int(req.request_id.split(".")[0])
    req.held_anywhere = n * 53 % (req.prompt_tokens + 1)
    return n * 37 % (req.prompt_tokens + 1)


async def apply_event(
    sides: Sequence[Side], n: int, kind: str, x: int, y: int, settle: Callable[[], Awaitable[None]]
) -> None:
    """Event `n` of a trace, the same on every side (`x`, `y`: its random draws):
    an arrival or a burst (each request settled before the next: requests sent
    in one tick reach a `Dispatcher` one by one but the shared path in one step,
    a different interleaving, both fair, not a different rule), an output
    charge, a cached-token report, a finish or a cancel while queued."""
    base = sides[0]
    tenant = TENANTS[x % len(TENANTS)]
    if kind in ("arrive", "burst"):
        for k in range(1 if kind == "arrive" else LIGHT_QUEUE + 2):
            prompt, max_tokens = SHAPES[(y + k) % len(SHAPES)]
            for side in sides:
                side.send(f"{n}.{k}", tenant, prompt, max_tokens, batch=y % 3 == 0)
            await settle()
    elif kind == "charge" and base.running():
        rid = base.running()[x % len(base.running())]
        for side in sides:
            side.gate.on_output_tokens(side.reqs[rid], 1 + y % 50)
    elif kind == "cached" and base.running():
        rid = base.running()[x % len(base.running())]
        for side in sides:
            req = side.reqs[rid]
            side.gate.on_cached_tokens(req, y % (req.prompt_tokens + 1))
    elif kind == "finish" and base.running():
        rid = base.running()[x % len(base.running())]
        for side in sides:
            side.ended.add(rid)
            side.gate.finish(side.reqs[rid])
    elif kind == "cancel" and base.queued():
        rid = base.queued()[x % len(base.queued())]
        for side in sides:
            side.tasks[rid].cancel()
    await settle()


STATES = ["memory", "shared"]
# The shared state's poll while the engine is full or a tenant is held (a
# coarser one than production's keeps a trace's timer steps few).
POLL_S = 0.25


async def advance(
    clock: FakeClock,
    timers: Sequence[ManualTimers],
    by_s: float,
    settle: Callable[[], Awaitable[None]],
) -> None:
    """Move the clock on by `by_s`, stopping at every timer due on the way (in
    time order, over every side's timers: a wake-up, an expiry, a pump's poll or
    heartbeat) to fire it and let everything settle, as a real clock would."""
    end_s = clock.now_s() + by_s
    while True:
        due = [s for t in timers if (s := t.next_s()) is not None and s <= end_s]
        if not due:
            break
        clock.set(max(clock.now_s(), min(due)))
        for t in timers:
            t.run_due()
        await settle()
    clock.set(end_s)
    for t in timers:
        t.run_due()
    await settle()


def build(state: str, trace: Trace, clock: FakeClock, timers: ManualTimers) -> Gate:
    """The one `Dispatcher` over the named admission state: in memory (the
    policy's heaps, a synchronous round) or shared (a pump over a MemoryStore)."""
    registry = TenantRegistry(trace.tenants)
    locality = cached_of if trace.local else None
    if state == "memory":
        policy = VtcPolicy(
            registry.weight_of,
            w_in=1.0,
            w_out=2.0,
            w_cached=trace.w_cached,
            light_credit=trace.light_credit,
        )
        return local_dispatcher(
            policy,
            AdmissionBudget(trace.limits),
            clock,
            tenants=registry,
            timers=timers,
            reserve_fraction=trace.reserve_fraction,
            reserve_window_s=trace.reserve_window_s,
            locality=locality,
            allowance=trace.allowance,
        )
    options = SharedOptions(
        replica_id="r1",
        reserve_fraction=trace.reserve_fraction,
        reserve_window_s=trace.reserve_window_s,
        light_credit=trace.light_credit,
        w_in=1.0,
        w_out=2.0,
        w_cached=trace.w_cached,
        locality=locality,
        allowance=trace.allowance,
        flush_s=0.0,
        poll_s=POLL_S,
    )
    store = MemoryStore(clock)
    return shared_dispatcher(store, trace.limits, clock, options, tenants=registry, timers=timers)
