"""Fair-share reserve: the bookkeeping behind `rules.below_share`.

Admission is not preemptive: once a flooding tenant fills every engine slot,
a light tenant that arrives must wait for one of the flood's requests to end
(VTC alone left a modest tenant beside a 10x flood at ~30x its solo TTFT).
So the last `fraction` of the engine's room only takes the next tenant in
line while it is below its weighted share of the engine (shares split among
the *active* tenants: queued or in flight); otherwise the round stops and the
reserve waits for a tenant that needs it (`rules.verdict`, HOLD). The rule
never reorders VTC — it only delays the head — so it cannot cost a tenant its
fair service, only leave at most the reserve idle.

This class keeps each active tenant's load for the in-process dispatcher; the
shared stores keep the same counts fleet-wide (`MemoryStore`, the Redis STEP
script).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler.request import QueuedRequest
from scheduler.rules import TenantLoad


@dataclass(slots=True)
class _Load:
    queued: int = 0
    in_flight: int = 0
    kv_tokens: int = 0

    @property
    def active(self) -> bool:
        return self.queued > 0 or self.in_flight > 0


class FairShareReserve:
    def __init__(self, fraction: float, weight_of: Callable[[str], float]) -> None:
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"reserve fraction must be in [0, 1), got {fraction}")
        self.fraction = fraction
        self.weight_of = weight_of
        self._load: dict[str, _Load] = {}
        self._active_weight = 0.0

    @property
    def enabled(self) -> bool:
        return self.fraction > 0.0

    def _update(self, tenant_id: str, queued: int = 0, in_flight: int = 0, kv: int = 0) -> None:
        load = self._load.get(tenant_id)
        if load is None:
            load = self._load[tenant_id] = _Load()
        was_active = load.active
        load.queued += queued
        load.in_flight += in_flight
        load.kv_tokens += kv
        if load.active != was_active:
            self._active_weight += self.weight_of(tenant_id) * (1 if load.active else -1)
        if not load.active:
            del self._load[tenant_id]

    # -- bookkeeping (called by the dispatcher) -------------------------------
    def on_queued(self, req: QueuedRequest) -> None:
        self._update(req.tenant_id, queued=1)

    def on_dequeued(self, req: QueuedRequest) -> None:
        self._update(req.tenant_id, queued=-1)

    def on_admitted(self, req: QueuedRequest) -> None:
        self._update(req.tenant_id, queued=-1, in_flight=1, kv=req.kv_tokens)

    def on_finished(self, req: QueuedRequest) -> None:
        self._update(req.tenant_id, in_flight=-1, kv=-req.kv_tokens)

    def reweigh(self) -> None:
        """Tenant weights changed: recompute the active weight."""
        self._active_weight = sum(self.weight_of(t) for t in self._load)

    # -- what the rule needs ---------------------------------------------------
    def load(self, tenant_id: str) -> TenantLoad:
        """The tenant's share of the engine and its part in flight."""
        load = self._load.get(tenant_id)
        if load is None or self._active_weight <= 0:
            return TenantLoad(1.0, 0, 0)
        return TenantLoad(
            self.weight_of(tenant_id) / self._active_weight, load.in_flight, load.kv_tokens
        )
