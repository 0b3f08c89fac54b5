"""Differential test: the one `Dispatcher` decides alike over both admission
states — in memory (`LocalAdmission`) and shared (`SharedAdmission` over a
`MemoryStore`, one replica).

The front door and every request's bookkeeping are the same class on both
sides; the decision is the one composition (`scheduler/decision.py`) over
state of each side's own: the policy's heaps, quota ledger and reserve; or a
store's counters, leases and buckets, fed by a replica's queues, offers and
outbox. The same random heterogeneous trace — tenants of different weights,
caps and over-quota modes (wait-mode buckets running dry, reject-mode buckets
refusing at arrival), prompts and outputs of mixed shapes, interactive and
batch requests, bursts, output charges, cached-token reports below the
locality estimate, finishes, cancels while queued, with and without the
fair-share reserve, the light tenants' credit and locality — goes to both;
after every event both must have admitted the same requests (in the same
order), refused the same ones, and hold the same counters.

Time is a fake clock and every timer is fired by hand (`ManualTimers`), so
nothing here depends on how fast the machine is: each event is followed by
letting the event loop run until both sides have nothing left to do. The
second test moves the clock on too ("advance" events): within and past the
shared state's poll, past queue deadlines (max_queue_wait_s), past the
fair-share reserve's activity window, with buckets that refill within a
trace; every timer due on the way fires in time order (an expiry, a paused
tenant's resume, the memory state's wake-up at a window's end, the pump's
polls and heartbeats). Both must still agree after every event, expiries
included. The helpers: dispatch_traces.py."""

from __future__ import annotations

import asyncio
import math
from collections import Counter

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.budget import AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.errors import QueueTimeout, QuotaExceeded, SchedulingError
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas
from scheduler.timers import ManualTimers
from tests.unit.scheduler.dispatch_traces import (
    STATES,
    TENANTS,
    Side,
    Trace,
    advance,
    apply_event,
    build,
    cached_of,
    counters,
    quiesce,
    traces,
)

__all__ = ["TENANTS", "Side", "Trace", "apply_event", "cached_of", "traces"]

MAX_WAIT_S = 3.0
WINDOW_S = 4.0
# How far an "advance" event moves the clock: within and past the shared
# state's poll, past a queue deadline (MAX_WAIT_S), past the reserve's
# activity window (WINDOW_S), past a lease's TTL (heartbeats renew it).
ADVANCES_S = [0.1, 0.3, 1.5, MAX_WAIT_S + 0.5, WINDOW_S + 0.5, 12.0]


async def run_trace(trace: Trace) -> Counter[str]:
    """Run `trace` on the dispatcher over each state; what became of its requests."""
    clock = FakeClock(100.0)
    timers = [ManualTimers(clock) for _ in STATES]
    sides = [Side(build(s, trace, clock, t)) for s, t in zip(STATES, timers, strict=True)]
    for side in sides:
        await side.gate.start()
    try:
        for n, (kind, x, y) in enumerate(trace.events):
            if kind == "advance":
                await advance(clock, timers, ADVANCES_S[y % len(ADVANCES_S)], quiesce)
            await apply_event(sides, n, kind, x, y, quiesce)
            base, other = sides
            assert other.admitted == base.admitted, f"after event {n} {kind}"
            for error in (QuotaExceeded, QueueTimeout):
                assert other.failed(error) == base.failed(error), (n, kind, error)
            single, fleet = counters(base), counters(other)
            for t in TENANTS:
                assert math.isclose(single[t], fleet[t], rel_tol=1e-9, abs_tol=1e-6), (n, t)
        return Counter(
            admitted=len(sides[0].admitted),
            refused=len(sides[0].failed(QuotaExceeded)),
            expired=len(sides[0].failed(QueueTimeout)),
            advanced=sum(kind == "advance" for kind, _, _ in trace.events),
        )
    finally:
        for side in sides:
            for task in side.tasks.values():
                task.cancel()
            await asyncio.gather(*side.tasks.values(), return_exceptions=True)
            await side.gate.aclose()


def test_the_one_dispatcher_decides_alike_over_both_states() -> None:
    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(traces(("wait", "wait", "reject")))
    def check(trace: Trace) -> None:
        try:
            seen.update(asyncio.run(run_trace(trace)))
        except SchedulingError as exc:  # refusals are the requests' own outcomes
            pytest.fail(f"unexpected error: {exc}")

    seen: Counter[str] = Counter()
    check()
    # Not a vacuous comparison: the traces admitted and refused requests.
    assert seen["admitted"] and seen["refused"], seen


def timed_traces() -> st.SearchStrategy[Trace]:
    """Traces where the clock moves on: queue deadlines, buckets that refill within
    a trace, the reserve's activity window ending."""

    def windowed(trace: Trace) -> Trace:
        trace.reserve_window_s = WINDOW_S
        return trace

    return traces(
        ("wait", "wait", "reject"),
        (None, MAX_WAIT_S),
        ("advance", "advance", "advance"),
        40,
        (1.0, 600.0),
    ).map(windowed)


# 500 traces: ~9 s alone, past the default 120 s when run niced beside a live
# bench; the timeout raised inside a trace was reported with a counter mismatch
# beside it (twice, only on such runs; never alone or in CI).
@pytest.mark.timeout(600)
def test_the_one_dispatcher_decides_alike_over_both_states_as_time_moves() -> None:
    @settings(
        max_examples=500,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(timed_traces())
    def check(trace: Trace) -> None:
        try:
            seen.update(asyncio.run(run_trace(trace)))
        except SchedulingError as exc:
            pytest.fail(f"unexpected error: {exc}")

    seen: Counter[str] = Counter()
    check()
    assert seen["admitted"] and seen["refused"] and seen["expired"], seen


def test_a_head_passed_while_held_out_of_the_reserve_is_judged_again_when_the_window_ends() -> None:
    """Found by the test above (random seeds): a reserve HOLD the round went on past
    (here a locality pick, judged before a fair head that was FULL) must bring the
    in-memory state back when the reserve's window ends, as a HOLD it stops at
    does (`Round.held_over`): the shared state polls, and past the window (event
    25) admitted `d`'s request alone."""
    quotas = TenantQuotas(tokens_per_min=1.0, tokens_burst=4000.0, max_concurrent=2)
    expiring = TenantQuotas(max_queue_wait_s=MAX_WAIT_S)
    trace = Trace(
        limits=AdmissionLimits(max_requests=5, max_kv_tokens=3000),
        reserve_fraction=0.5,
        light_credit=0.0,
        tenants=[
            TenantConfig("a", 4.0, quotas=expiring, over_quota="wait"),
            TenantConfig("b", 4.0, over_quota="wait"),
            TenantConfig("c", 2.0, over_quota="reject"),
            TenantConfig("d", 2.0, quotas=quotas, over_quota="wait"),
        ],
        local=True,
        allowance=300.0,
        w_cached=0.1,
        reserve_window_s=WINDOW_S,
        events=[
            ("finish", 39, 128), ("charge", 957, 871), ("burst", 206, 140),
            ("arrive", 300, 127), ("advance", 42, 259), ("advance", 1000, 301),
            ("arrive", 238, 238), ("finish", 40, 414), ("burst", 443, 229),
            ("burst", 678, 228), ("charge", 240, 712), ("burst", 415, 395),
            ("arrive", 287, 295), ("advance", 1, 322), ("advance", 282, 22),
            ("cancel", 85, 232), ("arrive", 846, 119), ("finish", 404, 499),
            ("finish", 128, 253), ("charge", 295, 177), ("advance", 403, 242),
            ("cancel", 227, 205), ("cached", 937, 59), ("charge", 158, 334),
            ("cancel", 229, 202), ("advance", 289, 904), ("arrive", 138, 189),
            ("advance", 40, 605), ("finish", 137, 275), ("arrive", 430, 563),
        ],
    )  # fmt: skip
    seen = asyncio.run(run_trace(trace))
    assert seen["admitted"] and seen["advanced"], seen


def test_a_tenant_admitted_to_its_max_concurrent_stays_held_past_the_poll() -> None:
    """Found by the test above once other modules were imported (the traces it
    draws change with the modules loaded): one shared step admitted `c`'s request
    and blocked the next at its max_concurrent of 1, then starting the admitted
    one cleared the hold the block had set. Past the poll `c` counted as eligible,
    so `d`, arriving at event 24, was lifted to `c`'s counter (48) instead of to
    the smallest eligible one, `b`'s (163), as the in-memory state does."""
    one = TenantQuotas(max_concurrent=1)
    trace = Trace(
        limits=AdmissionLimits(max_requests=3, max_kv_tokens=800),
        reserve_fraction=0.5,
        light_credit=300.0,
        tenants=[
            TenantConfig(
                "a",
                1.0,
                quotas=TenantQuotas(
                    max_concurrent=1,
                    tokens_per_min=600.0,
                    tokens_burst=4000.0,
                    max_queue_wait_s=MAX_WAIT_S,
                ),
                over_quota="reject",
            ),
            TenantConfig("b", 2.0, over_quota="reject"),
            TenantConfig("c", 2.0, quotas=one, over_quota="wait"),
            TenantConfig("d", 4.0, quotas=one, over_quota="wait"),
        ],
        local=False,
        allowance=300.0,
        w_cached=1.0,
        reserve_window_s=WINDOW_S,
        events=[
            ("advance", 110, 513), ("advance", 320, 229), ("advance", 13, 65),
            ("finish", 600, 770), ("cancel", 683, 121), ("arrive", 172, 12),
            ("arrive", 409, 350), ("charge", 220, 637), ("arrive", 197, 487),
            ("advance", 87, 527), ("finish", 228, 188), ("advance", 246, 337),
            ("charge", 260, 217), ("finish", 72, 826), ("burst", 858, 226),
            ("burst", 133, 120), ("cached", 192, 754), ("cancel", 475, 491),
            ("advance", 167, 207), ("advance", 107, 150), ("finish", 443, 777),
            ("cancel", 303, 238), ("advance", 68, 24), ("advance", 134, 427),
            ("burst", 143, 310), ("finish", 259, 704), ("burst", 98, 706),
            ("cached", 684, 269), ("finish", 319, 612),
        ],
    )  # fmt: skip
    seen = asyncio.run(run_trace(trace))
    assert seen["admitted"] and seen["advanced"], seen
