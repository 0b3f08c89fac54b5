"""`fairgate bench gateway`'s arithmetic: variants, request counts, summaries,
the capacity rule, and the /proc readings of a process tree."""

from __future__ import annotations

import itertools
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from fairgate.bench.common import rotated, source_checkout
from fairgate.bench.gateway import Variant, parse_variant, requests_for
from fairgate.bench.gateway_clients import Sample, _Gaps
from fairgate.bench.gateway_report import (
    Cell,
    cpu_ratios,
    print_capacity,
    print_cpu_ratios,
    summarize,
)
from fairgate.bench.procstat import descendants, tree_cpu_s, tree_rss_bytes


def test_variants_parse_label_and_settings() -> None:
    assert parse_variant("fairgate") == Variant("fairgate", {})
    assert parse_variant("old:stream_coalesce=false,event_loop=asyncio") == Variant(
        "old", {"stream_coalesce": "false", "event_loop": "asyncio"}
    )
    for bad in (":x=1", "v:novalue", ""):
        with pytest.raises(ValueError, match="bad variant"):
            parse_variant(bad)


def _checkout(root: Path, marker: str) -> Path:
    for package in ("service", "scheduler", "clients/fairgate"):
        (root / package).mkdir(parents=True)
        (root / package / "__init__.py").write_text(f"MARKER = {marker!r}\n")
    return root


def test_a_variant_can_run_from_another_checkout(tmp_path: Path) -> None:
    other = _checkout(tmp_path / "before", "before")
    v = parse_variant(f"before:src={other},event_loop=asyncio")
    assert v == Variant("before", {"event_loop": "asyncio"}, str(other))
    # The child imports the three packages from that checkout, not the installed ones.
    code = "import service as s, scheduler as d, fairgate as f; print(s.MARKER, d.MARKER, f.MARKER)"
    env, cwd = source_checkout(v.src)
    assert cwd == str(other)
    out = subprocess.run(
        [sys.executable, "-c", code],
        env={**os.environ, **env},
        cwd=cwd,
        capture_output=True,
        text=True,
        check=True,
    )
    assert out.stdout.split() == ["before"] * 3
    assert source_checkout("") == ({}, None)


def test_a_source_that_is_not_a_checkout_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="not a fairgate checkout"):
        parse_variant(f"x:src={tmp_path}")


def test_requests_are_whole_waves_covering_the_budget() -> None:
    assert requests_for(c=64, tokens=128, waves=2, budget_tokens=0) == 128
    assert requests_for(c=1, tokens=100, waves=2, budget_tokens=0) == 8  # at least 8
    assert requests_for(c=1, tokens=100, waves=2, budget_tokens=1050) == 11
    assert requests_for(c=64, tokens=100, waves=1, budget_tokens=10_000) == 128


def _cell(target: str, wall_s: float, ttfts: list[float], cpu_s: float, c: int = 4) -> Cell:
    samples = [Sample(t, 10, True) for t in ttfts]
    return Cell(target, c, wall_s, samples, cpu_s, 100 * 2**20)


def test_summary_ratios_pair_cells_of_the_same_repetition() -> None:
    direct = [_cell("direct", 1.0, [0.010] * 4, 0.0), _cell("direct", 2.0, [0.010] * 4, 0.0)]
    gw = [_cell("gw", 2.0, [0.012] * 4, 0.2), _cell("gw", 2.0, [0.020] * 4, 0.2)]
    s = summarize(gw, direct)
    # Repetition ratios 0.5 and 1.0 (paired), not the ratio of the medians.
    assert s.ratio == pytest.approx(0.75)
    assert s.cpu_us_per_token == pytest.approx(0.4 / 80 * 1e6)
    assert s.cores == pytest.approx(0.1)
    assert (s.failures, s.requests, s.rss_mb) == (0, 8, 100)
    assert s.ttft_p50_s == pytest.approx(0.012) and s.ttft_p99_s == pytest.approx(0.020)


def test_cpu_ratios_pair_each_repetition_with_the_reference() -> None:
    # Two repetitions; 4 samples of 10 tokens per cell: 40 tokens each.
    cells = [
        _cell("fg grpc", 1.0, [0.01] * 4, 0.012),  # 300 µs/token
        _cell("smg", 1.0, [0.01] * 4, 0.004),  # 100
        _cell("smg", 1.0, [0.01] * 4, 0.002),  # 50: the machine was quieter
        _cell("fg grpc", 1.0, [0.01] * 4, 0.008),  # 200
    ]
    # Paired by repetition (3.0 and 4.0), not the ratio of the sums (20/6 = 3.33).
    assert cpu_ratios(cells, "fg grpc", "smg", 4) == pytest.approx([3.0, 4.0])


def test_cpu_ratios_are_printed_only_beside_the_reference(
    capsys: pytest.CaptureFixture[str],
) -> None:
    cells = [_cell("fg grpc", 1.0, [0.01] * 4, 0.012), _cell("smg", 1.0, [0.01] * 4, 0.004)]
    print_cpu_ratios(cells, ["fg grpc"], "smg")
    assert capsys.readouterr().out.splitlines()[-1] == "    4 | fg grpc 3.00"
    print_cpu_ratios(cells[:1], ["fg grpc"], "smg")  # --no-smg: nothing to pair with
    assert capsys.readouterr().out == ""


def test_inter_message_gaps_are_pooled_over_requests() -> None:
    cell = _cell("gw", 1.0, [0.01, 0.01], 0.1)
    cell.samples[0].itl_s = [0.010] * 100
    cell.samples[1].itl_s = [0.020] * 98 + [0.030, 0.040]
    failed = Sample(5.0, 0, False, "UNAVAILABLE", itl_s=[9.0] * 50)  # left out
    cell.samples.append(failed)
    s = summarize([cell], [_cell("direct", 1.0, [0.01], 0.0)])
    assert s.itl_p50_s == pytest.approx(0.010)
    assert s.itl_p99_s == pytest.approx(0.020)  # rank 198 of 200


def test_gaps_start_at_the_second_message() -> None:
    gaps = _Gaps()
    times = [gaps.message() for _ in range(4)]
    assert len(gaps.gaps_s) == 3
    assert gaps.gaps_s == pytest.approx([b - a for a, b in itertools.pairwise(times)])


def test_failed_requests_count_and_leave_the_ttft_out() -> None:
    cell = _cell("gw", 1.0, [0.01, 0.01], 0.1)
    cell.samples.append(Sample(5.0, 0, False, "UNAVAILABLE"))
    s = summarize([cell], [_cell("direct", 1.0, [0.01], 0.0)])
    assert s.failures == 1 and s.requests == 3 and s.ttft_p99_s == pytest.approx(0.01)


def test_gateway_timings_split_the_ttft_into_queue_and_before_the_handler(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Client TTFT 1.0 s of which fairgate measured 0.03 s from its handler's start,
    # 0.002 s of it in its queue: 0.97 s passed before the handler ran.
    gw = Cell("fg grpc", 64, 1.0, [Sample(1.0, 10, True, "", 0.03, 0.002)] * 3, 0.5, 0.0)
    gw.samples.append(Sample(5.0, 0, False, "UNAVAILABLE"))  # left out
    direct = [_cell("direct", 1.0, [0.1], 0.0, c=64)]
    s = summarize([gw], direct)
    assert s.queue_wait_p99_s == pytest.approx(0.002)
    assert s.unseen_p50_s == pytest.approx(0.97)
    d = summarize(direct, direct)  # other clients do not say: unknown, not zero
    assert math.isnan(d.queue_wait_p99_s) and math.isnan(d.unseen_p50_s)
    print_capacity([(1, [*direct, gw])], 5.0, 0.95, final=True)
    out = capsys.readouterr().out
    assert "| queue p99 | unseen p50" in out
    assert "|      +2.0 |     +970.0" in out


def test_capacity_stops_at_the_first_worker_count_over_the_bounds(
    capsys: pytest.CaptureFixture[str],
) -> None:
    def row(n: int, added_s: float, gw_wall_s: float) -> tuple[int, list[Cell]]:
        return n, [
            _cell("direct", 1.0, [0.1], 0.0, c=64 * n),
            _cell("fg grpc", gw_wall_s, [0.1 + added_s], 0.5 * gw_wall_s, c=64 * n),
        ]

    rows = [row(1, 0.001, 1.0), row(2, 0.002, 1.0)]
    assert print_capacity(rows, 5.0, 0.95, final=False)
    rows.append(row(3, 0.050, 1.0))  # +50 ms TTFT p99: over the bound
    assert not print_capacity(rows, 5.0, 0.95, final=True)
    out = capsys.readouterr().out
    assert "simulated 4090s per fairgate core: 4.0 (2 worker(s) passed using 0.50 core)" in out
    assert "|  per core | pass" in out
    assert "|       6.0 |   no" in out  # 3 workers on 0.5 core, over the TTFT bound
    slow = [row(1, 0.0, 1.2)]  # 0.83x direct
    assert not print_capacity(slow, 5.0, 0.95, final=False)


# A child that spends 0.2 s of CPU, says so, then idles.
_BURN = """
import time
while time.process_time() < 0.2:
    pass
print("burnt", flush=True)
time.sleep(30)
"""


def test_process_tree_readings_include_children() -> None:
    tick_s = 1 / os.sysconf("SC_CLK_TCK")
    child = subprocess.Popen([sys.executable, "-c", _BURN], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None and child.stdout.readline() == "burnt\n"
        assert child.pid in descendants(os.getpid())
        assert tree_rss_bytes(os.getpid()) > tree_rss_bytes(child.pid) > 0
        child_cpu_s = tree_cpu_s(child.pid)
        assert child_cpu_s >= 0.2 - 2 * tick_s  # what it burnt, to the clock tick
        own_cpu_s = time.process_time()
        # This process's tree: its own CPU and its child's (and any other child's).
        assert tree_cpu_s(os.getpid()) >= own_cpu_s + child_cpu_s - 2 * tick_s
    finally:
        child.kill()
        child.wait()
    assert math.isnan(tree_cpu_s(child.pid))  # gone


def test_each_repetition_starts_one_target_later() -> None:
    order = [rotated(["direct", "fairgate", "smg"], rep) for rep in range(4)]
    assert order == [
        ["direct", "fairgate", "smg"],
        ["fairgate", "smg", "direct"],
        ["smg", "direct", "fairgate"],
        ["direct", "fairgate", "smg"],
    ]
