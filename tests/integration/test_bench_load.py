"""`fairgate bench load` against a real server on the simulator: the report's
numbers agree with what the server saw."""

from __future__ import annotations

import asyncio
import json
import sys
from collections import Counter
from pathlib import Path

from fairgate.bench.load import LoadConfig, run_load
from fairgate.bench.stats import Slo
from fairgate.bench.workload import Fixed, Lengths, Tenant, Trace

from scheduler.request import QueuedRequest
from service.app import App
from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, sim


class ServerTally:
    """Counts, per tenant, what the dispatcher admitted and the tokens it charged."""

    def __init__(self, app: App) -> None:
        model = app.models.resolve("")
        assert model is not None
        d = model.dispatcher
        self.admitted: Counter[str] = Counter()
        self.tokens: Counter[str] = Counter()
        admit, on_tokens = d.admit, d.on_output_tokens

        async def counting_admit(req: QueuedRequest) -> None:
            await admit(req)
            self.admitted[req.tenant_id] += 1

        def counting_tokens(req: QueuedRequest, n: int) -> None:
            self.tokens[req.tenant_id] += n
            on_tokens(req, n)

        d.admit = counting_admit  # type: ignore[method-assign]
        d.on_output_tokens = counting_tokens  # type: ignore[method-assign]


def _trace(tmp_path: Path) -> Trace:
    # Every 5th request asks for more output than the server allows (100).
    lines = [
        {"prompt_tokens": 20 + 7 * i, "output_tokens": 150 if i % 5 == 4 else 10 + 9 * i}
        for i in range(10)
    ]
    path = tmp_path / "trace.jsonl"
    path.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    return Trace.load(path)


async def test_closed_loop_report_matches_server(start_server: StartServer, tmp_path: Path) -> None:
    app = await start_server(sim_time_scale=0.02, max_output_tokens=100)
    tally = ServerTally(app)
    config = LoadConfig(
        target=app.address,
        lengths=Lengths(Fixed(1), Fixed(1), trace=_trace(tmp_path)),
        tenants=[Tenant("a", 3), Tenant("b", 1)],
        levels=[4, 16],
        duration_s=1.0,
        drain_s=20,
        slo=Slo(ttft_s=10.0, tpot_s=10.0),
        channels=2,
    )
    report = await run_load(config)

    assert [s.level for s in report.steps] == [4, 16]
    records = [r for step in report.records for r in step]
    for step, recs in zip(report.steps, report.records, strict=True):
        assert step.sent == len(recs) == step.ok + step.rejected > 0
        assert step.failed == step.unfinished == 0
        assert step.output_tokens == sum(r.max_tokens for r in recs if r.outcome == "ok")
        assert 0 < step.ttft.p50 <= step.ttft.p99 <= step.ttft.max
        assert step.e2e.p50 <= step.e2e.p99 <= step.e2e.max
        assert step.ttft.mean <= step.e2e.mean
        assert step.goodput_requests_per_s == step.requests_per_s  # generous SLO
        assert step.output_tokens_per_s > 0 and step.itl.count > 0
    # Exact output lengths (ignore_eos + max_tokens); rejections are the oversize ones.
    for r in records:
        if r.max_tokens > 100:
            assert (r.outcome, r.error) == ("rejected", "INVALID_ARGUMENT/INVALID_ARGUMENT")
        else:
            assert (r.outcome, r.output_tokens, r.finish_reason) == ("ok", r.max_tokens, "length")
    # What the server saw.
    ok_by_tenant = Counter(r.tenant for r in records if r.outcome == "ok")
    assert tally.admitted == ok_by_tenant
    tokens_by_tenant = Counter[str]()
    for step in report.steps:
        for name, service in step.tenants.items():
            tokens_by_tenant[name] += service.output_tokens
    assert tally.tokens == tokens_by_tenant
    assert sim(app).stats.finished == sum(ok_by_tenant.values())
    assert sum(s.rejected for s in report.steps) == sum(r.max_tokens > 100 for r in records)
    # Shares 3:1 over enough requests.
    assert ok_by_tenant["a"] > ok_by_tenant["b"] > 0
    await assert_no_leaks(app)


async def test_open_loop_poisson_is_bounded(start_server: StartServer) -> None:
    app = await start_server(sim_time_scale=0.02)
    config = LoadConfig(
        target=app.address,
        lengths=Lengths(Fixed(16), Fixed(8)),
        mode="open",
        levels=[40.0],
        cv=2.0,
        duration_s=1.0,
        requests=30,
        channels=1,
        slo=Slo(ttft_s=1e-6),  # nobody meets it
    )
    report = await run_load(config)
    (step,) = report.steps
    assert 0 < step.sent <= 30 and step.ok == step.sent
    assert step.output_tokens == 8 * step.sent
    assert step.goodput_requests_per_s == 0 and step.requests_per_s > 0
    assert sim(app).stats.finished == step.ok


async def test_drain_limit_cancels_and_server_cleans_up(start_server: StartServer) -> None:
    # Real-time simulator, long outputs: nothing finishes before the drain limit.
    app = await start_server(sim_time_scale=1.0)
    config = LoadConfig(
        target=app.address,
        lengths=Lengths(Fixed(16), Fixed(4000)),
        levels=[3],
        duration_s=0.2,
        drain_s=0.3,
        channels=1,
    )
    report = await run_load(config)
    (step,) = report.steps
    assert step.unfinished == step.sent == 3 and step.errors == {"DRAIN_LIMIT": 3}
    assert step.elapsed_s < 2
    await assert_no_leaks(app)


async def test_cli_writes_table_json_and_plots(server: App, tmp_path: Path) -> None:
    out_json, plots, results = tmp_path / "load.json", tmp_path / "plots", tmp_path / "results"
    proc = await asyncio.create_subprocess_exec(
        *(sys.executable, "-m", "fairgate.cli.main", "bench", "load", "-a", server.address),
        *("--concurrency", "2,4", "--duration", "0.5", "--requests", "40"),
        *("--prompt-tokens", "8-32", "--output-tokens", "4", "--tenant", "x:1"),
        *("--tenant", "y:1", "--slo-ttft-ms", "5000", "--json", str(out_json)),
        *("--percentiles", "50,90,99.9", "--result-dir", str(results)),
        *("--plot-dir", str(plots), "--no-progress", "--markdown"),
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    out, err = await asyncio.wait_for(proc.communicate(), timeout=60)
    assert proc.returncode == 0, err.decode()
    text = out.decode()
    assert "| conc" in text and "per-tenant service" in text
    assert "p50 | p90 | p99.9" in " ".join(text.split()), text
    assert max(len(line) for line in text.splitlines()) <= 80, text
    doc = json.loads(out_json.read_text())
    assert [s["level"] for s in doc["steps"]] == [2, 4]
    for s in doc["steps"]:
        assert s["sent"] == s["ok"] <= 40 and s["output_tokens"] == 4 * s["ok"]
        assert set(s["tenants"]) <= {"x", "y"}
        assert s["e2e"]["p99_ms"] is not None
        # vllm bench serve's names, with the percentiles asked for.
        assert s["completed"] == s["ok"] and s["total_output_tokens"] == s["output_tokens"]
        assert s["max_concurrency"] == s["level"] and s["request_rate"] == "inf"
        for metric in ("ttft", "tpot", "itl", "e2el"):
            for stat in ("mean", "median", "std", "p90", "p99.9"):
                assert s[f"{stat}_{metric}_ms"] is not None, (stat, metric)
        # Per-request records, in vLLM's arrays and in full.
        n = s["num_prompts"]
        assert len(s["input_lens"]) == len(s["ttfts"]) == len(s["itls"]) == n
        assert len(s["requests"]) == n and all(r["outcome"] == "ok" for r in s["requests"])
        assert s["output_lens"] == [4] * n
    series = doc["tenant_service"]["tokens"]
    assert sum(map(sum, series.values())) == sum(s["output_tokens"] for s in doc["steps"])
    for name in ("latency.png", "throughput.png", "tenants.png"):
        assert (plots / name).read_bytes().startswith(b"\x89PNG")
    per_step = sorted(results.iterdir())
    assert [p.name for p in per_step] == ["fairgate-c2.json", "fairgate-c4.json"]
    assert json.loads(per_step[0].read_text())["backend"] == "fairgate-grpc"
