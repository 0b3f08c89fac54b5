"""Admission budget: the engine gets a request only while it has room.

Room is counted in in-flight requests and in in-flight KV tokens (prompt +
max output), against targets derived from the engine's reported capacity.
"""

from __future__ import annotations

from scheduler.request import QueuedRequest
from scheduler.rules import AdmissionLimits

__all__ = ["AdmissionBudget", "AdmissionLimits"]


class AdmissionBudget:
    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        self.in_flight_requests = 0
        self.in_flight_kv_tokens = 0

    def reserve(self, req: QueuedRequest) -> None:
        self.in_flight_requests += 1
        self.in_flight_kv_tokens += req.kv_tokens

    def release(self, req: QueuedRequest) -> None:
        self.in_flight_requests -= 1
        self.in_flight_kv_tokens -= req.kv_tokens
        if self.in_flight_requests < 0 or self.in_flight_kv_tokens < 0:
            raise AssertionError(f"admission budget released twice: {req.request_id}")
