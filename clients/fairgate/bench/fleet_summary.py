"""Issue #33's live runs as one table: `python -m fairgate.bench.fleet_summary
r1.json r2.json ...` reads `bench fleet --json` reports (one per mix, workers,
time scale and seed) and prints, per (mix, workers, time scale, variant), the
median (min-max) over the seeds of the light tenant's TTFT p50 and p99, its
queue wait's p99 (the part of the TTFT spent in fairgate's queue), p99 ÷
its solo run, p99 ÷ the bar, tokens/s ÷ fairgate without the levers and ÷ smg
cache_aware (each ratio taken within one report, then the median), and the load
averages the runs started and ended at; Jain over service and over queue wait.
A report may hold one run per seed (`bench fleet --seeds`).

The bar is #33's: on two workers or more max(2 x solo p99, solo p99 + one decode
step of a full batch), on one solo p99 + one prefill chunk, the steps from the
workers' cost model at their size.
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fairgate.bench.fairness import MODEL
from fairgate.bench.fleet_scenarios import KV_CAPACITY_TOKENS, MAX_RUNNING_REQUESTS
from fairgate.bench.stagger_report import Bars, bar_s
from service.engines.simulator.hardware import preset

SPREAD = (
    "light_p50_s",
    "light_p99_s",
    "light_wait_p99_s",
    "heavy_ttft_p50_s",
    "p99_over_solo",
    "p99_over_bar",
    "tokens_per_s",
    "tokens_over_nolevers",
    "tokens_over_peer",
    "jain",
    "jain_wait",
)


def live_bars() -> Bars:
    """The bar's steps on `bench fleet`'s workers (16 slots, 16 k KV tokens)."""
    cost = preset(model=MODEL)
    return Bars(cost.step_s(0, MAX_RUNNING_REQUESTS, KV_CAPACITY_TOKENS), cost.step_s(2048, 0, 0))


def rows(reports: Sequence[dict[str, Any]], bars: Bars) -> list[dict[str, Any]]:
    """One row per report and variant: the figures of that run."""
    out = []
    for rep in reports:
        for key, v in rep["variants"].items():
            solo = v["light_solo_ttft_p99_s"]
            out.append(
                {
                    "mix": rep.get("mix", "prefix"),
                    "workers": rep["workers"],
                    "time_scale": rep["time_scale"],
                    "seed": rep["seed"],
                    "variant": key,
                    "light_p50_s": v["light_ttft_p50_s"],
                    "light_p99_s": v["light_ttft_p99_s"],
                    # fairgate's queue wait (older reports: none recorded).
                    "light_wait_p99_s": v.get("light_queue_wait_p99_s", math.nan),
                    # The other tenants' TTFT p50 (older reports: none recorded).
                    "heavy_ttft_p50_s": v.get("heavy_ttft_p50_s", math.nan),
                    "p99_over_solo": v["light_p99_over_solo"],
                    "p99_over_bar": v["light_ttft_p99_s"] / bar_s(solo, rep["workers"], bars),
                    "tokens_per_s": v["tokens_per_s"],
                    "tokens_over_nolevers": v["tokens_per_s_over_nolevers"],
                    "tokens_over_peer": v["tokens_per_s_over_peer"],
                    "jain": v.get("jain", math.nan),
                    # Older reports: none recorded.
                    "jain_wait": v.get("jain_wait", math.nan),
                    "load": (rep.get("machine_before", ""), rep.get("machine_after", "")),
                }
            )
    return out


def spread(xs: Sequence[float]) -> tuple[float, float, float] | None:
    """Median, min and max, NaN left out; None for no value."""
    ok = [x for x in xs if not math.isnan(x)]
    return (statistics.median(ok), min(ok), max(ok)) if ok else None


def summarize(rs: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (mix, workers, time scale, variant), in the rows' order."""
    groups: dict[tuple[str, int, float, str], list[dict[str, Any]]] = {}
    for r in rs:
        groups.setdefault((r["mix"], r["workers"], r["time_scale"], r["variant"]), []).append(r)
    out = []
    for (mix, workers, ts, variant), g in groups.items():
        s: dict[str, Any] = {"mix": mix, "workers": workers, "time_scale": ts}
        s |= {"variant": variant, "seeds": sorted(r["seed"] for r in g)}
        s |= {k: spread([float(r[k]) for r in g]) for k in SPREAD}
        s["loads"] = [r["load"] for r in g]
        out.append(s)
    return out


def _fmt(v: tuple[float, float, float] | None, spec: str, scale: float = 1.0) -> str:
    if v is None:
        return "-"
    a, lo, hi = (x * scale for x in v)
    return f"{a:{spec}} ({lo:{spec}}-{hi:{spec}})"


def print_markdown(summary: Sequence[dict[str, Any]]) -> None:
    print(
        "| mix | workers | time scale | variant | light p50 ms | light p99 ms "
        "| queue wait p99 ms | p99 ÷ solo | p99 ÷ bar | tokens/s | ÷ no levers "
        "| ÷ smg cache_aware | Jain | Jain wait | others' TTFT p50 ms |"
    )
    print("|---|---:|---:|---|---|---|---|---|---|---|---|---|---|---|---|")
    for s in summary:
        print(
            f"| {s['mix']} | {s['workers']} | {s['time_scale']:g} | {s['variant']} "
            f"| {_fmt(s['light_p50_s'], '.0f', 1e3)} | {_fmt(s['light_p99_s'], '.0f', 1e3)} "
            f"| {_fmt(s['light_wait_p99_s'], '.0f', 1e3)} "
            f"| {_fmt(s['p99_over_solo'], '.1f')} | {_fmt(s['p99_over_bar'], '.2f')} "
            f"| {_fmt(s['tokens_per_s'], '.0f')} | {_fmt(s['tokens_over_nolevers'], '.3f')} "
            f"| {_fmt(s['tokens_over_peer'], '.3f')} | {_fmt(s['jain'], '.3f')} "
            f"| {_fmt(s['jain_wait'], '.3f')} | {_fmt(s['heavy_ttft_p50_s'], '.0f', 1e3)} |"
        )


def reports_in(doc: dict[str, Any]) -> list[dict[str, Any]]:
    """A `bench fleet --json` file: one report, or one per seed (`--seeds`)."""
    return list(doc["seeds"].values()) if "seeds" in doc else [doc]


def print_summary(reports: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    b = live_bars()
    summary = summarize(rows(reports, b))
    print(
        f"bar: max(2 x solo p99, solo p99 + {b.decode_step_s * 1e3:.1f} ms, a decode step "
        f"of {MAX_RUNNING_REQUESTS} on {KV_CAPACITY_TOKENS} KV tokens); median (min-max)"
    )
    print_markdown(summary)
    return summary


def main(paths: Sequence[str]) -> list[dict[str, Any]]:
    return print_summary([r for p in paths for r in reports_in(json.loads(Path(p).read_text()))])


if __name__ == "__main__":
    main(sys.argv[1:])
