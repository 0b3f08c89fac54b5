"""Differential test: the same random traces through the in-memory rules and the
Redis STEP script (their Lua twin); every decision must be the same.

Each trace is a sequence of steps from a few replicas: announcements (lifts),
withdrawals, output charges, settlements, forgotten tenants, and offers of candidates of mixed
shapes and weights, some with max_concurrent or wait-mode buckets, light or
heavy (queue lengths around `rules.LIGHT_QUEUE`, the candidates' and those
announced for backlogged tenants, summed over replicas), with and without the
fair-share reserve (kept, or lent beyond the room: `Isolation`) and the light
tenants' credit. After every step both stores must agree on
what was admitted, held, blocked (and whether forever) and full, and on the
counters. Buckets refill slowly enough that the two stores' clocks (injected
vs Redis TIME) cannot change a verdict within a trace.
"""

from __future__ import annotations

import asyncio
import math
import uuid
from collections.abc import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.budget import AdmissionLimits
from scheduler.clock import MonotonicClock
from scheduler.quotas import BucketLimits
from scheduler.rules import LIGHT_QUEUE, LOCALITY_MIN_GAIN, Isolation
from scheduler.state.memory_store import MemoryStore
from scheduler.state.redis_store import RedisStore
from scheduler.state.store import Candidate, Settlement, Step, StepOutcome

TENANTS = ["a", "b", "c", "d", "e", "f"]
REPLICAS = ["r1", "r2"]
SLOW = BucketLimits(requests_per_s=1e-4, requests_burst=3.0, tokens_per_s=1e-4, tokens_burst=900)


@st.composite
def traces(draw: st.DrawFn) -> tuple[AdmissionLimits, float, list[tuple[str, Step]]]:
    limits = AdmissionLimits(draw(st.integers(2, 6)), draw(st.sampled_from([400, 1000, 3000])))
    isolation = draw(
        st.sampled_from(
            [Isolation.RESERVE, Isolation.PREEMPT, Isolation.PREEMPT, Isolation.RESERVE_SLOTS]
        )
    )
    fraction = draw(st.sampled_from([0.0, 0.25, 0.5, 0.5]))
    credit = draw(st.sampled_from([0.0, 150.0, 4096.0]))
    # The fleet order across replicas (rules.behind): off, strict, or with slack.
    allowance = draw(st.sampled_from([math.inf, 0.0, 300.0, 4096.0]))
    weights = {t: draw(st.sampled_from([1.0, 1.0, 2.0, 4.0])) for t in TENANTS}
    # Locality: the prompt a worker holds, charged at w_cached (rules.admission_charge)
    # and preferred within the allowance (rules.locality_pick).
    w_cached = draw(st.sampled_from([1.0, 0.1, 0.0]))
    local = draw(st.booleans())
    steps: list[tuple[str, Step]] = []
    admitted: list[tuple[str, str]] = []  # (lease, tenant) candidates offered so far
    for k in range(draw(st.integers(5, 30))):
        replica = draw(st.sampled_from(REPLICAS))
        step = Step(
            limits,
            w_in=1.0,
            w_cached=w_cached,
            reserve_fraction=fraction,
            isolation=isolation,
            light_credit=credit,
            allowance=allowance,
            # Admitted requests the replica holds unsent (RESERVE_SLOTS lends their slots).
            unsent=draw(st.sampled_from([0, 0, 1, 3])),
        )
        kinds = ["offer", "offer", "offer", "announce", "charge", "settle", "forget"]
        kind = draw(st.sampled_from(kinds))
        if kind == "announce":
            step.announce = sorted(set(draw(st.lists(st.sampled_from(TENANTS), max_size=3))))
            step.weights = {t: weights[t] for t in step.announce}
            # Queue lengths there: some sent, some left unknown (heavy).
            lengths = st.sampled_from([1, LIGHT_QUEUE, LIGHT_QUEUE + 1])
            step.queued = {t: draw(lengths) for t in step.announce if draw(st.booleans())}
        elif kind == "charge":
            tenant = draw(st.sampled_from(TENANTS))
            # Multiples of 100, like the prompts: equal counters (ties) are common.
            step.charges = {tenant: 100.0 * draw(st.integers(1, 4))}
        elif kind == "forget":
            # Forgotten where idle fleet-wide (not backlogged, nothing in flight).
            step.forget = {t: SLOW for t in draw(st.lists(st.sampled_from(TENANTS), max_size=2))}
        elif kind == "settle" and admitted:
            lease, tenant = admitted[draw(st.integers(0, len(admitted) - 1))]
            refund = float(draw(st.integers(0, 50)))
            step.settlements = [Settlement(lease, tenant, 0.0, refund, SLOW)]
        else:
            cands = []
            offered = draw(st.lists(st.sampled_from(TENANTS), min_size=1, max_size=3))
            # Each tenant's head arrived at some point (ties go to the earlier head,
            # whatever the order of the offer); its next ones after it.
            heads = draw(st.permutations(range(len(TENANTS))))
            for n_tenant, tenant in enumerate(sorted(set(offered))):
                # Its next few requests, as the pump offers them (queued counts down).
                queued = draw(st.sampled_from([1, LIGHT_QUEUE, LIGHT_QUEUE + 1, 9]))
                take, max_concurrent = draw(st.booleans()), draw(st.none() | st.integers(1, 2))
                for j in range(draw(st.integers(1, min(3, queued)))):
                    lease = f"{replica}:{k}:{tenant}:{j}"
                    shape = draw(st.sampled_from([(300, 20), (100, 200), (100, 60)]))
                    cands.append(
                        Candidate(
                            lease,
                            tenant,
                            weights[tenant],
                            shape[0],
                            sum(shape),
                            take_buckets=take,
                            buckets=SLOW,
                            max_concurrent=max_concurrent,
                            queued=queued - j,
                            seq=100 * heads[n_tenant] + j,
                            # gains on both sides of rules.LOCALITY_MIN_GAIN
                            cached=draw(st.sampled_from([0, 20, 100, 120, 250, 300]))
                            if local
                            else 0,
                            # charged at w_cached when more (Candidate.charged_cached)
                            held_anywhere=draw(st.sampled_from([0, 200, 300])) if local else 0,
                        )
                    )
                    admitted.append((lease, tenant))
            step.candidates = cands
        steps.append((replica, step))
    return limits, fraction, steps


def verdicts(out: StepOutcome) -> tuple[object, ...]:
    blocked = sorted((i, math.isinf(w)) for i, w in out.blocked.items())
    counters = {t: round(c, 6) for t, c in out.counters.items()}
    return (
        out.admitted,
        out.full,
        sorted(out.held),
        blocked,
        counters,
        out.in_flight,
        out.lent,
        out.turn,
        out.light,
    )


@pytest.fixture
def redis_url_once(redis_url: str) -> Iterator[str]:
    yield redis_url


@pytest.mark.timeout(600)
def test_memory_and_redis_make_the_same_decisions(redis_url_once: str) -> None:
    @settings(
        max_examples=80,
        deadline=None,
        derandomize=True,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
    )
    @given(traces())
    def check(trace: tuple[AdmissionLimits, float, list[tuple[str, Step]]]) -> None:
        _, _, steps = trace

        async def run() -> None:
            mem = MemoryStore(MonotonicClock(), lease_ttl_s=600, backlog_ttl_s=600)
            domain = f"diff-{uuid.uuid4().hex}"
            red = RedisStore.from_url(
                redis_url_once, domain=domain, lease_ttl_s=600, backlog_ttl_s=600
            )
            try:
                for i, (replica, step) in enumerate(steps):
                    a = await mem.step(replica, step)
                    b = await red.step(replica, step)
                    assert verdicts(a) == verdicts(b), (i, step, a, b)
            finally:
                await red.aclose()

        asyncio.run(run())

    check()


def test_both_lend_the_slots_of_unsent_requests(redis_url_once: str) -> None:
    """A trace the random ones rarely reach (RESERVE_SLOTS, every slot and the lent
    one taken, a light tenant below its share): with two requests held unsent, one
    more light request goes in, in both stores, then a second, and no third;
    without them none does (its share, nine tenths of the slots, does not bind)."""
    limits = AdmissionLimits(4, 100_000)

    def step(unsent: int, *cands: Candidate) -> Step:
        return Step(
            limits,
            reserve_fraction=0.25,  # one slot lent
            isolation=Isolation.RESERVE_SLOTS,
            unsent=unsent,
            candidates=list(cands),
        )

    flood = [Candidate(f"f{i}", "a", 1.0, 100, 200, queued=9 - i) for i in range(4)]
    trace = [
        step(0, *flood),  # the room: four of the flood's
        step(0, Candidate("l0", "b", 9.0, 10, 20)),  # the lent slot
        step(0, Candidate("l1", "b", 9.0, 10, 20)),  # full
        step(2, Candidate("l2", "b", 9.0, 10, 20)),  # two of those five unsent: in
        step(2, Candidate("l3", "b", 9.0, 10, 20)),  # and the second
        step(2, Candidate("l4", "b", 9.0, 10, 20)),  # both lent: full
    ]

    async def run() -> list[list[int]]:
        mem = MemoryStore(MonotonicClock(), lease_ttl_s=600, backlog_ttl_s=600)
        red = RedisStore.from_url(
            redis_url_once, domain=f"diff-{uuid.uuid4().hex}", lease_ttl_s=600, backlog_ttl_s=600
        )
        admitted = []
        try:
            for s in trace:
                a, b = await mem.step("r1", s), await red.step("r1", s)
                assert verdicts(a) == verdicts(b), (s, a, b)
                admitted.append(a.admitted)
        finally:
            await red.aclose()
        return admitted

    assert asyncio.run(run()) == [[0, 1, 2, 3], [0], [], [0], [0], []]


@pytest.mark.parametrize(
    ("gain", "first"), [(LOCALITY_MIN_GAIN - 1, "a"), (LOCALITY_MIN_GAIN, "b")]
)
def test_both_pass_the_fair_head_for_locality_only_by_the_minimum_gain(
    redis_url_once: str, gain: int, first: str
) -> None:
    """The fair head `a` (heavy, nothing cached) and `b` within the allowance, whose
    worker holds `gain` more of its prompt: `b` goes first from LOCALITY_MIN_GAIN on,
    in both stores (a trace the random ones rarely reach: gains are mostly large)."""
    step = Step(
        AdmissionLimits(1, 100_000),
        allowance=4096.0,
        candidates=[
            Candidate("a0", "a", 1.0, 100, 120, queued=LIGHT_QUEUE + 1, seq=1),
            Candidate("b0", "b", 1.0, 100, 120 - gain, queued=LIGHT_QUEUE + 1, seq=2, cached=gain),
        ],
    )

    async def run() -> StepOutcome:
        mem = MemoryStore(MonotonicClock(), lease_ttl_s=600, backlog_ttl_s=600)
        red = RedisStore.from_url(
            redis_url_once, domain=f"diff-{uuid.uuid4().hex}", lease_ttl_s=600, backlog_ttl_s=600
        )
        try:
            a, b = await mem.step("r1", step), await red.step("r1", step)
        finally:
            await red.aclose()
        assert verdicts(a) == verdicts(b), (a, b)
        return a

    out = asyncio.run(run())
    assert [step.candidates[i].tenant_id for i in out.admitted] == [first]
