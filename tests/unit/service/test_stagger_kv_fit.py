"""Staggered prefill keeps a long prompt off the last worker on short steps only
where another worker's KV holds it (issue #33, traced on two live workers: a
prompt parked on a full worker waits in its engine's queue while its KV fills
admission's budget, and the light tenant waits behind it in fairgate's queue)."""

from __future__ import annotations

import pytest

from service.engines.placement import Placement
from service.engines.routing import WorkerView
from service.engines.stagger import Stagger
from tests.unit.service.test_placement import KV, _request, _target


def _two_workers() -> Placement:
    p = Placement([_target(f"w{i}") for i in range(2)], clock=lambda: 5.0)
    p.stagger = Stagger(min_tokens=1024, light_window_s=10.0, min_workers=2)
    p.stagger.light_seen_s = 4.0  # a light tenant is active
    p.pending_prefill[:] = [0, 4000]  # w0 on short steps, w1 mid-prefill
    return p


@pytest.mark.parametrize(("busy_kv", "kept"), [(1_000, True), (KV - 2_000, False)])
def test_a_long_prompt_is_kept_off_the_free_worker_only_where_the_busy_one_holds_it(
    busy_kv: int, kept: bool
) -> None:
    p = _two_workers()
    p.kv_in_flight[1] = busy_kv
    placed = p.place(_request(3000, light=False), [], set())
    assert placed is not None
    assert placed.worker == (1 if kept else 0) and p.stagger.kept_free == int(kept)
    assert p.stagger.kept_given_up == int(not kept)  # counted for the operator's metric


def test_another_replicas_kv_on_the_busy_worker_counts() -> None:
    p = _two_workers()
    p.kv_in_flight[1] = 1_000
    p.learn_load("w1", "other", 2, KV - 3_000)  # w1 full with the other replica's
    placed = p.place(_request(3000, light=False), [], set())
    assert placed is not None and placed.worker == 0 and p.stagger.kept_free == 0
    assert p.stagger.kept_given_up == 1


def test_without_the_fit_the_rule_keeps_as_before() -> None:
    st = Stagger(min_tokens=1024, light_seen_s=4.0, min_workers=2)
    views = [(0, WorkerView(0.1)), (1, WorkerView(0.1))]
    left = st.kept(3000, views, [0, 4000], [True, True], 5.0)
    assert [i for i, _ in left] == [1]
    only_w0 = lambda i, v: i == 0  # noqa: E731 (w0 holds it, w1 does not)
    assert st.kept(3000, views, [0, 4000], [True, True], 5.0, only_w0) == views
    assert (st.kept_free, st.kept_given_up) == (1, 1)


def test_with_the_hold_the_prompt_waits_rather_than_take_the_last_free_worker() -> None:
    """Where no other worker's KV holds it, the hold keeps the prompt unsent (at
    most `hold_max_s`) so that the free worker stays on short steps; once the busy
    worker's KV frees, the rule keeps it off the free one as before."""
    p = _two_workers()
    p.stagger.hold_max_s = 2.0
    p.kv_in_flight[1] = KV - 2_000  # w1 cannot hold 3 000 more
    req = _request(3000, light=False)
    assert p.hold_until(req, [], 5.0, True) == 7.0  # the bound
    assert (p.stagger.held, p.stagger.kept_given_up) == (1, 0)  # asked, not placed
    assert p.hold_until(req, [], 5.0, False) == 7.0  # asked again: counted once
    assert p.stagger.held == 1
    p.kv_in_flight[1] = 1_000  # a request on w1 ended
    assert p.hold_until(req, [], 5.0, False) is None
    placed = p.place(req, [], set())
    assert placed is not None and placed.worker == 1 and p.stagger.kept_free == 1


def test_the_hold_for_room_ends_at_its_bound_and_is_off_without_the_hold() -> None:
    p = _two_workers()
    p.kv_in_flight[1] = KV - 2_000
    req = _request(3000, light=False)
    assert p.hold_until(req, [], 5.0, True) is None  # hold_max_s 0: the hold is off
    p.stagger.hold_max_s = 2.0
    assert p.hold_until(req, [], 3.0, True) is None  # waiting since 3.0: the bound is past
    assert (p.stagger.held, p.stagger.held_to_bound) == (0, 1)
    placed = p.place(req, [], set())
    assert placed is not None and placed.worker == 0 and p.stagger.kept_given_up == 1
