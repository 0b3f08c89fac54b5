"""Admission budget: the engine gets a request only while it has room.

Room is counted in in-flight requests and in in-flight KV tokens (prompt +
max output), against targets derived from the engine's reported capacity.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.request import QueuedRequest


@dataclass(frozen=True, slots=True)
class AdmissionLimits:
    max_requests: int
    max_kv_tokens: int

    def __post_init__(self) -> None:
        if self.max_requests < 1 or self.max_kv_tokens < 1:
            raise ValueError(f"admission limits must be >= 1: {self}")


class AdmissionBudget:
    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self.in_flight_requests = 0
        self.in_flight_kv_tokens = 0

    def fits(self, req: QueuedRequest) -> bool:
        if self.in_flight_requests >= self.limits.max_requests:
            return False
        # An idle engine always takes the next request, however large, so a
        # request bigger than the KV target cannot starve (validation caps it
        # at the model's context anyway).
        if self.in_flight_requests == 0:
            return True
        return self.in_flight_kv_tokens + req.kv_tokens <= self.limits.max_kv_tokens

    def reserve(self, req: QueuedRequest) -> None:
        self.in_flight_requests += 1
        self.in_flight_kv_tokens += req.kv_tokens

    def release(self, req: QueuedRequest) -> None:
        self.in_flight_requests -= 1
        self.in_flight_kv_tokens -= req.kv_tokens
        if self.in_flight_requests < 0 or self.in_flight_kv_tokens < 0:
            raise AssertionError(f"admission budget released twice: {req.request_id}")
