"""`bench fleet --mix long`: `bench stagger`'s long-prompt trace (its seeded
generator, `long_prompt_mix`) as a live plan: every arrival gets distinct token
ids of its length, so no prompt shares a prefix with another and every prefill
is cold, as on the virtual fleet."""

from __future__ import annotations

import random

from fairgate.bench.fleet_scenarios import VICTIM, Item, _ids
from fairgate.bench.stagger import HEAVY, long_prompt_mix

LONG_WEIGHTS = {**dict.fromkeys(HEAVY, 1.0), VICTIM: 1.0}


def long_plan(seed: int, seconds: float, workers: int) -> list[Item]:
    """The trace of `workers` engines (the heavy rates scale with them), as Items."""
    rng = random.Random(f"{seed}:long-ids")
    return [
        Item(a.at_s, a.tenant_id, tuple(_ids(rng, a.prompt_tokens)), a.max_tokens)
        for a in long_prompt_mix(seed, seconds, workers)
    ]
