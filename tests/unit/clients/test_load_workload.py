"""Load-generator building blocks: length specs, traces, arrivals, tenants, statistics."""

from __future__ import annotations

import math
import random
import statistics
from pathlib import Path

import pytest
from fairgate.bench.stats import Latency, RequestRecord, Slo, build_step, jain_index
from fairgate.bench.workload import (
    Arrivals,
    Fixed,
    Lengths,
    Trace,
    Uniform,
    parse_length,
    parse_tenant,
    prompt_ids,
)


def test_parse_length() -> None:
    assert parse_length("256") == Fixed(256)
    assert parse_length("10-20") == Uniform(10, 20)
    for bad in ("0", "20-10", "x", "1-", "-5"):
        with pytest.raises(ValueError):
            parse_length(bad)
    rng = random.Random(1)
    assert all(10 <= Uniform(10, 20).sample(rng) <= 20 for _ in range(200))


def test_trace_replays_in_order_and_rejects_bad_lines(tmp_path: Path) -> None:
    p = tmp_path / "t.jsonl"
    p.write_text(
        '{"prompt_tokens": 5, "output_tokens": 7}\n\n{"prompt_tokens": 9, "output_tokens": 1}\n'
    )
    lengths = Lengths(Fixed(1), Fixed(1), trace=Trace.load(p))
    draw = lengths.sampler(0)
    assert [draw() for _ in range(3)] == [(5, 7), (9, 1), (5, 7)]
    assert (lengths.mean_prompt, lengths.mean_output) == (7, 4)
    p.write_text('{"prompt_tokens": 5}\n')
    with pytest.raises(ValueError, match=r"t\.jsonl:1"):
        Trace.load(p)


@pytest.mark.parametrize("cv", [1.0, 2.0, 0.5])
def test_arrivals_rate_and_burstiness(cv: float) -> None:
    gaps = Arrivals(10.0, cv).gaps_s(random.Random(3), 40_000)
    mean = statistics.fmean(gaps)
    assert mean == pytest.approx(0.1, rel=0.05)
    assert statistics.pstdev(gaps) / mean == pytest.approx(cv, rel=0.07)
    times = Arrivals(10.0, cv).times_s(random.Random(3), 5.0, limit=20)
    assert len(times) == 20 and times == sorted(times) and times[-1] < 5.0


def test_tenant_spec(monkeypatch: pytest.MonkeyPatch) -> None:
    t = parse_tenant("team-a:3")
    assert (t.name, t.share, t.api_key) == ("team-a", 3.0, None)
    assert t.metadata() == (("x-fairgate-tenant", "team-a"),)
    monkeypatch.setenv("KEY_B", "s3cret")
    t = parse_tenant("b:1:env:KEY_B")
    assert ("authorization", "Bearer s3cret") in t.metadata()
    for bad in (":1", "a:0", "a:x", "a:1:env:UNSET_VAR_FOR_TEST"):
        with pytest.raises(ValueError):
            parse_tenant(bad)


def test_prompt_ids_exact_length_inside_vocab() -> None:
    ids = prompt_ids(300, random.Random(0), vocab_size=1000)
    assert len(ids) == 300 and all(0 < i < 1000 for i in ids)


def test_latency_and_jain() -> None:
    lat = Latency.of([0.1, 0.2, 0.3, 0.4])
    assert (lat.mean, lat.p50, lat.p99, lat.max) == pytest.approx((0.25, 0.2, 0.4, 0.4))
    assert math.isnan(Latency.of([]).p99)
    assert jain_index([1, 1, 1]) == pytest.approx(1.0)
    assert jain_index([1, 0, 0, 0]) == pytest.approx(0.25)


def test_build_step_counts_and_slo() -> None:
    def ok(tenant: str, ttft: float, e2e: float, out: int) -> RequestRecord:
        return RequestRecord(tenant, 10, out, 0.0, ttft, e2e, out, outcome="ok")

    records = [
        ok("a", 0.1, 1.1, 11),  # TPOT 0.1
        ok("a", 0.5, 1.5, 11),  # TTFT over the SLO
        ok("b", 0.1, 3.1, 11),  # TPOT 0.3, over the SLO
        RequestRecord("b", 10, 5, 0.0, outcome="rejected", error="RESOURCE_EXHAUSTED/QUOTA"),
        RequestRecord("b", 10, 5, 0.0, outcome="failed", error="DEADLINE_EXCEEDED"),
    ]
    step = build_step("closed", 4, records, 2.0, Slo(ttft_s=0.2, tpot_s=0.2), {"a": 2, "b": 1})
    assert (step.sent, step.ok, step.rejected, step.failed) == (5, 3, 1, 1)
    assert step.errors == {"DEADLINE_EXCEEDED": 1, "RESOURCE_EXHAUSTED/QUOTA": 1}
    assert step.output_tokens_per_s == pytest.approx(33 / 2)
    assert step.requests_per_s == pytest.approx(1.5)
    assert step.goodput_requests_per_s == pytest.approx(0.5)
    assert step.tpot.max == pytest.approx(0.3)
    assert step.failure_rate == pytest.approx(0.2)
    # Service normalized by share: a 22/2 = 11, b 11/1 = 11 → perfectly fair.
    assert step.jain_index == pytest.approx(1.0)
    assert step.to_dict()["ttft"]["p50_ms"] == pytest.approx(100.0)


def test_tokens_are_counted_when_they_arrive() -> None:
    from fairgate.bench.load import LoadConfig, LoadRunner
    from fairgate.bench.workload import Fixed, Lengths

    runner = LoadRunner(LoadConfig("127.0.0.1:1", Lengths(Fixed(1), Fixed(8)), requests=1))
    done = RequestRecord("a", 1, 8, 0.0, output_tokens=8, outcome="ok")
    # Deltas at t = 1, 2, 3 s starting at token 0, 3, 5; 8 tokens in all.
    runner._count_tokens(done, [(1.0, 0), (2.0, 3), (3.0, 5)])
    cut = RequestRecord("b", 1, 8, 0.0, outcome="failed")  # no final count
    runner._count_tokens(cut, [(4.0, 0), (5.0, 2)])
    events = [(e.t_s, e.tenant, e.tokens) for e in runner.report.token_events]
    assert events == [(1.0, "a", 3), (2.0, "a", 2), (3.0, "a", 3), (4.0, "b", 2), (5.0, "b", 1)]


def test_percentiles_and_burstiness() -> None:
    from fairgate.bench.load import LoadConfig
    from fairgate.bench.workload import Fixed, Lengths

    lat = Latency.of([0.1, 0.2, 0.3, 0.4], (50, 90, 99.9))
    assert set(lat.quantiles) == {"p50", "p90", "p99.9"}
    assert lat.vllm_fields("ttft")["std_ttft_ms"] == pytest.approx(111.803, abs=1e-3)
    cfg = LoadConfig("x", Lengths(Fixed(1), Fixed(1)), mode="open", levels=[1], cv=2.0)
    assert cfg.burstiness == pytest.approx(0.25)
    with pytest.raises(ValueError):
        LoadConfig("x", Lengths(Fixed(1), Fixed(1)), percentiles=[0])
