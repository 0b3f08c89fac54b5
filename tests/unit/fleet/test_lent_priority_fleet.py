"""The long mix on engines that preempt by priority (as `bench fleet`'s live
workers): the lent priority, which makes the engine retract a running request,
goes to the light tenant's short requests only (issue #33; docs/benchmarks.md
"Engines that preempt, on the virtual fleet")."""

from __future__ import annotations

from fairgate.bench.event_driver import Arrival, Driver
from fairgate.bench.stagger import (
    ENGINE_MODES,
    LIGHT,
    fleet,
    levers,
    light_ttft_s,
    long_prompt_mix,
    prefix_heavy_mix,
    quantile,
)

from scheduler import rules
from service.engines.sglang_chunks import SGLANG_PREEMPTION_THRESHOLD

KV = 16_000
LEVERS = levers(1024, 2.0, 128, 256, 256)["all-cold+kv"]


def _fleet(arrivals: list[Arrival], mode: str) -> Driver:
    """Four engines of KV tokens each, preempting as `mode` says, the levers on."""
    return fleet(
        arrivals,
        4,
        LEVERS.stagger(),
        LEVERS.staged(),
        kv_events=True,
        kv_tokens=KV,
        mode=ENGINE_MODES[mode],
    )


def test_only_short_light_requests_are_sent_to_retract_a_running_one() -> None:
    """Seed 1: every tenant's queue is short on four engines with room, so
    admission called the heavy tenants light and lent them room; sent with the
    lent priority, their 1-3 k-token prompts ran beside the chat request, of the
    same rank, which waited 643 ms behind their prefill steps. Now only short
    prompts carry it, and the chat tenant's slowest first token is a few steps."""
    drv = _fleet(long_prompt_mix(1, 30.0, 4), "preempt")
    lent = [c for c in drv.calls if c.engine_priority > SGLANG_PREEMPTION_THRESHOLD]
    assert lent, "no request was lent room: the test shows nothing"
    assert all(c.arrival.prompt_tokens <= rules.LIGHT_PREFILL_TOKENS for c in lent)
    assert LIGHT in {c.arrival.tenant_id for c in lent}
    assert quantile(light_ttft_s(drv), 1.0) < 0.2


def test_beside_the_reserve_only_fair_light_takes_slot_sends_the_lent_priority() -> None:
    """`auto` keeps the reserve beside the levers: no request goes out to retract a
    running one. With fair_light_takes_slot (`auto+slot`) light requests do where
    their soonest worker is full: the light tenant's, and a short-prefill request of
    a tenant below its share, which admission calls light too (the prefix mix: there
    the workers' slots bind)."""

    def lent(mode: str) -> list[str]:
        drv = _fleet(prefix_heavy_mix(1, 30.0, 4), mode)
        return [
            c.arrival.tenant_id
            for c in drv.calls
            if c.engine_priority > SGLANG_PREEMPTION_THRESHOLD
        ]

    assert lent("auto") == []
    taken = lent("auto+slot")
    assert taken, "no light request found its soonest worker full: the test shows nothing"
    assert LIGHT in taken
