"""`fairgate bench load --protocol http` and `bench http-overhead` against a real
server: the report agrees with what the server saw."""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from fairgate.bench.http_overhead import measure
from fairgate.bench.load import LoadConfig, run_load
from fairgate.bench.workload import Fixed, Lengths, Tenant, Trace

from tests.conftest import StartServer
from tests.helpers import assert_no_leaks, cpu_within, sim


async def test_http_closed_loop_report_matches_server(
    start_server: StartServer, tmp_path: Path
) -> None:
    app = await start_server(sim_time_scale=0.02, max_output_tokens=100, http_listen="127.0.0.1:0")
    assert app.http is not None
    path = tmp_path / "trace.jsonl"
    # Every 4th request asks for more output than the server allows (100).
    path.write_text(
        "".join(
            f'{{"prompt_tokens": {10 + i}, "output_tokens": {150 if i % 4 == 3 else 5 + i}}}\n'
            for i in range(8)
        )
    )
    config = LoadConfig(
        target=app.http.url,
        lengths=Lengths(Fixed(1), Fixed(1), trace=Trace.load(path)),
        tenants=[Tenant("a", 1), Tenant("b", 1)],
        levels=[4],
        duration_s=None,
        requests=24,
        drain_s=20,
        protocol="http",
    )
    report = await run_load(config)
    (step,) = report.steps
    (records,) = report.records
    assert step.sent == 24 == step.ok + step.rejected and step.failed == step.unfinished == 0
    for r in records:
        if r.max_tokens > 100:
            assert (r.outcome, r.error) == ("rejected", "INVALID_ARGUMENT/INVALID_ARGUMENT")
        else:
            assert (r.outcome, r.output_tokens, r.finish_reason) == ("ok", r.max_tokens, "length")
            assert r.ttft_s is not None and r.e2e_s is not None and r.ttft_s <= r.e2e_s
    model = app.models.resolve("")
    assert model is not None
    assert model.dispatcher.admitted_total == step.ok == sim(app).stats.finished
    assert step.output_tokens == sum(r.max_tokens for r in records if r.outcome == "ok")
    ok_by_tenant = Counter(r.tenant for r in records if r.outcome == "ok")
    assert {name: s.ok for name, s in step.tenants.items()} == dict(ok_by_tenant)
    await assert_no_leaks(app)


async def test_http_overhead_bench_counts_every_token() -> None:
    start_s = time.monotonic()
    grpc_t, http_t = await measure(requests=6, concurrency=3, tokens=16, rounds=1)
    wall_s = time.monotonic() - start_s
    assert grpc_t.tokens == http_t.tokens == 6 * 16
    # /proc counts CPU in clock ticks (10 ms): a run this small may read 0, but
    # the server's CPU over the rounds is within the whole run's wall time.
    for t in (grpc_t, http_t):
        assert cpu_within(t.cpu_s, wall_s), (t.cpu_s, wall_s)
