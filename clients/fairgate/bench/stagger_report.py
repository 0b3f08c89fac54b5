"""`fairgate bench stagger`'s matrix and table: every mix x engines x seed x lever
combination run on the virtual fleet (`stagger.py`), then per (mix, engines,
levers) the median and spread over the seeds of

- the light tenant's TTFT p50 and p99 against its solo run (its arrivals alone
  on the same engines, no levers);
- issue #33's bar: with two engines or more, p99 <= max(2 x solo p99, solo p99
  + one decode step of a full batch); on one engine, p99 <= solo p99 + one
  prefill chunk (both steps from the cost model, `bars`);
- engine tokens/s against no levers on the same trace;
- Jain over token service (weighted tokens, as the fair counter charges them,
  among the heavy tenants backlogged together, `jain_backlogged`; NaN where no
  two ever were), beside the seconds two or more were: at the default load the
  heavy tenants are seldom backlogged together, and over a few seconds Jain
  weighs a handful of admissions, each up to 6 000 tokens; and Jain over queue
  wait (each heavy tenant's mean wait from arrival to being sent to an engine:
  fairgate's queue plus any cold-start hold);
- the largest weighted service gap between two backlogged tenants over the VTC
  bound (with the default light credit and locality allowance added).

Every number is computed from the runs; nothing is carried over.
"""

from __future__ import annotations

import json
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from fairgate.bench.event_driver import Driver
from fairgate.bench.fairness_metrics import (
    backlog_intervals,
    backlogged_sets,
    jain_backlogged,
    jain_of_waits,
    service_events,
)
from fairgate.bench.fairness_virtual import records as virtual_records
from fairgate.bench.stagger import (
    CHUNK_TOKENS,
    FCFS,
    KV_PER_ENGINE,
    LIGHT,
    MIXES,
    SETTINGS,
    SLOTS,
    EngineMode,
    Levers,
    fleet,
    light_ttft_s,
    others_ttft_s,
    quantile,
    sim_config,
    solo,
    tokens_per_s,
)
from scheduler.rules import vtc_bound

W_IN, W_OUT = SETTINGS.vtc_w_in, SETTINGS.vtc_w_out


@dataclass(frozen=True, slots=True)
class Bars:
    """The steps issue #33's bars add to the solo p99, from the cost model."""

    decode_step_s: float  # one decode step of a full batch (every slot, the KV full)
    chunk_s: float  # one prefill chunk alone


def bars() -> Bars:
    cost = sim_config().cost
    return Bars(cost.step_s(0, SLOTS, KV_PER_ENGINE), cost.step_s(CHUNK_TOKENS, 0, 0))


def bar_s(solo_p99_s: float, engines: int, b: Bars) -> float:
    if engines == 1:
        return solo_p99_s + b.chunk_s
    return max(2 * solo_p99_s, solo_p99_s + b.decode_step_s)


def jain_service(drv: Driver) -> tuple[float, float]:
    """Jain over the heavy tenants' weighted service among those backlogged
    together, and the seconds two or more of them were (what it stands on)."""
    records = virtual_records(drv)
    heavy = sorted({r.tenant for r in records} - {LIGHT})
    until = max((r.done_s or 0.0) for r in records)
    intervals = {t: backlog_intervals(records, t, until) for t in heavy}
    events = service_events(records, W_IN, W_OUT, until, drv.w_cached)
    together = sum(hi - lo for s in backlogged_sets(intervals).values() for lo, hi in s)
    return jain_backlogged(events, intervals, dict.fromkeys(heavy, 1.0)), together


def jain_wait(drv: Driver) -> float:
    """Jain over the heavy tenants' mean wait to be sent (all zero: equal, 1.0)."""
    waits: dict[str, list[float]] = {}
    for c in drv.calls:
        if c.arrival.tenant_id != LIGHT and c.sent_s is not None:
            waits.setdefault(c.arrival.tenant_id, []).append(c.sent_s - c.arrival.at_s)
    return jain_of_waits(statistics.fmean(w) for w in waits.values())


def gap_over_bound(drv: Driver) -> float:
    calls = drv.calls
    l_in = max(c.arrival.prompt_tokens for c in calls)
    kv = max(KV_PER_ENGINE * len(drv.workers), *(c.req.kv_tokens for c in calls))
    bound = vtc_bound(W_IN, W_OUT, l_in, kv, SETTINGS.fair_light_credit)
    return drv.monitor.worst / (bound + SETTINGS.fair_allowance_tokens)


def run_matrix(
    mixes: Sequence[str],
    engine_counts: Sequence[int],
    seeds: Sequence[int],
    combos: dict[str, Levers],
    seconds: float,
    replicas: int = 1,
    share: bool = True,
    kv_tokens: int | None = None,
    mode: EngineMode = FCFS,
    load: float = 1.0,
) -> list[dict[str, Any]]:
    """One row per (mix, engines, seed, levers): what that run measured (`replicas`
    placing the requests, hearing each other or not; `kv_tokens`, `mode`: see
    `stagger.fleet`; `load`: the heavy tenants' rates x this, see `MIXES`)."""
    rows = []
    b = bars()
    for mix in mixes:
        for engines in engine_counts:
            for seed in seeds:
                arrivals = MIXES[mix](seed, seconds, engines, load)
                solo_run = fleet(solo(arrivals), engines, None, kv_tokens=kv_tokens, mode=mode)
                solo_ttft = light_ttft_s(solo_run)
                solo_p50, solo_p99 = quantile(solo_ttft, 0.5), quantile(solo_ttft, 0.99)
                base = math.nan
                for name, lv in combos.items():
                    drv = fleet(
                        arrivals,
                        engines,
                        lv.stagger(),
                        lv.staged(),
                        replicas,
                        share,
                        lv.kv_events,
                        kv_tokens,
                        mode,
                    )
                    ttft, rate = light_ttft_s(drv), tokens_per_s(drv)
                    base = rate if name == "none" or math.isnan(base) else base
                    sts = [p.stagger for p in drv.placements]
                    p50, p99 = quantile(ttft, 0.5), quantile(ttft, 0.99)
                    jain, together_s = jain_service(drv)
                    others = others_ttft_s(drv)
                    rows.append(
                        {
                            "mix": mix,
                            "engines": engines,
                            "seed": seed,
                            "levers": name,
                            "light_requests": len(ttft),
                            "solo_p50_s": solo_p50,
                            "solo_p99_s": solo_p99,
                            "p50_s": p50,
                            "p99_s": p99,
                            "p50_over_solo": p50 / solo_p50,
                            "p99_over_solo": p99 / solo_p99,
                            "p99_minus_solo_s": p99 - solo_p99,
                            "bar_s": bar_s(solo_p99, engines, b),
                            "p99_over_bar": p99 / bar_s(solo_p99, engines, b),
                            "tokens_per_s": rate,
                            "tokens_vs_none": rate / base,
                            "jain_service": jain,
                            "backlogged_s": together_s,
                            "jain_wait": jain_wait(drv),
                            "gap_over_bound": gap_over_bound(drv),
                            "others_p50_s": quantile(others, 0.5),
                            "others_p99_s": quantile(others, 0.99),
                            "kept_free": sum(st.kept_free for st in sts),
                            "held": sum(st.held for st in sts),
                            "held_to_bound": sum(st.held_to_bound for st in sts),
                            "paced": sum(st.paced for st in sts),
                        }
                    )
    return rows


SUMMARIZED = (
    "p50_over_solo",
    "p99_over_solo",
    "p99_minus_solo_s",
    "p99_over_bar",
    "tokens_vs_none",
    "jain_service",
    "backlogged_s",
    "jain_wait",
    "gap_over_bound",
    "others_p50_s",
    "others_p99_s",
    "held",
    "paced",
)


def summarize(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (mix, engines, levers), in the rows' order: each figure's median, min and
    max over the seeds (NaN left out), and whether the median meets the bar."""
    groups: dict[tuple[str, int, str], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["mix"], r["engines"], r["levers"]), []).append(r)
    out = []
    for (mix, engines, name), rs in groups.items():
        s: dict[str, Any] = {"mix": mix, "engines": engines, "levers": name, "seeds": len(rs)}
        for k in SUMMARIZED:
            xs = [float(r[k]) for r in rs if not math.isnan(float(r[k]))]
            s[k] = (statistics.median(xs), min(xs), max(xs)) if xs else None
        med = s["p99_over_bar"]
        s["bar_met"] = med is not None and med[0] <= 1.0
        out.append(s)
    return out


def _fmt(v: tuple[float, float, float] | None, spec: str) -> str:
    if v is None:
        return "-"
    return f"{v[0]:{spec}} ({v[1]:{spec}}-{v[2]:{spec}})"


def print_table(summary: list[dict[str, Any]], seeds: Sequence[int]) -> None:
    b = bars()
    print(
        f"virtual fleet: rtx-4090 / llama-3.1-8b-int4, {SLOTS} slots, {CHUNK_TOKENS}-token "
        f"chunks; seeds {','.join(map(str, seeds))}: median (min-max)\n"
        f"bars: 2+ engines p99 <= max(2 x solo, solo + decode step of a full batch "
        f"{b.decode_step_s * 1e3:.1f} ms); 1 engine p99 <= solo + one chunk "
        f"{b.chunk_s * 1e3:.1f} ms"
    )
    print(
        f"{'mix':<6} {'eng':>3} {'levers':<11} | {'p50/solo':<17} | {'p99/solo':<19} | "
        f"{'p99-solo ms':<19} | {'p99/bar':<17} | bar | {'tok/s x none':<21} | "
        f"{'Jain svc':<21} | {'2+ backlogged s':<17} | {'Jain wait':<21} | {'gap/B':<17} | "
        f"{'others p50 ms':<19} | {'others p99 ms':<19} | {'held':<15} | paced"
    )
    for s in summary:
        ms, o50, o99 = (
            None if s[k] is None else tuple(x * 1e3 for x in s[k])
            for k in ("p99_minus_solo_s", "others_p50_s", "others_p99_s")
        )
        print(
            f"{s['mix']:<6} {s['engines']:>3} {s['levers']:<11} | "
            f"{_fmt(s['p50_over_solo'], '.1f'):<17} | {_fmt(s['p99_over_solo'], '.1f'):<19} | "
            f"{_fmt(ms, '.0f'):<19} | {_fmt(s['p99_over_bar'], '.2f'):<17} | "
            f"{'yes' if s['bar_met'] else 'no':<3} | {_fmt(s['tokens_vs_none'], '.3f'):<21} | "
            f"{_fmt(s['jain_service'], '.3f'):<21} | {_fmt(s['backlogged_s'], '.1f'):<17} | "
            f"{_fmt(s['jain_wait'], '.3f'):<21} | "
            f"{_fmt(s['gap_over_bound'], '.2f'):<17} | {_fmt(o50, '.0f'):<19} | "
            f"{_fmt(o99, '.0f'):<19} | {_fmt(s['held'], '.0f'):<15} | "
            f"{_fmt(s['paced'], '.0f')}"
        )


def write_json(path: str, rows: list[dict[str, Any]], summary: list[dict[str, Any]]) -> None:
    b = bars()
    doc = {
        "bars": {"decode_step_s": b.decode_step_s, "chunk_s": b.chunk_s},
        "runs": rows,
        "summary": summary,
    }
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f, indent=1)


def main(
    mixes: Sequence[str],
    engine_counts: Sequence[int],
    seeds: Sequence[int],
    combos: dict[str, Levers],
    seconds: float,
    json_out: str = "",
    replicas: int = 1,
    share: bool = True,
    kv_tokens: int | None = None,
    mode: EngineMode = FCFS,
    load: float = 1.0,
) -> list[dict[str, Any]]:
    rows = run_matrix(
        mixes, engine_counts, seeds, combos, seconds, replicas, share, kv_tokens, mode, load
    )
    summary = summarize(rows)
    if replicas > 1:
        print(f"{replicas} replicas placing the requests, " + ("sharing" if share else "apart"))
    if kv_tokens is not None:
        print(f"engines of {kv_tokens} KV tokens, admission at kv_target_fraction of them")
    if load != 1.0:
        print(f"heavy tenants at {load:g}x their rates")
    engines = "by priority, preempting" if mode.priority else "FCFS"
    print(f"engines schedule {engines}; fair_isolation {mode.isolation}")
    if not mode.round_trip:
        print("what-if: no round trip (an emission's answer reaches the engine at once)")
    print_table(summary, seeds)
    if json_out:
        write_json(json_out, rows, summary)
    return summary
