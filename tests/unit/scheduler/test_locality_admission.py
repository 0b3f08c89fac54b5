"""Locality-aware admission, the rule alone: within the allowance of the fair
order, the request whose prefix a worker with room holds goes first (on the
virtual fleet: tests/unit/fleet/test_locality_admission_fleet.py)."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.decision import window_end
from scheduler.local_admission import LocalDispatcher, local_dispatcher
from scheduler.ordering.backlog import Backlog
from scheduler.ordering.keyed_heap import KeyedHeap
from scheduler.ordering.vtc import VtcPolicy
from scheduler.request import QueuedRequest
from scheduler.rules import (
    LIGHT_QUEUE,
    LOCALITY_MIN_GAIN,
    Rank,
    locality_pick,
    order_key,
    vtc_rank,
)
from scheduler.timers import ManualTimers
from tests.unit.scheduler.helpers import Waiter

ALLOWANCES = [0.0, 1000.0, 5000.0]


def test_locality_pick_prefers_the_most_cached_and_the_fair_head_on_ties() -> None:
    assert locality_pick([0, 0, 0]) == 0
    assert locality_pick([0, 512, 512]) == 1
    assert locality_pick([100, 50]) == 0


def test_locality_passes_the_fair_head_only_for_the_minimum_gain() -> None:
    # A short prompt one block of which is held (15 tokens counted) does not pass
    # a cold one; the gain is over the fair head's, not the runner-up's.
    g = LOCALITY_MIN_GAIN
    assert locality_pick([0, 15]) == 0
    assert locality_pick([0, g - 1]) == 0
    assert locality_pick([0, g]) == 1
    assert locality_pick([100, 100 + g - 1, 100 + g]) == 2
    assert locality_pick([0, g, g + 1]) == 2


@given(
    st.dictionaries(
        st.text("abcdefgh", min_size=1, max_size=2),
        st.tuples(st.floats(0, 1000), st.integers(0, 100)),
        max_size=30,
    ),
    st.sets(st.text("abcdefgh", min_size=1, max_size=2)),
    st.floats(0, 1000),
)
def test_up_to_is_every_live_item_within_the_limit_in_key_order(
    keys: dict[str, tuple[float, int]], dropped: set[str], limit: float
) -> None:
    heap = KeyedHeap()
    for item, (k, k2) in keys.items():
        heap.set(item, (k + 5.0, 0, k2))  # a stale entry for each, then the live one
        heap.set(item, (k, 0, k2))
    for item in dropped:
        heap.discard(item)
    live = {i: k for i, k in keys.items() if i not in dropped}
    want = sorted(((k, 0, k2), i) for i, (k, k2) in live.items() if k <= limit)
    assert sorted(heap.up_to(limit)) == want
    assert [x[0] for x in heap.up_to(limit)] == [x[0] for x in want]


@given(
    st.lists(st.tuples(st.sampled_from("abcdef"), st.integers(1, 3)), min_size=1, max_size=20),
    st.dictionaries(st.sampled_from("abcdef"), st.floats(0, 100)),
    st.floats(0, 60),
    st.sampled_from([0.0, 10.0]),
)
def test_heads_upto_is_every_eligible_tenant_within_the_window_in_fair_order(
    pushes: list[tuple[str, int]],
    counters: dict[str, float],
    allowance: float,
    credit: float,
) -> None:
    def rank(t: str, head: QueuedRequest, queued: int) -> Rank:
        return vtc_rank(counters.get(t, 0.0), queued, credit, 0, head.seq)

    backlog = Backlog(rank, light_credit=credit)
    seq = 0
    for tenant, n in pushes:
        for _ in range(n):
            seq += 1
            backlog.push(QueuedRequest(f"r{seq}", tenant, 1, 1, seq=seq))

    def key(t: str) -> float:
        return order_key(counters.get(t, 0.0), backlog.queued(t), credit)

    top = backlog.peek()
    assert top is not None
    heads = backlog.heads_upto(window_end(key(top.tenant_id), allowance))
    assert heads[0] is top
    first = key(heads[0].tenant_id)
    tenants = {t for t, _ in pushes}
    assert {h.tenant_id for h in heads} == {t for t in tenants if key(t) <= first + allowance}
    rest = [key(h.tenant_id) for h in heads[1:]]
    assert rest == sorted(rest)


def _dispatcher(cached: dict[str, int], allowance: float) -> tuple[LocalDispatcher, VtcPolicy]:
    policy = VtcPolicy()
    clock = FakeClock()
    d = local_dispatcher(
        policy,
        AdmissionBudget(AdmissionLimits(max_requests=1, max_kv_tokens=10**6)),
        clock,
        timers=ManualTimers(clock),
        locality=lambda r: cached.get(r.request_id, 0),
        allowance=allowance,
    )
    return d, policy


def _submit(
    d: LocalDispatcher, rid: str, tenant: str, prompt: int = 100
) -> tuple[QueuedRequest, Waiter]:
    r, w = QueuedRequest(rid, tenant, prompt, 1), Waiter()
    d.submit(r, w)
    return r, w


def test_the_cached_request_within_the_allowance_goes_first_and_beyond_it_waits() -> None:
    d, policy = _dispatcher({"b1": 800, "c1": 900, "c2": 900}, allowance=150)
    a0, wa0 = _submit(d, "a0", "a")  # the one slot
    # a keeps more than LIGHT_QUEUE queued: heavy, locality may pass it.
    wa = [_submit(d, f"a{i}", "a")[1] for i in range(1, LIGHT_QUEUE + 2)]
    b1, wb1 = _submit(d, "b1", "b")
    c1, wc1 = _submit(d, "c1", "c", prompt=200)
    assert wa0.admitted_count == 1
    # Counters: a 100; b and c lifted to the floor, 100 (a, the only one backlogged).
    # All three within 150: c's cached prefix is the longest, c goes first.
    d.finish(a0)
    assert (wa[0].admitted_count, wb1.admitted_count, wc1.admitted_count) == (0, 0, 1)
    assert d.state.locality_picks_total == 1
    # c is now at 300, beyond 100 + 150: its next request waits although it is
    # cached; b (cached, within the allowance of a) goes before a.
    _, wc2 = _submit(d, "c2", "c")
    d.finish(c1)
    assert (wa[0].admitted_count, wb1.admitted_count, wc2.admitted_count) == (0, 1, 0)
    d.finish(b1)
    assert (wa[0].admitted_count, wc2.admitted_count) == (1, 0)
    assert policy.counter("c") == 300
    assert d.state.locality_picks_total == 2


def test_nothing_cached_keeps_the_fair_order() -> None:
    def order(d: LocalDispatcher) -> list[int]:
        running, _ = _submit(d, "a0", "a")
        queued = [_submit(d, f"x{i}", t, 50 * (i + 1)) for i, t in enumerate("abcabcab")]
        seen: list[int] = []
        for _ in queued:
            d.finish(running)
            i = next(i for i, (_, w) in enumerate(queued) if w.admitted_count and i not in seen)
            seen.append(i)
            running = queued[i][0]
        return seen

    local, _ = _dispatcher({}, allowance=10_000)
    plain, _ = _dispatcher({}, allowance=0)
    plain.state.locality = None
    fair = order(plain)
    assert order(local) == fair
    assert sorted(fair) == list(range(8))
    assert local.state.locality_picks_total == 0


def test_locality_never_passes_a_light_tenants_head() -> None:
    """Tenant l has one request queued (light), first in fair order; b's cached
    head within the allowance does not go before it (isolation first)."""
    d, _ = _dispatcher({"b1": 800}, allowance=10_000)
    a0, _ = _submit(d, "a0", "a")
    _, wl = _submit(d, "l1", "l", prompt=10)
    _, wb = _submit(d, "b1", "b", prompt=10)
    d.finish(a0)
    assert (wl.admitted_count, wb.admitted_count) == (1, 0)
    assert d.state.locality_picks_total == 0
