from __future__ import annotations

import pytest

from scheduler.ordering.vtc import VtcPolicy
from scheduler.request import Priority
from tests.unit.scheduler.helpers import req


def test_serves_smallest_counter_and_charges_prompt_and_output() -> None:
    p = VtcPolicy(w_in=1.0, w_out=2.0)
    a1, a2, b1 = req("a", prompt=100), req("a", prompt=100), req("b", prompt=10)
    for r in (a1, a2, b1):
        p.push(r)
    assert p.pop_next() is a1  # tie at 0: oldest head first
    assert p.counter("a") == 100
    assert p.pop_next() is b1
    assert p.counter("b") == 10
    p.on_output_tokens(b1, 60)
    assert p.counter("b") == 130
    p.push(req("b"))
    assert p.pop_next() is a2  # a (100) < b (130)


def test_weights_divide_charges() -> None:
    p = VtcPolicy({"a": 2.0, "b": 1.0}.__getitem__, w_in=1.0, w_out=2.0)
    reqs = [req(t, prompt=100) for _ in range(6) for t in ("a", "b")]
    for r in reqs:
        p.push(r)
    served = [p.pop_next() for _ in range(6)]
    counts = {t: sum(1 for r in served if r is not None and r.tenant_id == t) for t in "ab"}
    assert counts == {"a": 4, "b": 2}
    assert p.counter("a") == 200 and p.counter("b") == 200


def test_newly_backlogged_tenant_is_lifted_no_credit_for_idling() -> None:
    p = VtcPolicy()
    for _ in range(10):
        p.push(req("a", prompt=100))
    for _ in range(5):
        p.pop_next()
    assert p.counter("a") == 500
    p.push(req("b", prompt=100))
    p.push(req("b", prompt=100))
    assert p.counter("b") == 500  # lifted to the min backlogged counter
    # The newcomer wins the tie, then they alternate: b banked nothing.
    order = [p.pop_next().tenant_id for _ in range(4)]  # type: ignore[union-attr]
    assert order == ["b", "a", "b", "a"]


def test_lift_uses_last_served_counter_when_queue_is_empty() -> None:
    p = VtcPolicy()
    a = req("a", prompt=300)
    p.push(a)
    p.pop_next()
    p.on_output_tokens(a, 10)
    assert p.counter("a") == 320
    p.push(req("b"))
    assert p.counter("b") == 0  # floor: a's counter when it was served
    p.push(req("a"))
    assert p.counter("a") == 320  # never lowered
    assert p.pop_next().tenant_id == "b"  # type: ignore[union-attr]
    assert p.pop_next().tenant_id == "a"  # type: ignore[union-attr]
    p.push(req("c"))
    # Nobody is backlogged: c starts at the counter a had when last served.
    assert p.counter("c") == 320


def test_paused_tenant_is_skipped_and_keeps_its_place() -> None:
    p = VtcPolicy()
    a1, a2, b1, b2 = req("a"), req("a"), req("b"), req("b")
    for r in (a1, b1, a2, b2):
        p.push(r)
    p.pause("a")
    assert p.peek_next() is b1
    assert p.pop_next() is b1
    p.resume("a")
    assert p.pop_next() is a1  # a (0) < b (10): still first in line
    assert len(p) == 2


def test_a_tenant_held_back_by_its_own_limits_keeps_its_counter_and_place() -> None:
    # Holding is not idling: a paused tenant stays backlogged (issue #11: a
    # pause/resume used to lift it to the others' counter, losing its credit).
    p = VtcPolicy()
    p.push(req("a"))
    p.push(req("a"))
    p.push(req("b", prompt=10))
    assert p.pop_next().tenant_id == "a"  # type: ignore[union-attr]
    assert p.counter("a") == 10
    p.pause("a")
    for _ in range(5):
        p.pop_next()
        p.push(req("b", prompt=10))
    assert p.counter("b") == 50
    p.push(req("a"))  # still backlogged while paused: a push is no lift either
    p.resume("a")
    assert p.counter("a") == 10  # kept
    assert p.pop_next().tenant_id == "a"  # type: ignore[union-attr]
    assert p.pop_next().tenant_id == "a"  # type: ignore[union-attr]


def test_remove_charges_nothing_and_unbacklogs() -> None:
    p = VtcPolicy()
    a1, b1 = req("a", prompt=50), req("b", prompt=5)
    p.push(a1)
    p.push(b1)
    assert p.remove(a1) and not p.remove(a1)
    assert p.counter("a") == 0
    assert p.pop_next() is b1
    assert p.pop_next() is None and len(p) == 0


def test_batch_is_not_starved_within_a_tenant() -> None:
    p = VtcPolicy(batch_every_n=3)
    batch = req("a", priority=Priority.BATCH)
    p.push(batch)
    for _ in range(10):
        p.push(req("a"))
    served = [p.pop_next() for _ in range(4)]
    assert served[3] is batch


def test_invalid_weights() -> None:
    with pytest.raises(ValueError, match="w_in"):
        VtcPolicy(w_in=0, w_out=0)
