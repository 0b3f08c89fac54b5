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
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.clock import FakeClock
from scheduler.errors import QueueTimeout, QuotaExceeded, SchedulingError
from scheduler.shared.admission import (
    SharedDispatcher,
    SharedOptions,
    shared_dispatcher,
)
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import Store
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import ManualTimers
from tests.unit.scheduler import test_dispatch_differential as dispatch_differential
from tests.unit.scheduler.test_dispatch_differential import (
    TENANTS,
    Trace,
    apply_event,
    cached_of,
)

MAX_WAIT_S = 5.0


def traces() -> st.SearchStrategy[Trace]:
    """The dispatcher differential's traces, with reject-mode tenants, queue
    expiries and "expire" events (the clock moves past max_queue_wait_s)."""
    return dispatch_differential.traces(
        ("wait", "wait", "reject"), (None, MAX_WAIT_S), ("expire",), 30
    )


class Side(dispatch_differential.Side):
    """One shared dispatcher, its timers, and what became of the requests sent to it."""

    gate: SharedDispatcher

    def __init__(self, store: Store, trace: Trace, clock: FakeClock) -> None:
        self.timers = ManualTimers(clock)
        gate = shared_dispatcher(
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
        super().__init__(gate)

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
        return self.gate.state.idle_pump and len(waiting) == self.gate.queued


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


async def run_trace(trace: Trace, redis_url: str) -> Counter[str]:
    """Run `trace` on both sides; what happened to its requests (on either)."""
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
            if kind == "expire":
                clock.advance(MAX_WAIT_S + 0.5)
                for side in sides:
                    side.timers.run_due()
            await apply_event(sides, n, kind, x, y, lambda: settle(sides))
            mem_side, red_side = sides
            assert red_side.admitted == mem_side.admitted, f"after event {n} {kind}"
            for error in (QuotaExceeded, QueueTimeout):
                assert red_side.failed(error) == mem_side.failed(error), (n, kind, error)
            a, b = await mem.snapshot(), await red.snapshot()
            for t in TENANTS:
                ca, cb = a.counters.get(t, 0.0), b.counters.get(t, 0.0)
                assert math.isclose(ca, cb, rel_tol=1e-9, abs_tol=1e-6), (n, t, ca, cb)
            assert (a.in_flight, a.in_flight_kv_tokens) == (b.in_flight, b.in_flight_kv_tokens)
        mem_side = sides[0]
        return Counter(
            admitted=len(mem_side.admitted),
            refused=len(mem_side.failed(QuotaExceeded)),
            expired=len(mem_side.failed(QueueTimeout)),
        )
    finally:
        for side in sides:
            for task in side.tasks.values():
                task.cancel()
            await asyncio.gather(*side.tasks.values(), return_exceptions=True)
            await side.gate.aclose()


@pytest.mark.timeout(600)
def test_shared_dispatcher_decides_alike_in_memory_and_over_redis(redis_url: str) -> None:
    @settings(
        max_examples=100,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(traces())
    def check(trace: Trace) -> None:
        seen.update(asyncio.run(run_trace(trace, redis_url)))

    seen: Counter[str] = Counter()
    check()
    # Not a vacuous comparison: the traces admitted, refused and expired requests.
    assert seen["admitted"] and seen["refused"] and seen["expired"], seen
