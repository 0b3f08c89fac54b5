"""Isolation by preemption (rules.Isolation.PREEMPT): the rule alone and the
engine priorities that go with it (on the engine model and the virtual fleet:
tests/unit/fleet/test_preempt_fleet.py)."""

from __future__ import annotations

import itertools

import pytest

from scheduler import rules
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.request import QueuedRequest
from scheduler.reserve import FairShareReserve
from scheduler.rules import Isolation, Verdict
from tests.unit.scheduler.helpers import fill, judged, kv_req

PREEMPT = Isolation.PREEMPT
_FIRST_IDS = itertools.count(1000)


def _verdict(
    reserve: FairShareReserve, budget: AdmissionBudget, req: QueuedRequest, queued: int = 1
) -> Verdict:
    return judged(reserve, budget, req, PREEMPT, queued)


def test_nothing_is_kept_idle_the_engine_fills() -> None:
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 15)
    fill(reserve, budget, "victim", 1)  # light, below its share: RESERVE would hold
    assert _verdict(reserve, budget, kv_req("flood"), queued=9) is Verdict.FULL
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 14)
    fill(reserve, budget, "victim", 1)
    assert _verdict(reserve, budget, kv_req("flood"), queued=9) is Verdict.ADMIT  # the 16th


def test_a_light_tenant_below_its_share_goes_beyond_a_full_engine() -> None:
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(
        0.125, lambda t: 1.0, engine=budget.engine
    )  # 2 slots lent beyond the 16
    fill(reserve, budget, "flood", 16)
    assert _verdict(reserve, budget, kv_req("victim")) is Verdict.ADMIT
    fill(reserve, budget, "victim", 1)
    assert _verdict(reserve, budget, kv_req("victim")) is Verdict.ADMIT  # 18th: still lent
    fill(reserve, budget, "victim", 1)
    assert _verdict(reserve, budget, kv_req("victim")) is Verdict.FULL  # beyond the lent room


def test_heavy_or_over_share_tenants_get_no_lent_room() -> None:
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 16)
    # A tenant with a queue of its own: it would retract its peers' requests.
    assert _verdict(reserve, budget, kv_req("other"), rules.LIGHT_QUEUE + 1) is Verdict.FULL
    budget = AdmissionBudget(AdmissionLimits(4, 100_000))
    reserve = FairShareReserve(0.5, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 2)
    fill(reserve, budget, "light", 2)  # at its half already
    assert _verdict(reserve, budget, kv_req("light")) is Verdict.FULL


def test_lent_kv_and_zero_fraction() -> None:
    budget = AdmissionBudget(AdmissionLimits(100, 1000))
    reserve = FairShareReserve(0.1, lambda t: 1.0, engine=budget.engine)  # 100 KV tokens lent
    fill(reserve, budget, "flood", 10)  # the KV is full
    assert _verdict(reserve, budget, kv_req("victim", kv=100)) is Verdict.ADMIT
    assert _verdict(reserve, budget, kv_req("victim", kv=101)) is Verdict.FULL
    off = FairShareReserve(0.0, lambda t: 1.0, engine=budget.engine)
    assert _verdict(off, budget, kv_req("victim")) is Verdict.FULL


@pytest.mark.parametrize("threshold", [0, 1, 2, 3, 5, 9, 10, 12])
@pytest.mark.parametrize("tiered", [False, True])
def test_engine_priorities_preempt_exactly_for_lent_requests(threshold: int, tiered: bool) -> None:
    prompts = [1, 127, 128, 600, 5000] if tiered else [None]

    def p(batch: bool, light: bool, lent: bool = False, prompt: int | None = None) -> int:
        return rules.engine_priority(batch, light, threshold, lent, prompt)

    within = [
        p(b, light, False, n) for b in (False, True) for light in (False, True) for n in prompts
    ]
    lent = [p(b, True, True, n) for b in (False, True) for n in prompts]
    # Within the room nothing is ever retracted; a lent request retracts any of
    # those, never another lent one.
    assert max(within) - min(within) <= threshold
    assert min(lent) - max(within) > threshold
    assert max(lent) - min(lent) <= threshold
    # Light before heavy, interactive before batch, where the threshold leaves room.
    if threshold >= (9 if tiered else 3):
        heavy = [p(b, False, False, n) for b in (False, True) for n in prompts]
        assert p(True, True, False, prompts[0]) > max(heavy)
        assert p(False, True) > p(True, True)
        assert min(p(False, False, False, n) for n in prompts) > max(
            p(True, False, False, n) for n in prompts
        )
    # An engine that never preempts: just the order.
    assert rules.engine_priority(False, True, None, True) == rules.engine_priority(False, True)


@pytest.mark.parametrize("batch", [False, True])
def test_tiers_put_the_cheapest_to_recompute_lowest(batch: bool) -> None:
    # The engine retracts the lowest priority first: among heavy requests, the
    # shortest prompt (SGLang prefills a retracted request's prompt again).
    order = [rules.engine_priority(batch, False, 10, prompt_tokens=n) for n in (1, 200, 1000, 3000)]
    assert order == sorted(order) and len(set(order)) == 4
    assert [rules.engine_priority(batch, False, 10, prompt_tokens=n) for n in (127, 128)] == [
        order[0],
        order[0] + 1,
    ]
