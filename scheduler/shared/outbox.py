"""What a replica owes the shared store: settlements, batched counter charges,
and the tenants it forgot (sent with the next step, like settlements).

Settlements (a lease ended; refunds of unused bucket reservations) are sent
with the next step, at once. Output-token charges to the fair counters are
batched per tenant and flushed every `flush_s` (or with the next step). A
step that failed hands its share back (`requeue`), ahead of what came since,
so nothing owed is lost while the store is down; replaying a settlement is
idempotent in the store.
"""

from __future__ import annotations

import math

from scheduler.quotas import BucketLimits
from scheduler.state.store import Settlement, Step


class Outbox:
    def __init__(self, flush_s: float) -> None:
        self.flush_s = flush_s
        self.settlements: list[Settlement] = []
        self.charges: dict[str, float] = {}
        # Tenants forgotten here, for the store to forget too (Step.forget).
        self.forget: dict[str, BucketLimits] = {}
        # When the batched charges are due (inf: none batched since the last send).
        self.flush_due_s = math.inf

    @property
    def owed_now(self) -> bool:
        """Something goes with the next step at once (settlements, forgotten tenants)."""
        return bool(self.settlements or self.forget)

    def settle(self, s: Settlement) -> None:
        self.settlements.append(s)

    def charge(self, tenant_id: str, delta: float) -> None:
        self.charges[tenant_id] = self.charges.get(tenant_id, 0.0) + delta

    def charge_output(self, tenant_id: str, delta: float, now_s: float) -> bool:
        """Batch an output charge; True if this starts a batch (the pump must wake)."""
        self.charge(tenant_id, delta)
        if self.flush_due_s == math.inf or self.flush_due_s < now_s:
            self.flush_due_s = now_s + self.flush_s
            return True
        return False

    def take_into(self, step: Step) -> Step:
        """Move everything owed into `step`."""
        step.settlements, self.settlements = self.settlements, []
        step.charges, self.charges = self.charges, {}
        step.forget, self.forget = self.forget, {}
        return step

    def sent(self) -> None:
        """A step carrying the batch went out (answered or not): the next batch starts afresh."""
        self.flush_due_s = math.inf

    def requeue(self, step: Step) -> None:
        """`step` failed: owe its settlements and charges again, ahead of newer ones."""
        self.settlements[:0] = step.settlements
        for tenant, delta in step.charges.items():
            self.charge(tenant, delta)
        for tenant, limits in step.forget.items():
            self.forget.setdefault(tenant, limits)
