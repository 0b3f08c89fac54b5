"""Isolation by preemption on the engine model: the simulator's model of
SGLang's priority preemption, and a light tenant beside a flood on the
discrete-event driver (the rule alone: tests/unit/scheduler/test_preempt.py)."""

from __future__ import annotations

import itertools

import pytest
from fairgate.bench.event_driver import Driver

from scheduler.budget import AdmissionLimits
from scheduler.ordering.vtc import VtcPolicy
from scheduler.rules import Isolation
from service.engines.protocol import FinishKind, SamplingOptions
from service.engines.simulator.core import SimConfig, SimCore
from service.engines.simulator.hardware import preset
from tests.unit.fleet.helpers import victim_and_flood

PREEMPT = Isolation.PREEMPT
_FIRST_IDS = itertools.count(1000)


def _core(slots: int, threshold: int | None = 10, kv: int = 100_000) -> SimCore:
    return SimCore(
        SimConfig(
            cost=preset(),
            max_running_requests=slots,
            kv_capacity_tokens=kv,
            priority_scheduling=True,
            priority_preemption_threshold=threshold,
        )
    )


def _add(core: SimCore, rid: str, priority: int, prompt: int = 16, out: int = 64) -> None:
    sampling = SamplingOptions(ignore_eos=True)
    # A first token of its own: no prompt is a prefix of another (the prefix cache).
    ids = [next(_FIRST_IDS)] + [1] * (prompt - 1)
    core.add(core.make_request(rid, ids, out, sampling, priority))


def _run(core: SimCore) -> dict[str, int]:
    """Step to the end; rid -> the step its last token came in."""
    done: dict[str, int] = {}
    for step in range(10_000):
        if core.idle:
            return done
        for em in core.step().emissions:
            if em.finish is FinishKind.LENGTH:
                done[em.rid] = step
    raise AssertionError("the simulator does not finish")


def test_sim_retracts_the_latest_lowest_priority_request_for_a_large_gap() -> None:
    core = _core(slots=4)
    for i in range(4):
        _add(core, f"low-{i}", 0)
    core.step()
    _add(core, "urgent", 20, out=8)
    core.step()
    running = {r.rid for r in core.running}
    assert "urgent" in running and "low-3" not in running  # the latest arrival went
    retracted = core._by_rid["low-3"]
    assert retracted.preemptions == 1 and retracted.in_kv == 0 and retracted.generated == 1
    done = _run(core)
    assert done["urgent"] < min(done[f"low-{i}"] for i in range(4))
    assert set(done) == {"urgent", *(f"low-{i}" for i in range(4))}  # all in full
    assert core.used_kv == 0 and core.preemptions == 1


@pytest.mark.parametrize("priority,threshold", [(10, 10), (20, None), (2, 2), (3, 2)])
def test_sim_preempts_only_above_the_threshold_and_the_lowest_priority_first(
    priority: int, threshold: int | None
) -> None:
    core = _core(slots=2, threshold=threshold)
    _add(core, "low-0", 0)
    _add(core, "low-1", 1)
    core.step()
    _add(core, "high", priority)
    core.step()
    preempts = threshold is not None and priority > threshold  # over low-0
    running = {r.rid for r in core.running}
    assert running == ({"high", "low-1"} if preempts else {"low-0", "low-1"})
    _run(core)
    assert core.preemptions == (1 if preempts else 0)


def test_sim_retracts_as_many_as_the_kv_needs_or_none() -> None:
    # Each low request reserves its prompt + part of its output: the urgent one
    # needs the room of two of them.
    core = _core(slots=8, kv=1000)
    for i in range(3):
        _add(core, f"low-{i}", 0, prompt=200, out=100)
    core.step()
    _add(core, "urgent", 20, prompt=500, out=50)
    core.step()
    assert "urgent" in {r.rid for r in core.running}
    assert core.preemptions == 2
    assert [r.rid for r in core.running if r.rid.startswith("low")] == ["low-0"]
    _run(core)


def _victim_beside_flood(isolation: Isolation, fraction: float) -> tuple[list[float], Driver]:
    arrivals = victim_and_flood()
    # fairgate's room is the engine's: the flood fills every slot.
    sim = SimConfig(
        cost=preset(), max_running_requests=32, kv_capacity_tokens=40_000, priority_scheduling=True
    )
    drv = Driver(
        VtcPolicy(light_credit=4096.0),
        AdmissionLimits(32, 36_000),
        sim,
        reserve_fraction=fraction,
        isolation=isolation,
    )
    drv.run(arrivals)
    ttfts = sorted(
        c.first_token_s - c.arrival.at_s
        for c in drv.calls
        if c.arrival.tenant_id == "victim" and c.arrival.at_s > 6.0 and c.first_token_s is not None
    )
    return ttfts, drv


def test_preemption_lets_a_victim_in_at_once_and_keeps_the_engine_full() -> None:
    plain, plain_drv = _victim_beside_flood(Isolation.RESERVE, 0.0)
    preempt, drv = _victim_beside_flood(PREEMPT, 1 / 8)
    assert len(plain) == len(preempt) >= 6
    # Without it the victim waits for a flood request to end; with it, one is
    # retracted for it (the engine's priority preemption) and it starts at once.
    assert max(plain) > 1.0
    # At once: the engine step under way, then its own, with at most one prefill
    # chunk (flood prompts admitted in the same pass share it, as in SGLang).
    sim = drv.core.config
    step_s = sim.cost.step_s(sim.chunked_prefill_size, sim.max_running_requests, sim.kv_capacity)
    assert max(preempt) < 2 * step_s < 1.0
    assert drv.core.preemptions >= len(preempt)
    # Every request still ran to the end; the dispatcher's books are closed.
    assert all(c.state == "done" for c in drv.calls)
    assert drv.dispatcher.in_flight == 0 and drv.dispatcher.budget.engine.kv_tokens == 0
    flood = [c for c in drv.calls if c.arrival.tenant_id == "flood"]
    assert sum(c.output_tokens for c in flood) == 256 * len(flood)
    assert plain_drv.core.preemptions == 0


def test_sim_retracts_only_what_ran_before_the_pass_and_requeues_after_it() -> None:
    # SGLang takes any int: at -2 a newcomer one priority *below* may preempt.
    # Within one scheduling pass the retracted request does not come back (it
    # would retract the newcomer in turn), as in SGLang's preempt_list.
    core = _core(slots=2, threshold=-2)
    _add(core, "a", 1)
    _add(core, "b", 1)
    core.step()
    _add(core, "lower", 0)
    core.step()
    assert {r.rid for r in core.running} == {"a", "lower"}
    assert [r.rid for r in core.waiting] == ["b"] and core.preemptions == 1
