"""`fairgate bench fairness --virtual`: a trace through the admission rules and
the engine model on simulated time, no processes.

A live run (`fairness.py`) sends each request over gRPC to a fairgate child
process whose simulated engine runs in real time (or scaled), so its TTFTs
carry the machine's scheduling delays and its ratios move a few per cent from
run to run on a busy machine. This replays the same trace through the same
pieces — the policy, `Dispatcher` (rules, reserve or lent room, light credit)
and the simulator's `SimCore` with the same engine priorities — on the
discrete-event driver the scheduler's property tests use: what it measures is
the scheduling alone, and it repeats exactly. One replica only (the shared
store's decisions are the same rules: the differential test).
"""

from __future__ import annotations

from fairgate.bench.event_driver import Arrival as DriverArrival
from fairgate.bench.event_driver import Driver
from fairgate.bench.fairness_metrics import RequestRecord
from fairgate.bench.fairness_scenarios import KV_CAPACITY_TOKENS, MAX_RUNNING_REQUESTS, Arrival
from scheduler.clock import FakeClock
from scheduler.ordering.policies import make_policy
from scheduler.rules import Isolation
from scheduler.tenancy.tenants import TenantConfig, TenantRegistry
from service.app import admission_limits, isolation_for, policy_options
from service.engine_factory import staged_prefill
from service.engines.simulator.core import SimConfig
from service.engines.simulator.hardware import preset
from service.settings import Settings


def replay(
    trace: list[Arrival],
    weights: dict[str, float],
    settings: Settings,
    window_s: float,
) -> list[RequestRecord]:
    """What clients would have seen of `trace` within `window_s`, under `settings`
    (policy, reserve, isolation, light credit, rate limits, the simulator's preset)."""
    clock = FakeClock()
    tenants = TenantRegistry([TenantConfig(t, weight=w) for t, w in weights.items()])
    options = policy_options(settings, clock, tenants)
    # As the live run's engine: SGLang with --enable-priority-scheduling.
    sim = SimConfig(
        cost=preset(settings.sim_gpu, settings.sim_model),
        max_running_requests=MAX_RUNNING_REQUESTS,
        kv_capacity_tokens=KV_CAPACITY_TOKENS,
        seed=settings.sim_seed,
        priority_scheduling=True,
    )
    cap = sim.engine_capacity()
    isolation = isolation_for(settings, cap)
    drv = Driver(
        make_policy(settings.policy, options),
        admission_limits(cap, settings),
        sim,
        tenants=tenants,
        w_in=settings.vtc_w_in,
        w_out=settings.vtc_w_out,
        clock=clock,
        reserve_fraction=settings.light_share(isolation is Isolation.PREEMPT),
        isolation=isolation,
        staged_prefill=staged_prefill(settings),
    )
    drv.run(
        [DriverArrival(a.t_s, a.tenant, a.prompt_tokens, a.max_tokens) for a in trace],
        max_steps=10_000_000,
        until_s=window_s,
    )
    return records(drv)


def records(drv: Driver) -> list[RequestRecord]:
    """What clients saw of each of the driver's requests (its prompt tokens charged
    at the cached rate as `cached_tokens`)."""
    return [
        RequestRecord(
            c.arrival.tenant_id,
            c.arrival.at_s,
            c.arrival.prompt_tokens,
            c.arrival.max_tokens,
            token_times=[(t, 1) for t in c.token_times_s],
            admitted_s=c.admitted_s,
            first_token_s=c.first_token_s,
            done_s=c.done_s,
            rejected="RESOURCE_EXHAUSTED" if c.state == "rejected" else "",
            cached_tokens=c.charged_cached,
        )
        for c in drv.calls
    ]
