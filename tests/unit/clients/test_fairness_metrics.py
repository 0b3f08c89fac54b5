"""The fairness benchmark's metrics on hand-built timelines."""

from __future__ import annotations

import math

import pytest
from fairgate.bench.fairness_metrics import (
    RequestRecord,
    backlog_intervals,
    backlogged_sets,
    common_intervals,
    jain_backlogged,
    jain_index,
    max_weighted_gap,
    service_events,
    service_within,
)


def test_jain_index() -> None:
    assert jain_index([5, 5, 5]) == pytest.approx(1.0)
    assert jain_index([1, 2]) == pytest.approx(9 / 10)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)
    assert math.isnan(jain_index([]))


def test_backlog_intervals_merge_and_clip() -> None:
    recs = [
        RequestRecord("a", sent_s=0.0, prompt_tokens=1, admitted_s=2.0),
        RequestRecord("a", sent_s=1.0, prompt_tokens=1, admitted_s=3.0),
        RequestRecord("a", sent_s=5.0, prompt_tokens=1),  # never admitted: until the end
        RequestRecord("a", sent_s=6.0, prompt_tokens=1, rejected="RESOURCE_EXHAUSTED"),
        RequestRecord("b", sent_s=0.0, prompt_tokens=1, admitted_s=9.0),
    ]
    assert backlog_intervals(recs, "a", until_s=8.0) == [(0.0, 3.0), (5.0, 8.0)]


def test_weighted_gap_counts_only_common_backlog_and_weights() -> None:
    # a and b both backlogged on [0, 10]; a gets 10 weighted tokens/s, b 5/s with weight 0.5.
    recs_a = RequestRecord(
        "a", 0.0, 0, admitted_s=10.0, token_times=[(t + 0.5, 5) for t in range(10)]
    )
    recs_b = RequestRecord(
        "b", 0.0, 0, admitted_s=10.0, token_times=[(t + 0.5, 5) for t in range(10)]
    )
    recs = [recs_a, recs_b]
    ev = service_events(recs, w_in=1.0, w_out=2.0, until_s=20.0)
    iv = {t: backlog_intervals(recs, t, 20.0) for t in ("a", "b")}
    # Equal weights and service arriving at the same instants: no gap.
    assert max_weighted_gap(ev, iv, {"a": 1, "b": 1}, "a", "b") == 0.0
    # b weighs 2: it should have had twice a's service, so the gap grows to 50.
    assert max_weighted_gap(ev, iv, {"a": 1, "b": 2}, "a", "b") == pytest.approx(50.0)
    # No common backlog: no gap.
    iv_apart = {"a": [(0.0, 4.0)], "b": [(5.0, 9.0)]}
    assert max_weighted_gap(ev, iv_apart, {"a": 1, "b": 1}, "a", "b") == 0.0


def test_service_counted_only_while_every_tenant_was_backlogged() -> None:
    together = common_intervals([[(0.0, 4.0), (6.0, 10.0)], [(2.0, 7.0)], [(1.0, 9.0)]])
    assert together == [(2.0, 4.0), (6.0, 7.0)]
    events = [(1.0, 5.0), (2.0, 1.0), (3.5, 2.0), (5.0, 7.0), (6.5, 4.0), (8.0, 9.0)]
    assert service_within(events, together) == 1.0 + 2.0 + 4.0


def test_prompt_tokens_the_engine_had_cached_count_at_w_cached() -> None:
    done = RequestRecord("a", 0.0, 1000, admitted_s=1.0, cached_tokens=800)
    cut = RequestRecord("a", 0.0, 500, admitted_s=2.0)  # no usage came back: all at w_in
    lying = RequestRecord("a", 0.0, 100, admitted_s=3.0, cached_tokens=900)  # capped at the prompt
    recs = [done, cut, lying]
    charged = service_events(recs, w_in=1.0, w_out=2.0, until_s=9.0, w_cached=0.1)["a"]
    assert [v for _, v in charged] == pytest.approx([200 + 80, 500, 10])
    # Without w_cached every prompt token counts at w_in, reported hits or not.
    plain = service_events(recs, w_in=1.0, w_out=2.0, until_s=9.0)["a"]
    assert [v for _, v in plain] == [1000, 500, 100]


def test_backlogged_sets_cut_time_where_the_set_changes() -> None:
    iv = {"a": [(0.0, 10.0)], "b": [(2.0, 8.0)], "c": [(4.0, 5.0), (9.0, 12.0)]}
    assert backlogged_sets(iv) == {
        ("a", "b"): [(2.0, 4.0), (5.0, 8.0)],
        ("a", "b", "c"): [(4.0, 5.0)],
        ("a", "c"): [(9.0, 10.0)],
    }


def test_jain_among_the_tenants_backlogged_together() -> None:
    # a and b backlogged on [0, 10] and served alike; c, seldom backlogged (its
    # share served at once), joins them for [4, 5], in which one of a's large
    # admissions lands. Jain over only the spans when all three were is that one
    # admission's (1/3); among those backlogged together it is near 1.
    iv = {"a": [(0.0, 10.0)], "b": [(0.0, 10.0)], "c": [(4.0, 5.0)]}
    ev = {
        "a": [(0.5, 100.0), (2.5, 100.0), (4.5, 100.0), (6.0, 100.0), (8.5, 100.0)],
        "b": [(1.5, 100.0), (3.5, 100.0), (6.5, 100.0), (7.5, 100.0)],
        "c": [],
    }
    w = {"a": 1.0, "b": 1.0, "c": 1.0}
    all_three = common_intervals(list(iv.values()))
    assert jain_index([service_within(ev[t], all_three) for t in iv]) == pytest.approx(1 / 3)
    # (a, b) for 9 s at Jain 1 (400 each), (a, b, c) for 1 s at 1/3.
    assert jain_backlogged(ev, iv, w) == pytest.approx((9 * 1.0 + 1 * (1 / 3)) / 10)
    # Weights divide the service: b at weight 2 owes twice a's service.
    iv2 = {"a": [(0.0, 10.0)], "b": [(0.0, 10.0)]}
    assert jain_backlogged(ev, iv2, {"a": 1.0, "b": 2.0}) == pytest.approx(
        jain_index([500.0, 200.0])
    )
    # Never two at once: NaN.
    assert math.isnan(jain_backlogged(ev, {"a": [(0.0, 1.0)], "b": [(2.0, 3.0)]}, w))
