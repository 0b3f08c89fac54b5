"""`fairgate bench stagger`'s table is computed from its runs: each row's figures
are those of the fleet it ran (recomputed here from a run of the same trace),
the ratios are of those figures, and the summary's medians are over the rows."""

from __future__ import annotations

import math
import statistics

from fairgate.bench.stagger import fleet, levers, light_ttft_s, long_prompt_mix, quantile, solo
from fairgate.bench.stagger_report import bar_s, bars, run_matrix, summarize

SECONDS = 8.0


def test_rows_are_the_runs_and_the_summary_their_medians() -> None:
    table = levers(1024, 2.0, 512)
    combos = {"none": table["none"], "hold": table["hold"]}
    rows = run_matrix(["long"], [2], [1, 2, 3], combos, SECONDS)
    assert [(r["seed"], r["levers"]) for r in rows] == [
        (s, n) for s in (1, 2, 3) for n in ("none", "hold")
    ]
    for r in rows:
        arrivals = long_prompt_mix(r["seed"], SECONDS, 2)
        lv = combos[r["levers"]]
        ttft = light_ttft_s(fleet(arrivals, 2, lv.stagger(), lv.staged()))
        solo_ttft = light_ttft_s(fleet(solo(arrivals), 2, None))
        assert r["p99_s"] == quantile(ttft, 0.99) and r["p50_s"] == quantile(ttft, 0.5)
        assert r["solo_p99_s"] == quantile(solo_ttft, 0.99)
        assert r["p99_over_solo"] == r["p99_s"] / r["solo_p99_s"]
        assert r["p99_over_bar"] == r["p99_s"] / bar_s(r["solo_p99_s"], 2, bars())
        if r["levers"] == "none":
            assert r["tokens_vs_none"] == 1.0 and r["held"] == 0
    # Different traces give different figures: nothing is a constant.
    assert len({r["p99_s"] for r in rows if r["levers"] == "none"}) > 1
    for s in summarize(rows):
        mine = [r for r in rows if r["levers"] == s["levers"]]
        xs = [r["p99_over_solo"] for r in mine]
        assert s["p99_over_solo"] == (statistics.median(xs), min(xs), max(xs))
        assert s["bar_met"] == (statistics.median(r["p99_over_bar"] for r in mine) <= 1.0)


def test_the_bars_come_from_the_cost_model() -> None:
    b = bars()
    assert 0 < b.decode_step_s < b.chunk_s
    assert bar_s(0.1, 1, b) == 0.1 + b.chunk_s
    assert bar_s(0.1, 2, b) == max(0.2, 0.1 + b.decode_step_s)
    assert not math.isnan(b.chunk_s)


def test_load_scales_the_heavy_tenants_and_leaves_the_light_one() -> None:
    base = run_matrix(["long"], [2], [1], {"none": levers(1024, 2.0, 512)["none"]}, 20.0)
    busy = run_matrix(["long"], [2], [1], {"none": levers(1024, 2.0, 512)["none"]}, 20.0, load=2)
    one, two = long_prompt_mix(1, 20.0, 2), long_prompt_mix(1, 20.0, 2, load=2.0)
    assert solo(one) == solo(two)
    heavy = [len([a for a in t if a.tenant_id != "light"]) for t in (one, two)]
    assert 1.6 < heavy[1] / heavy[0] < 2.4
    # Twice the heavy traffic keeps the heavy tenants backlogged together longer.
    assert busy[0]["backlogged_s"] > base[0]["backlogged_s"]
    assert busy[0]["solo_p99_s"] == base[0]["solo_p99_s"]
