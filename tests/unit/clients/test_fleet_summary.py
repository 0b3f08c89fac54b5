"""`bench fleet --seeds` and `fleet_summary`: one report per seed, then per
variant the median (min-max) over them, with the bar of #33 at the pool's size."""

from __future__ import annotations

import math
from typing import Any

import pytest
from fairgate.bench.fleet_summary import live_bars, reports_in, rows, summarize


def _report(seed: int, workers: int, p99: float, jain: float) -> dict[str, Any]:
    variant = {
        "light_solo_ttft_p99_s": 0.03,
        "light_ttft_p50_s": 0.02,
        "light_ttft_p99_s": p99,
        "light_queue_wait_p99_s": 0.001,
        "light_p99_over_solo": p99 / 0.03,
        "tokens_per_s": 1000.0,
        "tokens_per_s_over_nolevers": 1.0,
        "tokens_per_s_over_peer": math.nan,
        "jain": jain,
        "jain_wait": 0.9,
    }
    return {
        "mix": "long",
        "workers": workers,
        "time_scale": 4,
        "seed": seed,
        "variants": {"fg-pace": variant},
    }


def test_a_file_of_seeds_is_summarized_per_variant_by_median_and_range() -> None:
    doc = {
        "seeds": {
            str(s): _report(s, 4, p, j)
            for s, p, j in ((1, 0.05, 0.96), (2, 0.09, 0.97), (3, 0.06, 0.99))
        }
    }
    assert reports_in(doc) == list(doc["seeds"].values())
    assert reports_in(_report(1, 4, 0.05, 0.9)) == [_report(1, 4, 0.05, 0.9)]
    (s,) = summarize(rows(reports_in(doc), live_bars()))
    assert s["seeds"] == [1, 2, 3]
    assert s["light_p99_s"] == pytest.approx((0.06, 0.05, 0.09))
    assert s["jain"] == pytest.approx((0.97, 0.96, 0.99))
    assert s["jain_wait"] == pytest.approx((0.9, 0.9, 0.9))
    # Four workers: the bar is 2x solo (60 ms) here, the decode step being shorter.
    assert s["p99_over_bar"][0] == pytest.approx(0.06 / 0.06)


def test_one_worker_is_held_to_solo_plus_one_prefill_chunk() -> None:
    b = live_bars()
    (r,) = rows([_report(1, 1, 0.2, 1.0)], b)
    assert r["p99_over_bar"] == pytest.approx(0.2 / (0.03 + b.chunk_s))
