"""The fairness benchmark's metrics on hand-built timelines."""

from __future__ import annotations

import math

import pytest
from fairgate.bench.fairness_metrics import (
    RequestRecord,
    backlog_intervals,
    common_intervals,
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
