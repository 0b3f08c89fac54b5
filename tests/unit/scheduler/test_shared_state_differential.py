"""Differential test: the shared dispatcher decides alike over the in-memory state
and over Redis (the Lua STEP script, its twin), against a real Redis.

The same `SharedDispatcher` class runs twice, once over a `MemoryStore` and
once over a `RedisStore` (a fresh key domain per trace), and the same random
heterogeneous trace goes to both: tenants of different weights, caps and
over-quota modes (wait-mode buckets running dry, reject-mode buckets refusing
at arrival), prompts and outputs of mixed shapes, interactive and batch
requests, bursts, output charges, cached-token reports below the locality
estimate, finishes, cancels while queued, queue expiries (max_queue_wait_s),
with and without the fair-share reserve, the light credit and locality. After
every event both must have admitted the same requests in the same order,
refused and expired the same ones, and hold the same counters.

Time stands still on the replica's side (a fake clock, timers fired by hand;
an expiry moves it on for both); buckets refill too slowly for Redis's own
clock to change a verdict within a trace. Each event is followed by letting
both sides settle: their pumps wait with nothing owed or due (`idle`).
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.budget import AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.errors import QueueTimeout, QuotaExceeded, SchedulingError
from scheduler.request import Priority, QueuedRequest
from scheduler.rules import LIGHT_QUEUE
from scheduler.shared.dispatcher import SharedDispatcher, SharedOptions
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import Store
from scheduler.tenancy.tenants import OverQuotaMode, TenantConfig, TenantQuotas, TenantRegistry
from scheduler.timers import ManualTimers
from tests.unit.scheduler.test_dispatch_differential import SHAPES, TENANTS, cached_of

MAX_WAIT_S = 5.0


@dataclass
class Trace:
    limits: AdmissionLimits
    reserve_fraction: float
    light_credit: float
    tenants: list[TenantConfig]
    local: bool
    allowance: float
    w_cached: float
    events: list[tuple[str, int, int]] = field(default_factory=list)


@st.composite
def traces(draw: st.DrawFn) -> Trace:
    limits = AdmissionLimits(draw(st.integers(2, 6)), draw(st.sampled_from([800, 1500, 3000])))
    tenants = []
    for t in TENANTS:
        mode: OverQuotaMode = draw(st.sampled_from(["wait", "wait", "reject"]))
        # Buckets that refill too slowly to matter within a trace: one that runs
        # dry holds its tenant (wait) or refuses its arrivals (reject).
        bucket = draw(st.booleans())
        quotas = TenantQuotas(
            max_concurrent=draw(st.sampled_from([None, None, 1, 2])),
            tokens_per_min=1.0 if bucket else None,
            tokens_burst=draw(st.sampled_from([2000.0, 4000.0])) if bucket else None,
            max_queue_wait_s=draw(st.sampled_from([None, MAX_WAIT_S])),
        )
        weight = draw(st.sampled_from([1.0, 1.0, 2.0, 4.0]))
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
    kinds += ["cached", "expire"]
    for _ in range(draw(st.integers(5, 30))):
        kind = draw(st.sampled_from(kinds))
        trace.events.append((kind, draw(st.integers(0, 1000)), draw(st.integers(0, 1000))))
    return trace


class Side:
    """One shared dispatcher, its timers, and what became of the requests sent to it."""

    def __init__(self, store: Store, trace: Trace, clock: FakeClock) -> None:
        self.timers = ManualTimers(clock)
        self.gate = SharedDispatcher(
            store,
            trace.limits,
            clock,
            SharedOptions(
                replica_id="r1",
                reserve_fraction=trace.reserve_fraction,
                # Longer than any trace: the store's clock (Redis TIME) is not the
                # replica's, and must not end a tenant's activity on one side only.
                reserve_window_s=600.0,
                light_credit=trace.light_credit,
                w_cached=trace.w_cached,
                locality=cached_of if trace.local else None,
                allowance=trace.allowance,
                flush_s=0.0,
            ),
            tenants=TenantRegistry(trace.tenants),
            timers=self.timers,
        )
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.reqs: dict[str, QueuedRequest] = {}
        self.admitted: list[str] = []  # in the order decided (booked into the budget)
        self.ended: set[str] = set()
        book = self.gate.budget.reserve

        def reserve(req: QueuedRequest) -> None:
            self.admitted.append(req.request_id)
            book(req)

        self.gate.budget.reserve = reserve  # type: ignore[method-assign]

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

    def calm(self) -> bool:
        """Its pump waits with nothing owed or due, and every request still
        waiting is in its queues (not reserving its buckets at arrival)."""
        waiting = [rid for rid in self.queued() if rid not in self.admitted]
        return self.gate.idle and len(waiting) == self.gate.queued


async def settle(sides: list[Side]) -> None:
    """Until both sides are calm a few turns in a row (the callers' tasks run in
    between)."""
    calm = 0
    for _ in range(20_000):
        await asyncio.sleep(0 if calm else 0.0005)
        calm = calm + 1 if all(s.calm() for s in sides) else 0
        if calm > 3:
            return
    raise AssertionError("the dispatchers did not settle")


async def run_trace(trace: Trace, redis_url: str) -> None:
    clock = FakeClock(100.0)
    mem = MemoryStore(clock, lease_ttl_s=600, backlog_ttl_s=600)
    red = RedisStore.from_url(
        redis_url, domain=f"sdiff-{uuid.uuid4().hex}", lease_ttl_s=600, backlog_ttl_s=600
    )
    sides = [Side(mem, trace, clock), Side(red, trace, clock)]
    for side in sides:
        await side.gate.start()
    try:
        for n, (kind, x, y) in enumerate(trace.events):
            base = sides[0]
            tenant = TENANTS[x % len(TENANTS)]
            if kind in ("arrive", "burst"):
                for k in range(1 if kind == "arrive" else LIGHT_QUEUE + 2):
                    prompt, max_tokens = SHAPES[(y + k) % len(SHAPES)]
                    for side in sides:
                        side.send(f"{n}.{k}", tenant, prompt, max_tokens, batch=y % 3 == 0)
                    await settle(sides)
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
            elif kind == "expire":
                clock.advance(MAX_WAIT_S + 0.5)
                for side in sides:
                    side.timers.run_due()
            await settle(sides)
            mem_side, red_side = sides
            assert red_side.admitted == mem_side.admitted, f"after event {n} {kind}"
            for error in (QuotaExceeded, QueueTimeout):
                assert red_side.failed(error) == mem_side.failed(error), (n, kind, error)
            a, b = await mem.snapshot(), await red.snapshot()
            for t in TENANTS:
                ca, cb = a.counters.get(t, 0.0), b.counters.get(t, 0.0)
                assert math.isclose(ca, cb, rel_tol=1e-9, abs_tol=1e-6), (n, t, ca, cb)
            assert (a.in_flight, a.in_flight_kv_tokens) == (b.in_flight, b.in_flight_kv_tokens)
    finally:
        for side in sides:
            for task in side.tasks.values():
                task.cancel()
            await asyncio.gather(*side.tasks.values(), return_exceptions=True)
            await side.gate.aclose()


@pytest.fixture
def redis_url_once(redis_url: str) -> Iterator[str]:
    yield redis_url


@pytest.mark.timeout(600)
def test_shared_dispatcher_decides_alike_in_memory_and_over_redis(redis_url_once: str) -> None:
    @settings(
        max_examples=100,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(traces())
    def check(trace: Trace) -> None:
        asyncio.run(run_trace(trace, redis_url_once))

    check()
