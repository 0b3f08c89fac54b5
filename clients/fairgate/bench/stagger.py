"""`fairgate bench stagger`: staggered prefill on the virtual fleet (issue #33, lever 1).

N simulated 4090 engines (Llama-3.1-8B int4, SGLang's 2048-token prefill chunks,
16 running requests each) behind the server's placement, on a fake clock (exact
repeats, no machine noise): two tenants with cold 1-6 k-token prompts and one
with 200-1500, beside a light chat tenant at 2 requests/s; the same trace with
staggered prefill off and at each `min_tokens`, and the light tenant alone (its
solo TTFT) on the same fleet. Reports the light tenant's TTFT p50/p99, p99 over
solo, and tokens/s (prompt + output over the run) against staggering off.
`replicas`: as many fairgate replicas in front of the pool, each placing its
share of the requests; `share`: they hear each other's long prefills (and
routes), as prefix_share.py carries them live.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

from fairgate.bench.event_driver import Arrival, Driver
from scheduler.budget import AdmissionLimits
from scheduler.ordering.vtc import VtcPolicy
from scheduler.tenancy.tenants import TenantConfig, TenantRegistry
from service.engines.placement import Stagger
from service.engines.simulator.core import SimConfig
from service.engines.simulator.hardware import preset

KV_PER_ENGINE = 60_000
TENANTS = ("code", "docs", "conv", "light")
# tenant: (requests/s on four engines, prompt tokens low, high)
HEAVY = {"code": (1.2, 1000, 6000), "docs": (1.2, 1000, 6000), "conv": (2.0, 200, 1500)}
LIGHT_RATE = 2.0


def long_prompt_mix(
    seed: int, seconds: float, engines: int = 4, heavy: bool = True
) -> list[Arrival]:
    """The seeded trace: heavy tenants' rates scale with the engines (4 = as listed)."""
    rng = random.Random(seed)
    out = []
    for tenant, (rate, lo, hi) in HEAVY.items() if heavy else ():
        t = rng.expovariate(rate * engines / 4)
        while t < seconds:
            out.append(Arrival(t, tenant, rng.randint(lo, hi), rng.randint(64, 256)))
            t += rng.expovariate(rate * engines / 4)
    t = rng.expovariate(LIGHT_RATE)
    while t < seconds:
        out.append(Arrival(t, "light", rng.randint(20, 100), rng.randint(16, 64)))
        t += rng.expovariate(LIGHT_RATE)
    return sorted(out, key=lambda a: a.at_s)


def fleet(
    arrivals: list[Arrival],
    engines: int,
    stagger: Stagger | None,
    replicas: int = 1,
    share: bool = True,
) -> Driver:
    reg = TenantRegistry([TenantConfig(t) for t in TENANTS])
    drv = Driver(
        VtcPolicy(reg.weight_of),
        AdmissionLimits(max_requests=16 * engines, max_kv_tokens=KV_PER_ENGINE * engines),
        SimConfig(cost=preset(), max_running_requests=16, chunked_prefill_size=2048),
        tenants=reg,
        engines=engines,
        routing="locality",
        stagger=stagger,
        replicas=replicas,
        share=share,
    )
    drv.run(arrivals)
    return drv


def light_ttft_s(drv: Driver) -> list[float]:
    return sorted(
        c.first_token_s - c.arrival.at_s
        for c in drv.calls
        if c.arrival.tenant_id == "light" and c.first_token_s is not None
    )


def quantile(xs: Sequence[float], q: float) -> float:
    return xs[min(len(xs) - 1, int(q * len(xs)))]


def tokens_per_s(drv: Driver) -> float:
    ends = [c.done_s for c in drv.calls if c.done_s is not None]
    done = sum(c.arrival.prompt_tokens + c.output_tokens for c in drv.calls if c.done_s)
    return done / max(ends)


def main(
    engines: int,
    seeds: Sequence[int],
    sizes: Sequence[int],
    seconds: float,
    replicas: int = 1,
    share: bool = True,
) -> None:
    shared = "" if replicas == 1 else f", {replicas} replicas " + ("sharing" if share else "apart")
    print(
        f"virtual fleet: {engines} x rtx-4090 / llama-3.1-8b-int4, {seconds:g} s per trace{shared}"
    )
    print(f"{'seed':>4} | {'min_tokens':>10} | {'p50 ms':>7} | {'p99 ms':>7} | "
          f"{'p99/solo':>8} | {'tok/s':>7} | {'x off':>5} | kept")  # fmt: skip
    for seed in seeds:
        arrivals = long_prompt_mix(seed, seconds, engines)
        solo = quantile(
            light_ttft_s(fleet(long_prompt_mix(seed, seconds, engines, False), engines, None)), 0.99
        )
        off = fleet(arrivals, engines, None, replicas, share)
        for size in (0, *sizes):
            drv = (
                fleet(arrivals, engines, Stagger(min_tokens=size), replicas, share) if size else off
            )
            ttft, rate = light_ttft_s(drv), tokens_per_s(drv)
            kept = sum(p.stagger.kept_free for p in drv.placements)
            print(
                f"{seed:>4} | {size or 'off':>10} | {quantile(ttft, 0.5) * 1e3:>7.1f} | "
                f"{quantile(ttft, 0.99) * 1e3:>7.1f} | {quantile(ttft, 0.99) / solo:>8.2f} | "
                f"{rate:>7.0f} | {rate / tokens_per_s(off):>5.3f} | {kept}"
            )
