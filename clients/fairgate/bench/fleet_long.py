"""`bench fleet --mix long`: `bench stagger`'s long-prompt trace (its seeded
generator, `long_prompt_mix`) as a live plan: every arrival gets distinct token
ids of its length, so no prompt shares a prefix with another and every prefill
is cold, as on the virtual fleet."""

from __future__ import annotations

import random
from dataclasses import dataclass

from fairgate.bench.fleet_scenarios import VICTIM, FleetScenario, Item, _ids
from fairgate.bench.stagger import HEAVY, long_prompt_mix

LONG_WEIGHTS = {**dict.fromkeys(HEAVY, 1.0), VICTIM: 1.0}


@dataclass(frozen=True)
class LongScenario(FleetScenario):
    """The long-prompt mix on `workers` workers (the heavy rates scale with them,
    as `bench stagger`'s; `load` is not used)."""

    mix: str = "long"

    @property
    def weights(self) -> dict[str, float]:
        return dict(LONG_WEIGHTS)

    def plan(self, seed: int) -> list[Item]:
        rng = random.Random(f"{seed}:long-ids")
        return [
            Item(a.at_s, a.tenant_id, tuple(_ids(rng, a.prompt_tokens)), a.max_tokens)
            for a in long_prompt_mix(seed, self.seconds, self.workers)
        ]


def scenario(mix: str, workers: int, seconds: float, load: float) -> FleetScenario:
    """The scenario of `--mix` (fleet_scenarios.MIXES)."""
    kind = LongScenario if mix == "long" else FleetScenario
    return kind(workers, seconds, load)
