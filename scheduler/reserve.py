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

This class keeps each active tenant's load for the in-process dispatcher; the
shared stores keep the same counts fleet-wide (`MemoryStore`, the Redis STEP
script).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from scheduler import rules
from scheduler.clock import Clock
from scheduler.decision import tenant_load
from scheduler.request import QueuedRequest
from scheduler.rules import AdmissionLimits, TenantLoad


@dataclass(slots=True)
class _Load:
    queued: int = 0
    in_flight: int = 0
    kv_tokens: int = 0

    @property
    def active(self) -> bool:
        return self.queued > 0 or self.in_flight > 0


class FairShareReserve:
    def __init__(
        self,
        fraction: float,
        weight_of: Callable[[str], float],
        clock: Clock | None = None,
        window_s: float = 0.0,
    ) -> None:
        """`window_s`: a tenant stays active this long after its last request
        left (a light tenant between two requests is still one to keep room for)."""
        if not 0.0 <= fraction < 1.0:
            raise ValueError(f"reserve fraction must be in [0, 1), got {fraction}")
        self.fraction = fraction
        self.weight_of = weight_of
        self.clock = clock
        self.window_s = window_s if clock is not None else 0.0
        self._load: dict[str, _Load] = {}
        # Tenant -> until when it counts as active after it stopped being queued
        # or in flight (`rules.active_until`).
        self._seen: dict[str, float] = {}

    def _update(self, tenant_id: str, queued: int = 0, in_flight: int = 0, kv: int = 0) -> None:
        load = self._load.get(tenant_id)
        if load is None:
            load = self._load[tenant_id] = _Load()
        load.queued += queued
        load.in_flight += in_flight
        load.kv_tokens += kv
        if not load.active:
            del self._load[tenant_id]
            if self.window_s > 0 and self.clock is not None:
                self._seen[tenant_id] = rules.active_until(self.clock.now_s(), self.window_s)

    # -- bookkeeping (called by the dispatcher) -------------------------------
    def on_queued(self, req: QueuedRequest) -> None:
        self._update(req.tenant_id, queued=1)
        self._seen.pop(req.tenant_id, None)

    def on_dequeued(self, req: QueuedRequest) -> None:
        self._update(req.tenant_id, queued=-1)

    def on_admitted(self, req: QueuedRequest) -> None:
        self._update(req.tenant_id, queued=-1, in_flight=1, kv=req.kv_tokens)

    def on_finished(self, req: QueuedRequest) -> None:
        self._update(req.tenant_id, in_flight=-1, kv=-req.kv_tokens)

    def queued(self, tenant_id: str) -> int:
        load = self._load.get(tenant_id)
        return load.queued if load is not None else 0

    # -- what the rule needs ---------------------------------------------------
    def load(self, tenant_id: str, limits: AdmissionLimits) -> TenantLoad:
        """The tenant's load among the tenants active here (`decision.tenant_load`)."""
        if self._seen and self.clock is not None:
            now_s = self.clock.now_s()
            for t in [
                t for t, until_s in self._seen.items() if not rules.still_active(until_s, now_s)
            ]:
                del self._seen[t]
        return tenant_load(
            tenant_id,
            [*self._load, *self._seen],
            limits,
            self.weight_of,
            self.queued,
            self._in_flight,
        )

    def _in_flight(self, tenant_id: str) -> tuple[int, int]:
        load = self._load.get(tenant_id)
        return (load.in_flight, load.kv_tokens) if load is not None else (0, 0)
