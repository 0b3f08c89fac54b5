"""Printing and saving `fairgate bench fairness` reports (JSON-able dicts)."""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path
from typing import Any


def _fmt(x: Any, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def print_report(key: str, rep: dict[str, Any]) -> None:
    print(f"\n({key}) {rep['title']}  [weights {rep['weights']}, shapes {rep['shapes']}]")
    print(f"    VTC bound {rep['bound_weighted_tokens']:.0f} weighted tokens")
    print(
        f"{'policy':>14} | {'repl':>4} | {'Jain':>5} | {'all-bl s':>8} | {'gap/bound':>9} | "
        f"{'tput/FCFS':>9} | {'tok/FCFS':>8} | {'wsvc/FCFS':>9} | {'victim p50 s':>12} | "
        f"{'p99 s':>7} | "
        f"{'p99/solo':>8} | {'p99-solo s':>10} | {'rejected':>8} | {'failed':>6}"
    )
    for label, r in rep["runs"].items():
        tenants = r["tenants"].values()
        print(
            f"{label:>14} | {r['replicas']:>4} | {_fmt(r['jain'], '.3f'):>5} | "
            f"{r['all_backlogged_s']:>8.1f} | {_fmt(r['gap_over_bound'], '.3f'):>9} | "
            f"{_fmt(r['throughput_over_fcfs'], '.3f'):>9} | "
            f"{_fmt(r.get('tokens_over_fcfs'), '.3f'):>8} | "
            f"{_fmt(r['service_over_fcfs'], '.3f'):>9} | "
            f"{_fmt(r.get('victim_ttft_p50_s'), '.3f'):>12} | "
            f"{_fmt(r.get('victim_ttft_p99_s'), '.3f'):>7} | "
            f"{_fmt(r.get('victim_p99_over_solo'), '.2f'):>8} | "
            f"{_fmt(r.get('victim_p99_minus_solo_s'), '.3f'):>10} | "
            f"{sum(t['rejected'] for t in tenants):>8.0f} | "
            f"{sum(t['failed'] for t in tenants):>6.0f}"
        )
    print(f"{'':>14}   per tenant: weighted service, output tokens, TTFT p50/p99 s")
    for label, r in rep["runs"].items():
        cells = [
            f"{t} {v['weighted_service']:.0f} {v['output_tokens']:.0f} "
            f"{v['ttft_p50_s']:.2f}/{v['ttft_p99_s']:.2f}"
            for t, v in r["tenants"].items()
        ]
        print(f"{label:>14}   " + "; ".join(cells))


def write_json(path: str, report: dict[str, Any]) -> None:
    Path(path).write_text(json.dumps(report, indent=1))


# What a many-trace summary reports, per scenario and policy: (column, key).
SUMMARY_COLUMNS = (
    ("Jain", "jain"),
    ("gap/bound", "gap_over_bound"),
    ("tput/FCFS", "throughput_over_fcfs"),
    ("tok/FCFS", "tokens_over_fcfs"),
    ("wsvc/FCFS", "service_over_fcfs"),
    ("p50/solo", "victim_p50_over_solo"),
    ("p99/solo", "victim_p99_over_solo"),
    ("p50-solo s", "victim_p50_minus_solo_s"),
    ("p99-solo s", "victim_p99_minus_solo_s"),
    ("tok/s", "tokens_per_s"),
    ("heavy TTFT p50 s", "heavy_ttft_p50_s"),
    ("heavy E2E p50 s", "heavy_e2e_p50_s"),
)


def summarize(reports: dict[int, dict[str, Any]]) -> dict[str, dict[str, dict[str, Any]]]:
    """Per scenario, policy and column: median, min and max over the seeds' reports
    (NaN and missing values left out: Jain needs every tenant backlogged at once)."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for report in reports.values():
        for key, rep in report.items():
            for label, run in rep["runs"].items():
                cols = out.setdefault(key, {}).setdefault(label, {})
                for _, field in SUMMARY_COLUMNS:
                    x = run.get(field)
                    if isinstance(x, int | float) and not math.isnan(x):
                        cols.setdefault(field, []).append(float(x))
    return {
        key: {
            label: {
                field: {
                    "median": statistics.median(xs),
                    "min": min(xs),
                    "max": max(xs),
                    "n": len(xs),
                }
                for field, xs in cols.items()
            }
            for label, cols in by_label.items()
        }
        for key, by_label in out.items()
    }


def print_summary(summary: dict[str, dict[str, dict[str, Any]]], seeds: list[int]) -> None:
    print(f"\nover {len(seeds)} traces (seeds {seeds[0]}-{seeds[-1]}): median (min-max)")
    for key, by_label in summary.items():
        print(f"({key})" + "".join(f" | {name:>21}" for name, _ in SUMMARY_COLUMNS))
        for label, cols in by_label.items():
            cells = []
            for _, field in SUMMARY_COLUMNS:
                c = cols.get(field)
                cells.append(
                    "-" if c is None else f"{c['median']:.3f} ({c['min']:.3f}-{c['max']:.3f})"
                )
            print(f"{label:>14}" + "".join(f" | {cell:>21}" for cell in cells))
