"""`fairgate bench gateway` end to end at toy size: real sim-server workers in
child processes, a fairgate child in front, every target streams every request
to the end and the gateway's CPU and memory are read from /proc."""

from __future__ import annotations

import pytest
from fairgate.bench.gateway import Variant, needs_redis, requests_for, run_mode
from fairgate.bench.gateway_report import print_mode, print_scaling

from tests.helpers import cpu_within


async def test_every_target_streams_every_token(capsys: pytest.CaptureFixture[str]) -> None:
    cells = await run_mode(
        "zero",
        workers=2,
        levels=[1, 3],
        reps=1,
        tokens=8,
        waves=2,
        budget_tokens=0,
        variants=[Variant("fairgate"), Variant("per-event", {"stream_coalesce": "false"})],
        http=True,
        smg=None,
    )
    names = {cell.target for cell in cells}
    assert names == {"direct", "fairgate grpc", "fairgate http", "per-event grpc"}
    for cell in cells:
        assert len(cell.samples) == requests_for(cell.c, 8, 2, 0)
        assert cell.failures == 0, [s.error for s in cell.samples]
        assert cell.tokens == 8 * len(cell.samples)
        if cell.target != "direct":
            # CPU from /proc counts in clock ticks (10 ms): a tiny cell may read 0,
            # but never more than the cell's wall time on every core (+ the reads).
            assert cpu_within(cell.cpu_s, cell.wall_s + 0.05), (cell.cpu_s, cell.wall_s)
            assert cell.rss_bytes > 0
    print_mode("zero", 2, 8, 1, cells)
    table = capsys.readouterr().out
    assert "fairgate http" in table and "failed" in table


async def test_workers_variant_runs_on_a_local_redis(capsys: pytest.CaptureFixture[str]) -> None:
    """`--variant w2:workers=2`: a redis-server is started for it, two fairgate
    processes share the port, calls spread over several connections."""
    variants = [Variant("w1", {"store": "redis"}), Variant("w2", {"workers": "2"})]
    assert needs_redis(variants) and not needs_redis([Variant("fairgate")])
    cells = await run_mode(
        "zero",
        workers=1,
        levels=[4],
        reps=1,
        tokens=8,
        waves=2,
        budget_tokens=0,
        variants=variants,
        http=False,
        smg=None,
        grpc_channels=4,
    )
    assert {cell.target for cell in cells} == {"direct", "w1 grpc", "w2 grpc"}
    for cell in cells:
        assert cell.failures == 0, [s.error for s in cell.samples]
        assert cell.tokens == 8 * len(cell.samples) == 8 * requests_for(4, 8, 2, 0)
    print_scaling(cells, ["w1 grpc", "w2 grpc"])
    assert "w2 grpc" in capsys.readouterr().out
