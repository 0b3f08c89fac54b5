"""The highest arrival rate that meets latency SLOs, found by driving the
simulator's clock-free core with a discrete-event loop on a virtual clock.

Each probe replays the same arrivals (unit-rate gaps scaled by 1/rate, so
probes differ only in the rate) with lengths drawn from the traffic model,
steps `SimCore` iteration by iteration, and measures per request the time to
first token (arrival → end of the iteration that produced it) and the time per
output token. The first `warmup_fraction` of requests is left out (an empty
engine flatters latency). Gateway and network overheads are not modelled.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable
from dataclasses import dataclass

from fairgate.bench.common import percentile
from fairgate.bench.workload import Arrivals, Lengths
from service.engines.protocol import SamplingOptions
from service.engines.simulator.core import SimConfig, SimCore


@dataclass(frozen=True, slots=True)
class Slos:
    ttft_p99_s: float
    tpot_p99_s: float


@dataclass(frozen=True, slots=True)
class Probe:
    rate_per_s: float
    requests: int
    ttft_p99_s: float
    tpot_p99_s: float
    e2e_mean_s: float
    virtual_s: float
    preemptions: int
    meets: bool


@dataclass(frozen=True, slots=True)
class Workload:
    lengths: Lengths
    cv: float = 1.0
    requests: int = 800
    warmup_fraction: float = 0.1
    seed: int = 0


def simulate(config: SimConfig, workload: Workload, rate_per_s: float, slos: Slos) -> Probe:
    """Run `workload.requests` arrivals at `rate_per_s` through a fresh SimCore."""
    rng = random.Random(workload.seed)
    gaps = Arrivals(1.0, workload.cv).gaps_s(rng, workload.requests)
    draw = workload.lengths.sampler(workload.seed + 1)
    jobs = [draw() for _ in range(workload.requests)]
    arrivals: list[float] = []
    t = 0.0
    for g in gaps:
        t += g / rate_per_s
        arrivals.append(t)

    core = SimCore(config)
    sampling = SamplingOptions(ignore_eos=True)
    first: dict[str, float] = {}
    done: dict[str, float] = {}
    now, i, n = 0.0, 0, len(arrivals)
    while i < n or not core.idle:
        if core.idle and arrivals[i] > now:
            now = arrivals[i]  # nothing to do until the next arrival
        while i < n and arrivals[i] <= now:
            prompt, output = jobs[i]
            core.add(core.make_request(str(i), [0] * prompt, output, sampling))
            i += 1
        step = core.step()
        if step.duration_s <= 0 and not step.emissions:
            if i < n:
                now = max(now, arrivals[i])
                continue
            break
        now += step.duration_s
        for em in step.emissions:
            first.setdefault(em.rid, now)
            if em.finish is not None:
                done[em.rid] = now

    skip = int(n * workload.warmup_fraction)
    ttft: list[float] = []
    tpot: list[float] = []
    e2e: list[float] = []
    for k in range(skip, n):
        rid = str(k)
        if rid not in done:
            continue
        ttft.append(first[rid] - arrivals[k])
        e2e.append(done[rid] - arrivals[k])
        out = jobs[k][1]
        if out > 1:
            tpot.append((done[rid] - first[rid]) / (out - 1))
    ttft_p99 = percentile(ttft, 99)
    tpot_p99 = percentile(tpot, 99) if tpot else 0.0
    return Probe(
        rate_per_s=rate_per_s,
        requests=n,
        ttft_p99_s=ttft_p99,
        tpot_p99_s=tpot_p99,
        e2e_mean_s=sum(e2e) / len(e2e) if e2e else math.nan,
        virtual_s=now,
        preemptions=core.preemptions,
        meets=ttft_p99 <= slos.ttft_p99_s and tpot_p99 <= slos.tpot_p99_s,
    )


@dataclass(frozen=True, slots=True)
class SearchResult:
    max_rate_per_s: float  # 0 when even a light load misses the SLOs
    probes: list[Probe]
    feasible: bool


def max_rate(
    config: SimConfig,
    workload: Workload,
    slos: Slos,
    start_rate_per_s: float,
    *,
    rel_tol: float = 0.03,
    max_probes: int = 24,
    on_probe: Callable[[str, Probe], None] | None = None,
) -> SearchResult:
    """Bracket, then bisect, the highest rate whose p99s meet the SLOs."""
    probes: list[Probe] = []

    def probe(rate: float, why: str) -> Probe:
        p = simulate(config, workload, rate, slos)
        probes.append(p)
        if on_probe is not None:
            on_probe(why, p)
        return p

    light = probe(start_rate_per_s * 0.05, "light load (is the SLO reachable at all?)")
    if not light.meets:
        return SearchResult(0.0, probes, feasible=False)
    lo, hi = light.rate_per_s, start_rate_per_s
    while probe(
        hi, "bracket: try the roofline estimate" if not probes[1:] else "bracket: double"
    ).meets:
        lo, hi = hi, hi * 2
        if len(probes) >= max_probes:
            return SearchResult(lo, probes, feasible=True)
    while (hi - lo) / hi > rel_tol and len(probes) < max_probes:
        mid = (lo + hi) / 2
        if probe(mid, "bisect").meets:
            lo = mid
        else:
            hi = mid
    return SearchResult(lo, probes, feasible=True)
