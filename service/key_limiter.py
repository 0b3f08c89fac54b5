"""The calling API key's own limits, for one request (scheduler/key_gate.py).

`KeyLimiter.check(identity)` reads the key's limits from the tenant directory
(the store's snapshot this replica last loaded) and its tenant's config, and
returns what the request must pass (`KeyCheck`: the gate, the key, the limits
in force = the tighter of key and tenant, and the key's own budgets, which
service/budget_check.py checks against the key's spend), or None for a key
without limits, a request without a key, or a key this replica does not know
yet.
"""

from __future__ import annotations

from dataclasses import dataclass

from scheduler.errors import StoreUnavailable
from scheduler.gate_stats import TenantBuckets
from scheduler.key_gate import EffectiveKeyLimits, KeyGate, effective_limits
from scheduler.tenancy.budgets import Budget
from service.identity import Identity
from service.tenant_directory import TenantDirectory


@dataclass(frozen=True, slots=True)
class KeyCheck:
    gate: KeyGate
    key_id: str
    limits: EffectiveKeyLimits
    budgets: tuple[Budget, ...] = ()

    async def buckets(self) -> TenantBuckets:
        """The key's buckets now; none while its state is unreachable (headers only)."""
        try:
            return await self.gate.buckets(self.key_id, self.limits)
        except StoreUnavailable:
            return None, None


class KeyLimiter:
    def __init__(self, gate: KeyGate, directory: TenantDirectory) -> None:
        self.gate = gate
        self.directory = directory

    def check(self, identity: Identity | None) -> KeyCheck | None:
        if identity is None or not identity.key_id:
            return None
        record = self.directory.snapshot.keys.get(identity.key_id)
        tenant = self.directory.registry.get(identity.tenant_id)
        if record is None or tenant is None or record.limits.empty:
            return None
        limits = effective_limits(record.limits, tenant)
        return KeyCheck(self.gate, identity.key_id, limits, record.limits.budgets)
