"""`fairgate bench fleet` end to end at a tiny size: two sim-server workers behind
fairgate (locality, least_full, two replicas over Redis) and, where smg is
installed, smg cache_aware. Checks the plan, the report's structure and
invariants of accounting and caching — no timing oracles."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from fairgate.bench.fairness_report import write_json
from fairgate.bench.fleet import main
from fairgate.bench.fleet_scenarios import RAG_DOCS, SYS_PROMPT_TOKENS, FleetScenario
from fairgate.bench.gateway import find_smg

from tests.redis_server import find_redis_server

ONE_SHOT = ("sys", "rag", "light")


def test_plan_is_seeded_and_shares_prefixes() -> None:
    sc = FleetScenario(workers=2, seconds=20)
    plan = sc.plan(seed=3)
    assert plan == sc.plan(seed=3) and plan != sc.plan(seed=4)
    by = {t: [i for i in plan if i.tenant == t] for t in sc.weights}
    assert all(by.values())
    # One system prompt for every sys request; a few shared documents for rag.
    assert len({i.prompt_ids[:SYS_PROMPT_TOKENS] for i in by["sys"]}) == 1
    assert len({i.prompt_ids[:2000] for i in by["rag"]}) <= RAG_DOCS
    # Conversations are planned turn by turn; the light tenant's prompts share nothing.
    assert all(len(i.turns) >= 3 and not i.prompt_ids for i in by["chat"])
    assert len({i.prompt_ids[0] for i in by["light"]}) == len(by["light"])
    assert sc.heavy == ["sys", "chat", "rag"]
    # A tenant's plan does not depend on the offered load of the others.
    light = FleetScenario(workers=2, seconds=20, load=3.0).plan(seed=3)
    assert [i for i in light if i.tenant == "light"] == by["light"]


@pytest.mark.skipif(find_redis_server() is None, reason="needs a redis-server")
async def test_every_variant_replays_the_plan_and_accounts_for_every_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    variants = ["fg-locality", "fg-loc-2r", "smg-cache"]
    smg = find_smg("")
    out = await main(
        workers=2,
        seconds=6.0,
        time_scale=0.25,
        seed=2,
        load=0.05,
        variants=variants,
        repetitions=1,
        smg_binary="",
    )
    expected = set(variants) if smg else set(variants) - {"smg-cache"}
    assert set(out["variants"]) == expected
    assert out["bound_weighted_tokens"] > 0
    planned = {
        t: sum(1 for i in FleetScenario(2, 6.0, 0.05).plan(2) if i.tenant == t) for t in ONE_SHOT
    }
    for key, row in out["variants"].items():
        (rep,) = row["repetitions"]
        acc = rep["accounting"]
        assert acc["failed"] == 0, (key, acc)
        parts = acc["completed"] + acc["unfinished"] + acc["rejected"] + acc["failed"]
        assert acc["sent"] == parts == sum(t["sent"] for t in rep["tenants"].values())
        assert acc["completed"] > 0
        # Every one-shot request of the plan was sent, whatever the gateway.
        assert {t: rep["tenants"][t]["sent"] for t in ONE_SHOT} == planned, key
        assert 0 <= row["cached_fraction"] <= 1
        assert not math.isnan(row["light_solo_ttft_p99_s"])
    # The sys tenant's requests share a long system prompt: routed by locality,
    # the engines serve part of the prompts from their prefix caches.
    assert out["variants"]["fg-locality"]["cached_tokens"] > 0
    # Ratios to a variant that did not run are NaN, never a made-up number.
    assert math.isnan(out["variants"]["fg-locality"]["tokens_per_s_over_baseline"])
    if smg:
        assert out["variants"]["smg-cache"]["tokens_per_s_over_peer"] == 1.0
    assert set(out["solo"]) == {"fairgate", "fairgate x2"} | ({"smg"} if smg else set())
    printed = capsys.readouterr().out
    table = printed[printed.index("prefix-heavy mix") :].splitlines()
    assert len(table) >= 2 * len(expected) + 5
    assert all(len(line) <= 80 for line in table), table
    write_json(str(tmp_path / "r.json"), out)
    saved = json.loads((tmp_path / "r.json").read_text())
    assert saved["variants"]["fg-loc-2r"]["describe"].endswith("2 replicas over Redis")


def test_unknown_variant_is_refused_before_anything_starts() -> None:
    from fairgate.cli.main import typer_app
    from typer.testing import CliRunner

    result = CliRunner().invoke(typer_app, ["bench", "fleet", "--variants", "fg-locality,nope"])
    assert result.exit_code == 2
    assert "fg-leastfull" in result.output  # the valid keys are named
    result = CliRunner().invoke(typer_app, ["bench", "fleet", "--seeds", "1-x"])
    assert result.exit_code == 2
    assert "1,4,7" in result.output


@pytest.mark.skipif(find_redis_server() is None, reason="needs a redis-server")
async def test_the_lever_variants_serve_the_long_mix_through_kv_events(
    capsys: pytest.CaptureFixture[str],
) -> None:
    pytest.importorskip("zmq")
    pytest.importorskip("msgspec")
    variants = ["fg-locality", "fg-levers", "fg-levers-2r"]
    out = await main(
        workers=2,
        seconds=4.0,
        time_scale=0.25,
        seed=1,
        load=1.0,
        variants=variants,
        repetitions=1,
        smg_binary=None,
        mix="long",
        one_solo=True,
    )
    assert out["mix"] == "long" and set(out["variants"]) == set(variants)
    for key, row in out["variants"].items():
        acc = row["repetitions"][0]["accounting"]
        assert acc["failed"] == 0 and acc["completed"] > 0, (key, acc)
        assert set(row["repetitions"][0]["tenants"]) == {"code", "docs", "conv", "light"}
    assert out["variants"]["fg-levers-2r"]["describe"].endswith("KV events")
    # "No levers" is locality on as many replicas: fg-loc-2r (not run here) for two.
    assert out["variants"]["fg-levers"]["tokens_per_s_over_nolevers"] > 0
    assert math.isnan(out["variants"]["fg-levers-2r"]["tokens_per_s_over_nolevers"])
    # One solo run (through fg-locality) is every stack's reference.
    solos = {r["light_solo_ttft_p99_s"] for r in out["variants"].values()}
    assert len(solos) == 1 and not math.isnan(solos.pop())
    assert "long-prompt mix on 2 workers" in capsys.readouterr().out
