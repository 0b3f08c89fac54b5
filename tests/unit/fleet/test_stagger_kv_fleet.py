"""The long mix on two engines of `bench fleet`'s KV (16 k tokens each, admission
at kv_target_fraction of them) on the virtual fleet: what live paid (issue #33,
docs/benchmarks.md "Long mix on two workers: traced")."""

from __future__ import annotations

from fairgate.bench.stagger import (
    LIGHT,
    SETTINGS,
    fleet,
    long_prompt_mix,
    tokens_per_s,
)

from service.engines.stagger import Stagger

KV = 16_000


def test_the_engines_and_admission_are_the_live_workers() -> None:
    drv = fleet(long_prompt_mix(1, 2.0, 2), 2, None, kv_tokens=KV)
    assert [w.core.capacity for w in drv.workers] == [KV, KV]
    assert drv.dispatcher.budget.limits.max_kv_tokens == int(2 * KV * SETTINGS.kv_target_fraction)


def test_stagger_parks_no_prompt_where_the_kv_is_full_so_the_light_tenant_is_not_held() -> None:
    """Seed 2: parked on the one busy worker, the long prompts filled admission's
    budget and the light tenant waited 1.8 s in fairgate's queue, at 0.87 of the
    tokens/s; kept off the free worker only where they fit, it waits for none."""
    arrivals = long_prompt_mix(2, 20.0, 2)
    none = fleet(arrivals, 2, None, kv_tokens=KV)
    drv = fleet(arrivals, 2, Stagger(min_tokens=1024, min_workers=2), kv_tokens=KV)
    waits = [c.admitted_s - c.arrival.at_s for c in drv.calls if c.arrival.tenant_id == LIGHT]
    assert all(c.admitted_s is not None for c in drv.calls)
    assert max(waits) < 0.1
    assert tokens_per_s(drv) >= 0.95 * tokens_per_s(none)
    assert drv.placements[0].stagger is not None and drv.placements[0].stagger.kept_free > 0
