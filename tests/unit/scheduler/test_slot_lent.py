"""A lent slot (rules.Isolation.RESERVE_SLOTS, fair_light_takes_slot beside the
reserve): a light tenant below its share may take a request slot beyond the room,
never KV beyond it (its engine retracts a running request for the slot), and the
slots of requests admitted but held unsent; with room, the reserve as RESERVE
keeps it."""

from __future__ import annotations

from scheduler import rules
from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.request import QueuedRequest
from scheduler.reserve import FairShareReserve
from scheduler.rules import Isolation, Verdict
from tests.unit.scheduler.helpers import fill, judged, kv_req

SLOTS = Isolation.RESERVE_SLOTS


def _verdict(
    reserve: FairShareReserve,
    budget: AdmissionBudget,
    req: QueuedRequest,
    queued: int = 1,
    isolation: Isolation = SLOTS,
    unsent: int = 0,
) -> Verdict:
    return judged(reserve, budget, req, isolation, queued, unsent)


def _full(slots: int = 16, kv: int = 100_000) -> tuple[FairShareReserve, AdmissionBudget]:
    budget = AdmissionBudget(AdmissionLimits(slots, kv))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)  # 2 slots of 16
    fill(reserve, budget, "flood", slots)
    return reserve, budget


def test_a_light_tenant_takes_a_slot_beyond_full_slots_within_the_lent_fraction() -> None:
    reserve, budget = _full()
    assert _verdict(reserve, budget, kv_req("victim")) is Verdict.ADMIT
    assert _verdict(reserve, budget, kv_req("victim"), isolation=Isolation.RESERVE) is Verdict.FULL
    fill(reserve, budget, "victim", 1)
    assert _verdict(reserve, budget, kv_req("victim")) is Verdict.ADMIT  # the 18th
    fill(reserve, budget, "victim", 1)
    assert _verdict(reserve, budget, kv_req("victim")) is Verdict.FULL  # beyond the two


def test_never_kv_beyond_the_room() -> None:
    reserve, budget = _full(kv=16 * 100 + 150)  # slots full, 150 KV tokens left
    assert _verdict(reserve, budget, kv_req("victim", kv=150)) is Verdict.ADMIT
    assert _verdict(reserve, budget, kv_req("victim", kv=151)) is Verdict.FULL
    # (PREEMPT would lend KV too: 12.5 % of it beyond the room.)
    assert _verdict(reserve, budget, kv_req("victim", kv=151), isolation=Isolation.PREEMPT) is (
        Verdict.ADMIT
    )


def test_no_slot_for_a_heavy_or_over_share_tenant() -> None:
    reserve, budget = _full()
    assert _verdict(reserve, budget, kv_req("other"), rules.LIGHT_QUEUE + 1) is Verdict.FULL
    budget = AdmissionBudget(AdmissionLimits(4, 100_000))
    reserve = FairShareReserve(0.5, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 2)
    fill(reserve, budget, "light", 2)  # at its half already
    assert _verdict(reserve, budget, kv_req("light")) is Verdict.FULL
    off = FairShareReserve(0.0, lambda t: 1.0, engine=budget.engine)
    assert _verdict(off, budget, kv_req("victim")) is Verdict.FULL


def test_with_room_it_is_the_reserve() -> None:
    budget = AdmissionBudget(AdmissionLimits(16, 100_000))
    reserve = FairShareReserve(0.125, lambda t: 1.0, engine=budget.engine)
    fill(reserve, budget, "flood", 14)
    fill(reserve, budget, "victim", 1)  # a light tenant below its share is active
    # The flood, above its share, is held out of the reserve as under RESERVE.
    flood = kv_req("flood")
    assert _verdict(reserve, budget, flood, queued=9) is Verdict.HOLD
    assert _verdict(reserve, budget, flood, isolation=Isolation.RESERVE) is Verdict.HOLD


def test_the_slots_of_unsent_requests_are_lent_too() -> None:
    reserve, budget = _full()  # 16 of 16 slots, 2 lent beyond them
    fill(reserve, budget, "victim", 2)  # the two lent slots taken
    assert _verdict(reserve, budget, kv_req("victim")) is Verdict.FULL
    # Three of the flood's requests wait unsent (paced, held, in a lane): their
    # slots are no engine's, so the light tenant may have them.
    assert _verdict(reserve, budget, kv_req("victim"), unsent=3) is Verdict.ADMIT
    fill(reserve, budget, "victim", 3)
    assert _verdict(reserve, budget, kv_req("victim"), unsent=3) is Verdict.FULL
    # Never to a heavy tenant, never KV beyond the room, never under RESERVE.
    assert _verdict(reserve, budget, kv_req("flood"), rules.LIGHT_QUEUE + 1, unsent=9) is (
        Verdict.FULL
    )
    assert _verdict(reserve, budget, kv_req("victim"), isolation=Isolation.RESERVE, unsent=9) is (
        Verdict.FULL
    )


def test_unsent_never_lends_kv_and_counts_at_most_what_is_in_flight() -> None:
    reserve, budget = _full(kv=16 * 100 + 150)
    assert _verdict(reserve, budget, kv_req("victim", kv=151), unsent=16) is Verdict.FULL
    assert rules.fits_slot_lent(0.0, AdmissionLimits(2, 1000), 2, 200, 100, unsent=5)
    assert not rules.fits_slot_lent(0.0, AdmissionLimits(2, 1000), 3, 200, 100, unsent=1)
