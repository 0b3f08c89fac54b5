"""Property-based tests: random multi-tenant workloads through dispatcher + simulator."""

from __future__ import annotations

import dataclasses

import pytest
from fairgate.bench.event_driver import Arrival, Driver
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scheduler.budget import AdmissionLimits
from scheduler.ordering.fcfs import FcfsPolicy
from scheduler.ordering.policy import QueuePolicy
from scheduler.ordering.rate_limit import RateLimitPolicy
from scheduler.ordering.vtc import VtcPolicy
from scheduler.request import Priority
from scheduler.tenancy.tenants import OVER_QUOTA_MODES, TenantConfig, TenantQuotas, TenantRegistry
from service.engines.simulator.core import SimConfig
from service.engines.simulator.hardware import preset

COST = preset()
TENANTS = ["a", "b", "c", "d"]
PROPS = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)


def sim_config(mean_output: float | None) -> SimConfig:
    return SimConfig(
        cost=COST,
        max_running_requests=16,
        chunked_prefill_size=512,
        kv_capacity_tokens=4096,
        mean_output_tokens=mean_output,
    )


@st.composite
def backlogged_workload(draw: st.DrawFn) -> tuple[list[Arrival], int]:
    """2-4 tenants, each arriving in bursts, so they stay backlogged together."""
    n = draw(st.integers(2, 4))
    arrivals = []
    for tid in TENANTS[:n]:
        count = draw(st.integers(4, 14))
        start_s = draw(st.sampled_from([0.0, 0.0, 0.05, 0.2]))
        for i in range(count):
            arrivals.append(
                Arrival(
                    at_s=start_s + i * draw(st.sampled_from([0.0, 0.001, 0.01])),
                    tenant_id=tid,
                    prompt_tokens=draw(st.integers(1, 200)),
                    max_tokens=draw(st.integers(1, 40)),
                    priority=draw(st.sampled_from(list(Priority))),
                )
            )
    max_kv = draw(st.sampled_from([300, 600, 1500]))
    return arrivals, max_kv


@pytest.mark.timeout(900)
@PROPS
@given(
    backlogged_workload(),
    st.sampled_from([None, 8.0]),
    st.lists(st.sampled_from([1.0, 2.0, 0.5]), min_size=4, max_size=4),
    st.sampled_from([(1.0, 2.0), (1.0, 1.0)]),
)
def test_vtc_service_gap_between_backlogged_tenants_is_bounded(
    workload: tuple[list[Arrival], int],
    mean_output: float | None,
    weights: list[float],
    w: tuple[float, float],
) -> None:
    arrivals, max_kv = workload
    w_in, w_out = w
    reg = TenantRegistry(
        [TenantConfig(t, weight=wt) for t, wt in zip(TENANTS, weights, strict=True)]
    )
    drv = Driver(
        VtcPolicy(reg.weight_of, w_in=w_in, w_out=w_out),
        AdmissionLimits(max_requests=8, max_kv_tokens=max_kv),
        sim_config(mean_output),
        tenants=reg,
        w_in=w_in,
        w_out=w_out,
    )
    drv.run(arrivals)
    l_in = max(a.prompt_tokens for a in arrivals)
    # M: the tokens the engine may hold (the budget's KV target, or one oversized request).
    m = max(max_kv, max(a.prompt_tokens + a.max_tokens for a in arrivals))
    bound = 2 * max(w_in * l_in, w_out * m) / min(weights)
    assert drv.monitor.worst <= bound + 1e-6, (drv.monitor.worst, bound)
    assert all(c.state == "done" for c in drv.calls)


def test_fcfs_does_break_the_vtc_bound_on_a_hog_workload() -> None:
    # One tenant dumps 40 long requests first; FCFS serves them all before b.
    arrivals = [Arrival(0.0, "a", 200, 40) for _ in range(40)]
    arrivals += [Arrival(0.001, "b", 10, 5) for _ in range(5)]
    results = {}
    for name, policy in (("fcfs", FcfsPolicy()), ("vtc", VtcPolicy())):
        drv = Driver(policy, AdmissionLimits(4, 300), sim_config(None))
        drv.run(arrivals)
        results[name] = drv.monitor.worst
    bound = 2 * max(200, 2 * 300)
    assert results["fcfs"] > bound >= results["vtc"]


@st.composite
def chaotic_workload(draw: st.DrawFn) -> list[Arrival]:
    arrivals = []
    for _ in range(draw(st.integers(1, 40))):
        max_tokens = draw(st.integers(1, 30))
        arrivals.append(
            Arrival(
                at_s=draw(st.floats(0.0, 0.5)),
                tenant_id=draw(st.sampled_from(TENANTS)),
                prompt_tokens=draw(st.integers(1, 300)),
                max_tokens=max_tokens,
                priority=draw(st.sampled_from(list(Priority))),
                cancel_after_s=draw(st.none() | st.floats(0.0, 0.3)),
                cancel_silently=draw(st.booleans()),
                deadline_after_s=draw(st.none() | st.floats(0.0, 0.5)),
                fail_after_tokens=draw(st.none() | st.integers(1, max_tokens)),
            )
        )
    return sorted(arrivals, key=lambda a: a.at_s)


@st.composite
def quota_tenants(draw: st.DrawFn) -> TenantRegistry:
    configs = []
    for tid in TENANTS:
        q = TenantQuotas(
            requests_per_s=draw(st.none() | st.sampled_from([4.0, 40.0])),
            requests_burst=None,
            tokens_per_min=draw(st.none() | st.sampled_from([6_000.0, 60_000.0])),
            tokens_burst=None,
            max_concurrent=draw(st.none() | st.integers(1, 3)),
            max_queued=draw(st.none() | st.integers(1, 6)),
            max_queue_wait_s=draw(st.none() | st.sampled_from([0.05, 0.3])),
            max_prompt_tokens=draw(st.none() | st.just(250)),
            max_output_tokens_interactive=draw(st.none() | st.just(20)),
        )
        # Small bursts, so buckets bind within the workload's half second.
        q = dataclasses.replace(
            q,
            requests_burst=2.0 if q.requests_per_s else None,
            tokens_burst=400.0 if q.tokens_per_min else None,
        )
        mode = draw(st.sampled_from(OVER_QUOTA_MODES))
        weight = draw(st.sampled_from([0.5, 1.0, 3.0]))
        configs.append(TenantConfig(tid, weight=weight, quotas=q, over_quota=mode))
    return TenantRegistry(configs)


@pytest.mark.timeout(900)
@PROPS
@given(chaotic_workload(), st.data(), st.sampled_from(["vtc", "fcfs", "rate-limit"]))
def test_everything_returns_to_zero_and_is_charged_exactly_once(
    arrivals: list[Arrival], data: st.DataObject, policy_name: str
) -> None:
    reg = data.draw(quota_tenants())
    drv_policy: QueuePolicy
    if policy_name == "vtc":
        drv_policy = VtcPolicy(reg.weight_of)
    elif policy_name == "fcfs":
        drv_policy = FcfsPolicy()
    else:
        drv_policy = RateLimitPolicy(__import__("scheduler.clock").clock.FakeClock(), 20.0)
    limits = AdmissionLimits(data.draw(st.integers(1, 6)), data.draw(st.sampled_from([200, 900])))
    drv = Driver(
        drv_policy, limits, sim_config(data.draw(st.sampled_from([None, 6.0]))), tenants=reg
    )
    if isinstance(drv_policy, RateLimitPolicy):
        drv_policy.clock = drv.clock
    drv.run(arrivals)
    d = drv.dispatcher
    assert d.queued == 0 and d.in_flight == 0
    assert d.budget.engine.kv_tokens == 0
    assert d.quotas.open_reservations == 0
    assert d.paused_tenants == {}
    assert not d._entries
    assert drv.core.idle and drv.core.used_kv == 0
    # Each request is charged exactly what it used: prompt + output if it ran, else nothing.
    for tid in TENANTS:
        usage = d.quotas.usage(tid)
        if usage is None:
            continue
        ran = [c for c in drv.calls if c.req.tenant_id == tid and c.state == "done"]
        assert usage.queued == 0 and d.budget.engine.requests_of(tid) == 0
        if usage.token_bucket is not None:
            expected = sum(c.req.prompt_tokens + c.output_tokens for c in ran)
            assert usage.charged_tokens == expected
        if usage.request_bucket is not None:
            assert usage.charged_requests == len(ran)
        opened = [c for c in drv.calls if c.req.tenant_id == tid and c.state not in ("rejected",)]
        assert usage.finished_total >= len(opened)


@pytest.mark.timeout(900)
@PROPS
@given(st.data())
def test_no_class_starves_within_a_tenant(data: st.DataObject) -> None:
    n = data.draw(st.integers(1, 4))
    arrivals = []
    for i in range(data.draw(st.integers(10, 60))):
        arrivals.append(
            Arrival(
                at_s=i * data.draw(st.sampled_from([0.0, 0.002])),
                tenant_id=TENANTS[data.draw(st.integers(0, 3))],
                prompt_tokens=data.draw(st.integers(1, 100)),
                max_tokens=data.draw(st.integers(1, 20)),
                priority=data.draw(st.sampled_from(list(Priority))),
            )
        )
    drv = Driver(VtcPolicy(batch_every_n=n), AdmissionLimits(2, 400), sim_config(None))
    drv.run(arrivals)
    assert drv.max_batch_streak <= n
    assert all(c.state == "done" for c in drv.calls)


def test_starvation_check_can_fail_without_the_rule() -> None:
    # The first request takes the only slot; then one batch and 12 interactive queue.
    arrivals = [Arrival(0.0, "a", 10, 5), Arrival(0.0, "a", 10, 5, Priority.BATCH)]
    arrivals += [Arrival(0.0, "a", 10, 5) for _ in range(12)]
    strict = Driver(VtcPolicy(batch_every_n=None), AdmissionLimits(1, 400), sim_config(None))
    strict.run(arrivals)
    assert strict.max_batch_streak == 12
    ruled = Driver(VtcPolicy(batch_every_n=3), AdmissionLimits(1, 400), sim_config(None))
    ruled.run(arrivals)
    assert ruled.max_batch_streak == 3
