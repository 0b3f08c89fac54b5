"""Fair-share reserve on the simulator: a victim beside a flood (the rule
alone: tests/unit/scheduler/test_reserve.py)."""

from __future__ import annotations

from fairgate.bench.event_driver import Driver

from scheduler.budget import AdmissionLimits
from scheduler.ordering.fcfs import FcfsPolicy
from scheduler.ordering.vtc import VtcPolicy
from service.engines.simulator.core import SimConfig
from service.engines.simulator.hardware import preset
from tests.unit.fleet.helpers import victim_and_flood


def _victim_beside_flood(policy_name: str, fraction: float) -> tuple[list[float], int]:
    arrivals = victim_and_flood()
    policy = VtcPolicy() if policy_name == "vtc" else FcfsPolicy()
    sim = SimConfig(cost=preset(), max_running_requests=32, kv_capacity_tokens=20000)
    drv = Driver(policy, AdmissionLimits(32, 18000), sim, reserve_fraction=fraction)
    drv.run(arrivals)
    waits = sorted(
        c.admitted_s - c.arrival.at_s
        for c in drv.calls
        # After the first wave: requests the flood admitted while it was alone
        # hold every slot until they end, whatever the policy (no preemption).
        if c.arrival.tenant_id == "victim" and c.arrival.at_s > 5.0 and c.admitted_s is not None
    )
    return waits, sum(c.output_tokens for c in drv.calls)


def test_reserve_lets_a_victim_in_beside_a_flood_at_no_throughput_cost() -> None:
    plain, plain_tokens = _victim_beside_flood("vtc", 0.0)
    reserved, reserved_tokens = _victim_beside_flood("vtc", 1 / 8)
    fcfs, _ = _victim_beside_flood("fcfs", 0.0)
    assert len(plain) == len(reserved) >= 6
    # Without the reserve the victim waits for the flood's waves to end.
    assert max(plain) > 1.0
    assert max(reserved) < 0.3
    assert min(fcfs) > 10.0
    # Every request still ran to the end: no tokens were lost to idle slots.
    assert reserved_tokens == plain_tokens
