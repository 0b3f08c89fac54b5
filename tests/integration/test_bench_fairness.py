"""`fairgate bench fairness` end to end, briefly: a mixed-shape scenario against
real child servers (fairgate on the simulator; two replicas on Redis in front
of one sim-server). Checks the report's structure and that every policy was
sent the identical trace — no timing oracles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fairgate.bench.fairness import SOLO, Policy, main
from fairgate.bench.fairness_report import write_json
from fairgate.bench.fairness_scenarios import SHAPES, Scenario, scenarios

from tests.redis_server import find_redis_server

RUN_KEYS = {
    "replicas",
    "requests",
    "trace_digest",
    "jain",
    "gap_over_bound",
    "all_backlogged_s",
    "output_tokens_per_s",
    "throughput_over_fcfs",
    "weighted_service_per_s",
    "service_over_fcfs",
    "tenants",
}
TENANT_KEYS = {
    "sent",
    "rejected",
    "failed",
    "output_tokens",
    "weighted_service",
    "ttft_p50_s",
    "ttft_p99_s",
    "queue_wait_p99_s",
    "queue_wait_mean_s",
}


def test_trace_is_seeded_and_mixes_the_shapes() -> None:
    sc = scenarios(20)["e"]
    trace = sc.trace(seed=3)
    assert trace == sc.trace(seed=3)
    assert trace != sc.trace(seed=4)
    by_tenant = {t: [a for a in trace if a.tenant == t] for t in sc.tenants}
    assert all(by_tenant.values())
    assert min(a.prompt_tokens for a in by_tenant["lp1"]) >= 1500
    assert max(a.max_tokens for a in by_tenant["lp1"]) <= 32
    assert min(a.max_tokens for a in by_tenant["lo1"]) >= 400
    chat = [(a.prompt_tokens, a.max_tokens) for a in by_tenant["chat4"]]
    assert len(set(chat)) > len(chat) // 2  # lognormal, not one fixed size
    # A tenant's requests do not depend on the others': f's victim draws alone.
    f = scenarios(20)["f"]
    alone = Scenario("x", "victim alone", {"victim": f.tenants["victim"]})
    assert [a for a in f.trace(3) if a.tenant == "victim"] == alone.trace(3)
    assert set(SHAPES) == {"fixed", "long_prompt", "long_output", "chat", "rag", "conversation"}


@pytest.mark.parametrize(
    "spec", ["lifo", "fcfs@0.1", "vtc@x", "vtc@1", "vtc@-0.1", "vtc:sometimes", "fcfs:reserve"]
)
def test_bad_policy_spec_is_refused(spec: str) -> None:
    with pytest.raises(ValueError):
        Policy.parse(spec)


def test_policy_spec_names_the_isolation_and_the_fraction() -> None:
    p = Policy.parse("vtc:reserve@0.0625")
    assert p.label == "vtc:reserve@0.0625"
    assert p.settings() == {
        "policy": "vtc",
        "fair_reserve_fraction": 0.0625,
        "fair_lend_fraction": 0.0625,
        "fair_isolation": "reserve",
    }
    assert Policy.parse("vtc").settings() == {"policy": "vtc"}
    # The baselines run as the engine alone: nothing kept, nothing lent.
    off = {"policy": "fcfs", "fair_reserve_fraction": 0, "fair_lend_fraction": 0}
    assert Policy.parse("fcfs").settings() == off


async def test_mixed_scenario_replays_one_trace_for_every_policy(tmp_path: Path) -> None:
    policies = (Policy("fcfs"), Policy("vtc"), Policy.parse("vtc@0.0625"))
    out = await main("f", seconds=3.0, time_scale=0.5, seed=2, policies=policies)
    rep = out["f"]
    assert set(rep["runs"]) == {"fcfs", "vtc", "vtc@0.0625", SOLO}
    assert rep["bound_weighted_tokens"] > 0
    for run in rep["runs"].values():
        assert set(run) >= RUN_KEYS, run
        for row in run["tenants"].values():
            assert set(row) == TENANT_KEYS
        assert run["requests"] == sum(row["sent"] for row in run["tenants"].values())
    runs = [rep["runs"][p.label] for p in policies]
    assert len({r["trace_digest"] for r in runs}) == 1
    assert len({r["requests"] for r in runs}) == 1 and runs[0]["requests"] > 0
    assert rep["runs"]["fcfs"]["throughput_over_fcfs"] == 1.0
    assert "victim_p99_over_solo" in rep["runs"]["vtc"]
    assert set(rep["runs"][SOLO]["tenants"]) == {"victim"}
    write_json(str(tmp_path / "r.json"), out)
    assert json.loads((tmp_path / "r.json").read_text())["f"]["runs"]["vtc"]["replicas"] == 1


@pytest.mark.skipif(find_redis_server() is None, reason="needs a redis-server")
async def test_two_replicas_share_redis_and_one_engine() -> None:
    out = await main(
        "e",
        seconds=3.0,
        time_scale=0.5,
        seed=2,
        policies=(Policy("fcfs"), Policy("vtc")),
        replicas=2,
    )
    runs = out["e"]["runs"]
    assert runs["vtc"]["replicas"] == 2 and runs["fcfs"]["replicas"] == 1
    assert runs["vtc"]["trace_digest"] == runs["fcfs"]["trace_digest"]
    served = sum(row["output_tokens"] for row in runs["vtc"]["tenants"].values())
    assert served > 0
    assert not math.isnan(runs["vtc"]["gap_over_bound"])


async def test_virtual_replay_repeats_exactly_and_runs_the_same_rules() -> None:
    # --virtual: the same trace through the policy, Dispatcher and SimCore on
    # simulated time. Twice the same report (no wall clock anywhere); FCFS
    # starves the victim, VTC (preempt: the simulator's engine can) does not.
    policies = (Policy("fcfs"), Policy("vtc"), Policy.parse("vtc:reserve"))
    one = await main("f", seconds=15.0, time_scale=1.0, seed=3, policies=policies, virtual=True)
    two = await main("f", seconds=15.0, time_scale=1.0, seed=3, policies=policies, virtual=True)
    assert one == two
    runs = one["f"]["runs"]
    assert set(runs) == {"fcfs", "vtc", "vtc:reserve", SOLO}
    assert len({runs[p.label]["trace_digest"] for p in policies}) == 1
    assert runs["fcfs"]["victim_p99_over_solo"] > 10 * runs["vtc"]["victim_p99_over_solo"]
    solo_p99 = runs[SOLO]["victim_ttft_p99_s"]
    for p in policies:
        r = runs[p.label]
        assert r["victim_p99_minus_solo_s"] == pytest.approx(r["victim_ttft_p99_s"] - solo_p99)
    assert runs["fcfs"]["victim_p99_minus_solo_s"] > runs["vtc"]["victim_p99_minus_solo_s"]
    assert runs["vtc"]["gap_over_bound"] < runs["fcfs"]["gap_over_bound"]
    with pytest.raises(ValueError, match="one replica"):
        await main(
            "f", seconds=1.0, time_scale=1.0, seed=3, policies=policies, replicas=2, virtual=True
        )


def test_many_traces_are_summarized_by_median_and_range() -> None:
    from fairgate.bench.fairness_report import summarize
    from fairgate.bench.seeds import seed_list

    assert seed_list("1-3,7") == [1, 2, 3, 7]
    for bad in ("", "a", "3-", "1-x"):
        with pytest.raises(ValueError):
            seed_list(bad)

    def rep(gap: float, jain: float) -> dict[str, object]:
        return {"f": {"runs": {"vtc": {"gap_over_bound": gap, "jain": jain}}}}

    out = summarize({1: rep(0.2, math.nan), 2: rep(0.1, 0.9), 3: rep(0.4, 1.0)})
    gap = out["f"]["vtc"]["gap_over_bound"]
    assert (gap["median"], gap["min"], gap["max"], gap["n"]) == (0.2, 0.1, 0.4, 3)
    assert out["f"]["vtc"]["jain"]["n"] == 2  # NaN (never all backlogged) left out
