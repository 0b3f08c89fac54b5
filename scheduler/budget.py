"""Admission budget: the engine gets a request only while it has room.

Room is counted in in-flight requests and in in-flight KV tokens (prompt +
max output), against targets derived from the engine's reported capacity.
The counts are an `InFlight` (admission_state.py), per tenant too: the
in-process reserve reads its tenants' loads there.
"""

from __future__ import annotations

from scheduler.admission_state import InFlight
from scheduler.request import QueuedRequest
from scheduler.rules import AdmissionLimits

__all__ = ["AdmissionBudget", "AdmissionLimits"]


class AdmissionBudget:
    def __init__(self, limits: AdmissionLimits) -> None:
        self.limits = limits
        # What is in flight, in all and per tenant.
        self.engine = InFlight()

    def reserve(self, req: QueuedRequest) -> None:
        self.engine.open(req.tenant_id, req.kv_tokens)

    def release(self, req: QueuedRequest) -> None:
        self.engine.release(req.tenant_id, req.kv_tokens)
