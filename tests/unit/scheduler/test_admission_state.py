"""The in-memory admission state (scheduler/admission_state.py) alone; both paths
keep it (the Dispatcher and MemoryStore: test_dispatch_differential.py, and the
Lua twin: test_store_differential.py)."""

from __future__ import annotations

import pytest

from scheduler.admission_state import ActiveWindow, FairCounters, InFlight


def test_a_newcomer_is_lifted_to_the_smallest_eligible_counter_and_goes_first_in_a_tie() -> None:
    c = FairCounters()
    assert c.admitted("a", 30.0) == 30.0 and c.admitted("b", 50.0) == 50.0
    assert c.floor == 0.0  # the counter *before* the last admission: b's was 0
    assert c.lift("new", [c.get("a"), c.get("b")]) == 30.0
    assert c.last_admitted("new") == 0 < c.last_admitted("a") < c.last_admitted("b")
    # Nobody eligible: the last-served floor; a counter above it is never lowered.
    assert c.lift("idle", []) == 0.0
    c.charge("idle", 80.0)
    assert c.lift("idle", [30.0]) == 80.0


def test_forget_drops_a_tenant_and_seed_raises_the_floor() -> None:
    c = FairCounters()
    c.admitted("a", 10.0)
    c.forget("a")
    assert c.get("a") == 0.0 and c.last_admitted("a") == 0
    c.seed({"x": 70.0, "y": 20.0})
    assert c.floor == 70.0 and c.lift("z", []) == 70.0


def test_in_flight_counts_per_tenant_and_refuses_a_double_release() -> None:
    f = InFlight()
    f.open("a", 100)
    f.open("a", 50)
    f.open("b", 10)
    assert (f.requests, f.kv_tokens, f.of("a"), f.of("c")) == (3, 160, (2, 150), (0, 0))
    f.release("b", 10)
    assert "b" not in f and list(f.tenants()) == ["a"]
    with pytest.raises(AssertionError, match="released twice"):
        f.release("b", 10)


def test_a_tenant_that_left_stays_active_for_the_window_only() -> None:
    w = ActiveWindow()
    w.left("off", 0.0, 0.0)  # no window: not kept
    w.left("a", 0.0, 5.0)
    assert w.active(4.9) == ["a"]
    w.back("a")
    assert not w
    w.left("a", 1.0, 5.0)
    assert w.active(6.0) == [] and not w
