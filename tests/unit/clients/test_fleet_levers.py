"""`bench fleet`'s live lever runs (issue #33): the variants' wiring, that the
levers' settings reach the server as it reads them, the long-prompt plan, and
the report's and the summary's arithmetic. No timing."""

from __future__ import annotations

import json
import math

import pytest
from fairgate.bench.fairness import RunResult
from fairgate.bench.fleet_long import LONG_WEIGHTS, LongScenario
from fairgate.bench.fleet_report import FleetRun, report
from fairgate.bench.fleet_scenarios import FleetScenario
from fairgate.bench.fleet_stacks import (
    DEFAULT_VARIANTS,
    LEVERS,
    VARIANTS,
    Workers,
    _events_config,
    fairgate_settings,
)
from fairgate.bench.fleet_summary import live_bars, rows, summarize
from fairgate.bench.servers import overrides_from_args, settings_env
from fairgate.bench.stagger import long_prompt_mix, solo

from service.settings import Settings

URLS = ["http://127.0.0.1:1", "http://127.0.0.1:2"]
EVENTS = ["tcp://127.0.0.1:5601", "tcp://127.0.0.1:5602"]


def _server_settings(settings: dict[str, object]) -> Settings:
    """What the bench's fairgate child makes of `settings`, through its argv."""
    overrides = overrides_from_args([f"{k}={v}" for k, v in settings.items()])
    overrides.pop("telemetry")
    return Settings.from_env(settings_env(overrides), listen="127.0.0.1:0")


def test_lever_variants_carry_every_lever_and_kv_events() -> None:
    one, two = VARIANTS["fg-levers"], VARIANTS["fg-levers-2r"]
    assert one.extra == two.extra == LEVERS
    assert one.kv_events and two.kv_events
    assert (one.replicas, two.replicas) == (1, 2)
    assert one.routing == two.routing == "locality"
    # Asked for by name only: a plain `bench fleet` compares what it did before.
    assert "fg-levers" not in DEFAULT_VARIANTS and "fg-levers-2r" not in DEFAULT_VARIANTS
    assert not VARIANTS["fg-locality"].kv_events


def test_the_staged_variant_is_the_stages_alone() -> None:
    staged = VARIANTS["fg-staged"]
    assert staged.kv_events and staged.routing == "locality" and staged.replicas == 1
    s = _server_settings(fairgate_settings(staged, Workers(URLS, EVENTS), "t.yaml"))
    assert (s.staged_prefill_min_tokens, s.staged_prefill_stage_tokens) == (256, 128)
    assert s.staged_prefill_cold_only
    assert s.sglang_stagger_prefill_tokens == 0 and s.sglang_cold_start_hold_s == 0
    assert "fg-staged" not in DEFAULT_VARIANTS


def test_the_levers_reach_the_server_as_settings() -> None:
    s = _server_settings(fairgate_settings(VARIANTS["fg-levers"], Workers(URLS, EVENTS), "t.yaml"))
    assert (s.sglang_stagger_prefill_tokens, s.sglang_stagger_keep_tokens) == (1024, 256)
    assert s.sglang_cold_start_hold_s == 2.0
    assert (s.staged_prefill_min_tokens, s.staged_prefill_stage_tokens) == (256, 128)
    assert s.staged_prefill_cold_only
    assert s.sglang_kv_events == ",".join(EVENTS)
    assert s.sglang_urls == ",".join(URLS) and s.sglang_routing == "locality"
    # Without the levers the server runs its defaults: the reference of the ratios.
    base = _server_settings(fairgate_settings(VARIANTS["fg-locality"], Workers(URLS, []), "t.yaml"))
    assert base.sglang_stagger_prefill_tokens == 0 and base.sglang_cold_start_hold_s == 0
    assert base.staged_prefill_min_tokens == 0 and base.sglang_kv_events == ""


def test_a_kv_events_variant_needs_workers_that_publish() -> None:
    with pytest.raises(ValueError, match="kv_events"):
        fairgate_settings(VARIANTS["fg-levers"], Workers(URLS, []), "t.yaml")


def test_a_worker_publishes_on_its_endpoint() -> None:
    flag, value = _events_config("tcp://127.0.0.1:5601").split("=", 1)
    assert flag == "--kv-events-config"
    assert json.loads(value) == {"publisher": "zmq", "endpoint": "tcp://*:5601"}


def test_long_mix_is_bench_staggers_trace_with_distinct_cold_prompts() -> None:
    sc = LongScenario(workers=2, seconds=20)
    plan = sc.plan(seed=2)
    assert plan == sc.plan(seed=2) and plan != sc.plan(seed=3)
    trace = long_prompt_mix(2, 20, 2)
    assert [(i.t_s, i.tenant, len(i.prompt_ids), i.max_tokens) for i in plan] == [
        (a.at_s, a.tenant_id, a.prompt_tokens, a.max_tokens) for a in trace
    ]
    assert len({i.prompt_ids[:8] for i in plan}) == len(plan)  # no shared prefix
    assert sc.weights == LONG_WEIGHTS and sc.heavy == ["code", "docs", "conv"]
    assert len([i for i in plan if i.tenant == sc.victim]) == len(solo(trace))
    assert FleetScenario(workers=2, seconds=20).weights != LONG_WEIGHTS  # prefix by default


def _run(key: str, tokens_per_s: float, p50: float, p99: float) -> FleetRun:
    tenants = {"light": {"ttft_p50_s": p50, "ttft_p99_s": p99}}
    return FleetRun(key, RunResult(key, 1, [], 10.0, tenants, tokens_per_s=tokens_per_s), [])


def test_report_sets_each_variant_beside_no_levers_the_peer_and_solo() -> None:
    keys = ["fg-locality", "fg-levers", "smg-cache"]
    sc = LongScenario(workers=2, seconds=10)
    reps = [
        {
            "fg-locality": _run("fg-locality", 1000.0, 0.03, 0.40),
            "fg-levers": _run("fg-levers", 960.0, 0.03, 0.06),
            "smg-cache": _run("smg-cache", 800.0, 0.30, 1.00),
        }
    ]
    solo_run = _run("solo", 0.0, 0.02, 0.03)
    out = report(
        sc,
        1.0,
        [VARIANTS[k] for k in keys],
        reps,
        dict.fromkeys(("fairgate", "smg"), solo_run),
        True,
    )
    lev = out["variants"]["fg-levers"]
    assert out["mix"] == "long"
    assert lev["tokens_per_s_over_nolevers"] == pytest.approx(0.96)
    assert lev["tokens_per_s_over_peer"] == pytest.approx(1.2)
    assert lev["light_ttft_p50_s"] == 0.03
    assert lev["light_p99_over_solo"] == pytest.approx(2.0)
    assert lev["light_p99_minus_solo_s"] == pytest.approx(0.03)
    assert math.isnan(lev["tokens_per_s_over_baseline"])  # fg-leastfull did not run


def _report(seed: int, ts: float, levers_p99: float, levers_tok: float) -> dict[str, object]:
    return {
        "mix": "prefix",
        "workers": 4,
        "time_scale": ts,
        "seed": seed,
        "variants": {
            "fg-levers": {
                "light_solo_ttft_p99_s": 0.03,
                "light_ttft_p50_s": 0.03,
                "light_ttft_p99_s": levers_p99,
                "light_p99_over_solo": levers_p99 / 0.03,
                "tokens_per_s": levers_tok,
                "tokens_per_s_over_nolevers": levers_tok / 1000,
                "tokens_per_s_over_peer": math.nan,
            }
        },
    }


def test_summary_takes_the_median_over_seeds_per_time_scale() -> None:
    b = live_bars()
    reports = [_report(1, 2, 0.09, 990), _report(2, 2, 0.03, 900), _report(3, 2, 0.3, 1000)]
    reports.append(_report(1, 4, 0.06, 950))
    s2, s4 = summarize(rows(reports, b))
    assert (s2["time_scale"], s2["seeds"], s4["seeds"]) == (2, [1, 2, 3], [1])
    assert s2["p99_over_solo"] == pytest.approx((3.0, 1.0, 10.0))
    assert s2["tokens_over_nolevers"] == pytest.approx((0.99, 0.9, 1.0))
    assert s2["tokens_over_peer"] is None  # NaN left out, not a number made up
    # The bar: max(2 x solo, solo + a full batch's decode step).
    bar = max(0.06, 0.03 + b.decode_step_s)
    assert s4["p99_over_bar"] == pytest.approx((0.06 / bar,) * 3)
    assert 0 < b.decode_step_s < 0.03
