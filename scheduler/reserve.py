"""Fair-share reserve: the bookkeeping behind `rules.below_share`.

Admission is not preemptive: once a flooding tenant fills every engine slot,
a light tenant that arrives must wait for one of the flood's requests to end
(VTC alone left a modest tenant beside a 10x flood at ~30x its solo TTFT).
So the last `fraction` of the engine's room only takes the next tenant in
line while it is below its weighted share of the engine (shares split among
the *active* tenants: queued or in flight); otherwise the round stops and the
reserve waits for a tenant that needs it (`rules.verdict`, HOLD) — only if
one exists: another active tenant with nothing queued (in flight, or seen
within `window_s`) below its share. The rule never reorders VTC — it only
delays the head — so it cannot cost a tenant its fair service; and tenants
that are all queued are served in counter order anyway, so no room idles for
them.

This class keeps each tenant's queue length and the tenants seen within the
window for the in-process dispatcher; what each has in flight is the budget's
(`InFlight`, admission_state.py), the one count of the engine. The shared
stores keep the same counts fleet-wide (`MemoryStore` with the same classes,
the Redis STEP script).
"""

from __future__ import annotations

from collections.abc import Callable

from scheduler.admission_state import ActiveWindow, InFlight
from scheduler.clock import Clock
from scheduler.decision import tenant_load
from scheduler.request import QueuedRequest
from scheduler.rules import AdmissionLimits, TenantLoad


class FairShareReserve:
    def __init__(
        self,
        fraction: float,
        weight_of: Callable[[str], float],
        clock: Clock | None = None,
        window_s: float = 0.0,
        *,
        engine: InFlight,
    ) -> None:
        """`engine`: what is in flight (the budget's). `window_s`: a tenant stays
        active this long after its last request left (a light tenant between two
        requests is still one to keep room for)."""
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"reserve fraction must be in [0, 1), got {fraction}")
        self.fraction = fraction
        self.weight_of = weight_of
        self.clock = clock
        self.window_s = window_s if clock is not None else 0.0
        self.engine = engine
        self._queued: dict[str, int] = {}
        self.seen = ActiveWindow()

    def _left(self, tenant_id: str) -> None:
        """Nothing queued: if nothing is in flight either, it starts its window."""
        if self.clock is not None and tenant_id not in self.engine:
            self.seen.left(tenant_id, self.clock.now_s(), self.window_s)

    def _dequeue(self, tenant_id: str) -> None:
        n = self._queued[tenant_id] - 1
        if n:
            self._queued[tenant_id] = n
        else:
            del self._queued[tenant_id]

    # -- bookkeeping (called by the dispatcher) -------------------------------
    def on_queued(self, req: QueuedRequest) -> None:
        self._queued[req.tenant_id] = self._queued.get(req.tenant_id, 0) + 1
        self.seen.back(req.tenant_id)

    def on_dequeued(self, req: QueuedRequest) -> None:
        self._dequeue(req.tenant_id)
        if req.tenant_id not in self._queued:
            self._left(req.tenant_id)

    def on_admitted(self, req: QueuedRequest) -> None:
        """After the budget opened it (in flight: still active)."""
        self._dequeue(req.tenant_id)

    def on_finished(self, req: QueuedRequest) -> None:
        """After the budget released it."""
        if req.tenant_id not in self._queued:
            self._left(req.tenant_id)

    def queued(self, tenant_id: str) -> int:
        return self._queued.get(tenant_id, 0)

    # -- what the rule needs ---------------------------------------------------
    def load(self, tenant_id: str, limits: AdmissionLimits) -> TenantLoad:
        """The tenant's load among the tenants active here (`decision.tenant_load`)."""
        seen = self.seen.active(self.clock.now_s()) if self.seen and self.clock else []
        return tenant_load(
            tenant_id,
            [*self._queued, *self.engine.tenants(), *seen],
            limits,
            self.weight_of,
            self.queued,
            self.engine.of,
        )
