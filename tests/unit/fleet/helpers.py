"""Traces for the virtual fleet's tests."""

from __future__ import annotations

import random

from fairgate.bench.event_driver import Arrival


def victim_and_flood(seconds: float = 14.0) -> list[Arrival]:
    """A victim at 1 request/s beside a flood at 60/s, 256/256 tokens each (seeded)."""
    rng = random.Random(7)
    arrivals = []
    for tenant, rate in (("victim", 1.0), ("flood", 60.0)):
        t = rng.expovariate(rate)
        while t < seconds:
            arrivals.append(Arrival(t, tenant, 256, 256))
            t += rng.expovariate(rate)
    return sorted(arrivals, key=lambda a: a.at_s)
