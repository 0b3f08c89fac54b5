"""Fair-share reserve: the rule alone (rules.verdict on FairShareReserve's loads;
a victim beside a flood on the simulator: tests/unit/fleet/test_reserve_fleet.py)."""

from __future__ import annotations

import pytest

from scheduler import rules
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.request import QueuedRequest
from scheduler.reserve import FairShareReserve
from scheduler.rules import Verdict, needs_load, verdict
from tests.unit.scheduler.helpers import fill, kv_req


def allows(reserve: FairShareReserve, req: QueuedRequest, budget: AdmissionBudget) -> bool:
    room = (budget.limits, budget.engine.requests, budget.engine.kv_tokens, req.kv_tokens)
    load = (
        reserve.load(req.tenant_id, budget.limits) if needs_load(reserve.fraction, *room) else None
    )
    return verdict(0.0, *room, reserve.fraction, load) is Verdict.ADMIT


def test_outside_the_reserve_anyone_is_admitted() -> None:
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)  # 2 of 16 slots
    fill(reserve, budget, "flood", 12)
    fill(reserve, budget, "victim", 1)
    assert allows(reserve, kv_req("flood"), budget)  # 14th of 16: outside the reserve


def test_over_share_tenant_is_held_while_a_tenant_with_nothing_queued_is_below_its_share() -> None:
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 13)
    fill(reserve, budget, "victim", 1)  # in flight, nothing queued: kept room for
    assert not allows(reserve, kv_req("flood"), budget)
    assert allows(reserve, kv_req("victim"), budget)


def test_no_room_is_kept_for_heavy_tenants() -> None:
    # A tenant with a queue of its own is served in counter order anyway: holding
    # room for it would only idle the reserve (issue #11: 0.86x FCFS throughput).
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 13)
    fill(reserve, budget, "other", 1)
    for _ in range(rules.LIGHT_QUEUE):  # a few queued: still light, room is kept
        reserve.on_queued(kv_req("other"))
        assert not allows(reserve, kv_req("flood"), budget)
    reserve.on_queued(kv_req("other"))  # one more: heavy
    assert allows(reserve, kv_req("flood"), budget)


def test_a_recently_seen_tenant_is_kept_room_for_within_the_window() -> None:
    clock = FakeClock()
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, clock, window_s=5.0, engine=budget.engine)
    fill(reserve, budget, "flood", 14)
    light = kv_req("light")
    reserve.on_queued(light)
    budget.reserve(light)
    reserve.on_admitted(light)
    budget.release(light)
    reserve.on_finished(light)  # gone idle: between two of its requests
    assert not allows(reserve, kv_req("flood"), budget)
    clock.advance(5.0)
    assert allows(reserve, kv_req("flood"), budget)  # the window has passed: flood alone


def test_a_tenant_alone_is_never_held() -> None:
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 15)
    assert allows(reserve, kv_req("flood"), budget)


def test_weights_set_the_share_and_kv_counts_too() -> None:
    budget = AdmissionBudget(AdmissionLimits(100, 1000))
    weights = {"big": 3.0, "small": 1.0}
    reserve = FairShareReserve(0.1, weights.__getitem__, engine=budget.engine)
    fill(reserve, budget, "big", 8)  # 800 KV tokens: the next 100 enter the KV reserve
    fill(reserve, budget, "small", 1)
    # big's share is 3/4 = 750 KV tokens: over it, held; small is well below.
    assert not allows(reserve, kv_req("big"), budget)
    assert allows(reserve, kv_req("small"), budget)


def test_a_tenant_with_nothing_in_flight_is_never_held() -> None:
    budget = AdmissionBudget(AdmissionLimits(8, 1000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "a", 3)  # 300 KV tokens
    big = kv_req("b", kv=600)  # above b's half of the KV, and into the KV reserve
    reserve.on_queued(big)
    assert allows(reserve, big, budget)


def test_bookkeeping_returns_to_zero_and_zero_fraction_is_off() -> None:
    budget = AdmissionBudget(AdmissionLimits(2, 1000))
    reserve = FairShareReserve(0.0, lambda t: 1.0, FakeClock(), 5.0, engine=budget.engine)
    r = kv_req("a")
    reserve.on_queued(r)
    budget.reserve(r)
    reserve.on_admitted(r)
    assert allows(reserve, kv_req("b"), budget)
    budget.release(r)
    reserve.on_finished(r)
    assert reserve.queued("a") == 0 and not budget.engine.tenants()
    assert reserve.seen.active(4.9) == ["a"] and reserve.seen.active(5.0) == []
    with pytest.raises(ValueError):
        FairShareReserve(1.0, lambda t: 1.0, engine=budget.engine)
