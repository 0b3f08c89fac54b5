"""The report of `fairgate bench fleet`: a JSON-able dict and an 80-column table.

Per variant (the median over repetitions): tokens served per second (prompt +
output, cached prompt tokens included, as the fairness bench counts them),
output tokens/s, prompt tokens served from cache (the engines' `cached_tokens`
summed over completed requests) and their share of those requests' prompt
tokens, Jain over the backlogged tenants, the max weighted gap over the stated
bound, and the light tenant's TTFT p99 over its solo run through the same
stack; then ratios to fairgate without locality and to smg cache_aware.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from fairgate.bench.fairness_metrics import jain_of_waits
from fairgate.bench.fleet_stacks import BASELINE, PEER, FleetVariant, no_levers

if TYPE_CHECKING:
    from fairgate.bench.fairness import RunResult
    from fairgate.bench.fleet_clients import FleetRecord
    from fairgate.bench.fleet_scenarios import FleetScenario


@dataclass
class FleetRun:
    """One variant's (or solo) run: the fairness analysis and the cache counts."""

    variant: str
    result: RunResult
    records: list[FleetRecord]

    def cache(self) -> dict[str, float]:
        done = [r for r in self.records if r.completed]
        prompt = sum(r.prompt_tokens for r in done)
        cached = sum(r.cached_tokens or 0 for r in done)
        window_s = self.result.window_s
        return {
            "completed": len(done),
            "completed_prompt_tokens": prompt,
            "cached_tokens": cached,
            "cached_fraction": cached / prompt if prompt else math.nan,
            "cached_tokens_per_s": cached / window_s,
        }

    def accounting(self) -> dict[str, int]:
        """Every request sent is completed, still streaming or queued at the
        window's end, rejected, or failed: exactly one of them."""
        rs = self.records
        return {
            "sent": len(rs),
            "completed": sum(1 for r in rs if r.completed),
            "unfinished": sum(1 for r in rs if not (r.completed or r.rejected or r.failed)),
            "rejected": sum(1 for r in rs if r.rejected),
            "failed": sum(1 for r in rs if r.failed),
        }


# Per-run figures whose median over repetitions the report gives.
FIGURES = (
    "tokens_per_s",
    "output_tokens_per_s",
    "cached_tokens",
    "cached_fraction",
    "cached_tokens_per_s",
    "jain",
    "jain_wait",
    "gap_over_bound",
    "light_ttft_p50_s",
    "light_ttft_p99_s",
    "light_queue_wait_p99_s",
    "heavy_ttft_p50_s",
)


def _figures(run: FleetRun, victim: str) -> dict[str, float]:
    r = run.result
    light = r.per_tenant.get(victim, {})
    return {
        "tokens_per_s": r.tokens_per_s,
        "output_tokens_per_s": r.output_tokens_per_s,
        **{k: float(v) for k, v in run.cache().items() if k in FIGURES},
        "jain": r.jain,
        "jain_wait": jain_wait(r.per_tenant, victim),
        "gap_over_bound": r.gap_over_bound,
        "light_ttft_p50_s": light.get("ttft_p50_s", math.nan),
        "light_ttft_p99_s": light.get("ttft_p99_s", math.nan),
        "light_queue_wait_p99_s": light.get("queue_wait_p99_s", math.nan),
        # What isolation costs the other tenants: their first token (staged
        # prefill's round trips, the hold, a worker kept off their prompts).
        "heavy_ttft_p50_s": r.heavy_ttft_p50_s,
    }


def jain_wait(per_tenant: dict[str, dict[str, float]], victim: str) -> float:
    """Jain over the other tenants' mean queue wait (smg: none to read, its wait is
    its TTFT): does one of them wait longer in line than the others?"""
    return jain_of_waits(
        v.get("queue_wait_mean_s", math.nan) for t, v in per_tenant.items() if t != victim
    )


def _median(xs: Sequence[float]) -> float:
    ok = [x for x in xs if not math.isnan(x)]
    return statistics.median(ok) if ok else math.nan


def _ratio(a: float, b: float) -> float:
    return a / b if b and not math.isnan(b) else math.nan


def report(
    sc: FleetScenario,
    bound: float,
    variants: Sequence[FleetVariant],
    reps: list[dict[str, FleetRun]],
    solos: dict[str, FleetRun],
    routing_setting: bool,
) -> dict[str, Any]:
    solo_p99 = {
        stack: run.result.per_tenant.get(sc.victim, {}).get("ttft_p99_s", math.nan)
        for stack, run in solos.items()
    }
    rows: dict[str, dict[str, Any]] = {}
    for v in variants:
        per_rep = [_figures(rep[v.key], sc.victim) for rep in reps]
        row: dict[str, Any] = {f: _median([p[f] for p in per_rep]) for f in FIGURES}
        row["light_solo_ttft_p99_s"] = solo_p99.get(v.stack, math.nan)
        row["light_p99_over_solo"] = _ratio(row["light_ttft_p99_s"], row["light_solo_ttft_p99_s"])
        row["light_p99_minus_solo_s"] = row["light_ttft_p99_s"] - row["light_solo_ttft_p99_s"]
        row["describe"] = v.describe()
        row["repetitions"] = [
            {**p, "accounting": rep[v.key].accounting(), "tenants": rep[v.key].result.per_tenant}
            for p, rep in zip(per_rep, reps, strict=True)
        ]
        rows[v.key] = row
    for v in variants:
        row = rows[v.key]
        for ref_name, ref in (("baseline", BASELINE), ("peer", PEER), ("nolevers", no_levers(v))):
            other = rows.get(ref)
            for f in ("tokens_per_s", "output_tokens_per_s", "cached_tokens"):
                row[f"{f}_over_{ref_name}"] = (
                    _ratio(row[f], other[f]) if other is not None else math.nan
                )
    return {
        "mix": sc.mix,
        "workers": sc.workers,
        "seconds": sc.seconds,
        "load": sc.load,
        "weights": sc.weights,
        "victim": sc.victim,
        "bound_weighted_tokens": bound,
        "routing_setting": routing_setting,
        "baseline": BASELINE,
        "peer": PEER,
        "solo": {stack: run.accounting() for stack, run in solos.items()},
        "variants": rows,
    }


def _f(x: Any, spec: str) -> str:
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else format(x, spec)


def print_report(rep: dict[str, Any]) -> None:
    weights = " ".join(f"{t} {w:g}" for t, w in rep["weights"].items())
    mix = "long-prompt" if rep.get("mix") == "long" else "prefix-heavy"
    print(
        f"\n{mix} mix on {rep['workers']} workers, weights {weights}\n"
        f"stated bound {rep['bound_weighted_tokens']:.0f} weighted tokens "
        f"(VTC bound + light credit + allowance)"
    )
    print(
        f"{'variant':<12} {'tok/s':>7} {'out/s':>6} {'cache':>5} {'Jain':>5} {'gap/B':>5} "
        f"{'p99/solo':>8} {'tok/base':>8} {'tok/smg':>7} {'cch/smg':>7}"
    )
    for key, r in rep["variants"].items():
        print(
            f"{key:<12} {_f(r['tokens_per_s'], '.0f'):>7} "
            f"{_f(r['output_tokens_per_s'], '.0f'):>6} {_f(r['cached_fraction'], '.2f'):>5} "
            f"{_f(r['jain'], '.3f'):>5} {_f(r['gap_over_bound'], '.2f'):>5} "
            f"{_f(r['light_p99_over_solo'], '.2f'):>8} "
            f"{_f(r['tokens_per_s_over_baseline'], '.3f'):>8} "
            f"{_f(r['tokens_per_s_over_peer'], '.3f'):>7} "
            f"{_f(r['cached_tokens_over_peer'], '.3f'):>7}"
        )
    print(
        "tok/s: prompt (cached included) + output tokens per simulated s; cache: the\n"
        "cached share of completed prompts; base: fg least_full; smg: smg cache_aware;\n"
        "Jain: over service, the tenants backlogged together; Jwait: over the other\n"
        "tenants' mean queue wait (smg: their mean TTFT)"
    )
    print(
        f"{'variant':<12} {'sent':>5} {'done':>5} {'unfin':>5} {'rej':>4} {'fail':>4} "
        f"{'light p99 s':>11} {'solo p99 s':>10} {'cch Mtok':>8} {'Jwait':>5}"
    )
    for key, r in rep["variants"].items():
        acc = r["repetitions"][-1]["accounting"]
        print(
            f"{key:<12} {acc['sent']:>5} {acc['completed']:>5} {acc['unfinished']:>5} "
            f"{acc['rejected']:>4} {acc['failed']:>4} {_f(r['light_ttft_p99_s'], '.3f'):>11} "
            f"{_f(r['light_solo_ttft_p99_s'], '.3f'):>10} "
            f"{_f(r['cached_tokens'] / 1e6, '.3f'):>8} {_f(r['jain_wait'], '.3f'):>5}"
        )
