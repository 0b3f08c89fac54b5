"""The engine's room: what a request may occupy (`kv_tokens`), the engine's
limits, and whether one more request fits them."""

from __future__ import annotations

import math
from dataclasses import dataclass


def kv_tokens(prompt_tokens: int, max_tokens: int) -> int:
    """KV-cache tokens a request may occupy at most: what admission, the token
    quotas and the pool's routing count it as."""
    return prompt_tokens + max_tokens


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_requests: int
    max_kv_tokens: int

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_kv_tokens < 1:
            raise ValueError(f"admission limits must be >= 1: {self}")


def fits(limits: AdmissionLimits, in_flight: int, in_flight_kv: int, kv_tokens: int) -> bool:
    """Does one more request of `kv_tokens` fit the engine's room? An idle engine
    always takes the next request, however large, so it cannot starve."""
    if in_flight >= limits.max_requests:
        return False
    return in_flight == 0 or in_flight_kv + kv_tokens <= limits.max_kv_tokens


def fraction_of_room(fraction: float, limits: AdmissionLimits) -> tuple[int, float]:
    """`fraction` of the engine's room, kept (RESERVE) or lent (PREEMPT): requests
    (rounded up: at least one) and KV tokens."""
    return math.ceil(limits.max_requests * fraction), limits.max_kv_tokens * fraction
