"""Fair-share reserve: the last slots of the engine go to tenants below their share.

Admission is not preemptive: once a flooding tenant fills every engine slot,
a light tenant that arrives must wait for one of the flood's requests to end,
however small its virtual counter. With equal-length requests those ends come
in waves, so the wait is long (VTC alone leaves a modest tenant beside a 10x
flood at ~30x its solo TTFT in our benchmark).

The rule: when admitting a request would leave fewer than `reserve` free
request slots (or KV tokens), only a tenant whose in-flight requests and KV
tokens are below its weighted share of the engine may take it. Shares are
split among *active* tenants (queued or in flight). A tenant alone is never
held back, so the gate stays work-conserving for a single tenant; with
several active tenants, at most the reserve sits idle while nobody under
share needs it. Nor is a tenant with nothing in flight (else a request larger
than its share of the KV would wait until every other tenant went idle).

`in_reserve` and `below_share` are the rule alone; the shared stores
(`memory_store.py`, the Redis STEP script) apply it fleet-wide.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.request import QueuedRequest


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
        self.holds_total = 0

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

    # -- the rule -------------------------------------------------------------
    def allows(self, req: QueuedRequest, budget: AdmissionBudget) -> bool:
        """May `req` be admitted now? (The budget has already said it fits.)"""
        if not self.enabled:
            return True
        limits = budget.limits
        if not in_reserve(
            self.fraction,
            limits,
            budget.in_flight_requests,
            budget.in_flight_kv_tokens,
            req.kv_tokens,
        ):
            return True
        load = self._load.get(req.tenant_id)
        if load is None or self._active_weight <= 0:
            return True
        share = self.weight_of(req.tenant_id) / self._active_weight
        below = below_share(share, limits, load.in_flight, load.kv_tokens, req.kv_tokens)
        if not below:
            self.holds_total += 1
        return below


# The rule itself, shared with the stores' fleet-wide decision (memory_store.py
# and the Redis STEP script, which must compute the same).
def in_reserve(
    fraction: float, limits: AdmissionLimits, in_flight: int, in_flight_kv: int, kv_tokens: int
) -> bool:
    """Would admitting `kv_tokens` more take the engine into its last `fraction`?"""
    reserve_requests = math.ceil(limits.max_requests * fraction)
    reserve_kv = limits.max_kv_tokens * fraction
    return (
        in_flight + 1 > limits.max_requests - reserve_requests
        or in_flight_kv + kv_tokens > limits.max_kv_tokens - reserve_kv
    )


def below_share(
    share: float, limits: AdmissionLimits, tenant_in_flight: int, tenant_kv: int, kv_tokens: int
) -> bool:
    """Is a tenant with weighted `share` of the engine below it with one more request?

    Alone (share 1) always; a tenant with nothing in flight always (a request
    larger than its share of the KV must not wait for the others to go idle).
    """
    if share >= 1.0 - 1e-9 or tenant_in_flight == 0:
        return True
    return (
        tenant_in_flight < share * limits.max_requests
        and tenant_kv + kv_tokens <= share * limits.max_kv_tokens
    )
