"""An API key's own limits, always within its tenant's.

A key may carry the tenant's bucket quotas (`requests_per_s`, `requests_burst`,
`tokens_per_min`, `tokens_burst`: the same fields, ranges and bucket semantics
as `TenantQuotas`, so they are a `TenantQuotas` with only those set), a
`max_concurrent`, the priorities it may send and its own budgets (the tenant's
`Budget`, checked against the key's own spend: service/budget_check.py). Two
rules, stated here once:

- at issue/update a key limit above its tenant's, a priority the tenant does
  not allow, or a budget's tokens/requests above the tenant's budget for that
  period, is refused (`problems`, every one listed);
- the tenant may be lowered later: what is enforced is the tighter of the two
  (`scheduler/key_gate.py: effective_limits`), so a key never gets more than
  its tenant.

Fair sharing stays per tenant; a key's limits are an extra gate
(scheduler/key_gate.py) in front of its tenant's.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from scheduler.request import Priority
from scheduler.tenancy.budgets import Budget, budget_problems
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas

# The TenantQuotas fields a key may set (the rest are the tenant's alone).
KEY_QUOTA_FIELDS = (
    "requests_per_s",
    "requests_burst",
    "tokens_per_min",
    "tokens_burst",
    "max_concurrent",
)
Problem = tuple[str, str]


@dataclass(frozen=True, slots=True)
class KeyLimits:
    quotas: TenantQuotas = field(default_factory=TenantQuotas)
    # None: whatever the tenant allows.
    priorities: frozenset[Priority] | None = None
    # Checked against the key's own spend, besides its tenant's budgets.
    budgets: tuple[Budget, ...] = ()

    @property
    def empty(self) -> bool:
        return self.priorities is None and self.quotas == TenantQuotas() and not self.budgets

    def problems(self, tenant: TenantConfig | None) -> list[Problem]:
        """(field, what to fix) for every bad value: its own range, a field keys
        cannot set, or above `tenant`'s (None: the tenant is unknown here)."""
        q = self.quotas
        out = [(f"quotas.{name}", msg) for name, msg in q.problems()]
        for name in TenantQuotas.__dataclass_fields__:
            if name not in KEY_QUOTA_FIELDS and getattr(q, name) is not None:
                known = ", ".join(KEY_QUOTA_FIELDS)
                out.append((f"quotas.{name}", f"not a key limit (a key may set: {known})"))
        if self.priorities is not None and not self.priorities:
            out.append(("priorities", "allow at least one priority class (or leave it out)"))
        out += budget_problems(self.budgets)
        if tenant is None:
            return out
        tq, tid = tenant.quotas, tenant.tenant_id
        above = {
            "requests_per_s": tq.requests_per_s,
            "requests_burst": tq.request_burst,
            "tokens_per_min": tq.tokens_per_min,
            "tokens_burst": tq.token_burst,
            "max_concurrent": tq.max_concurrent,
        }
        bad = {f for f, _ in out}
        for name, ceiling in above.items():
            mine = getattr(q, name)
            if f"quotas.{name}" in bad or mine is None or ceiling is None or mine <= ceiling:
                continue
            out.append(
                (
                    f"quotas.{name}",
                    f"{mine:g} is above tenant {tid!r}'s {name} ({ceiling:g}); "
                    "a key never gets more than its tenant",
                )
            )
        if self.priorities:
            extra = sorted(p.name.lower() for p in self.priorities - tenant.priorities)
            if extra:
                allowed = sorted(p.name.lower() for p in tenant.priorities)
                out.append(
                    (
                        "priorities",
                        f"tenant {tid!r} does not allow {extra} (allowed: {allowed})",
                    )
                )
        return out + _budgets_above(self.budgets, tenant, {f for f, _ in out})


def _budgets_above(
    budgets: tuple[Budget, ...], tenant: TenantConfig, bad: set[str]
) -> list[Problem]:
    """A key budget's tokens/requests above its tenant's budget for the same period
    (a period the tenant does not budget: the key's is the only one)."""
    theirs = {b.period: b for b in tenant.budgets}
    out: list[Problem] = []
    for i, mine in enumerate(budgets):
        ceiling = theirs.get(mine.period)
        for name in ("tokens", "requests"):
            field_ = f"budgets[{i}].{name}"
            value, cap = getattr(mine, name), getattr(ceiling, name, None)
            if field_ in bad or value is None or cap is None or value <= cap:
                continue
            out.append(
                (
                    field_,
                    f"{value} is above the {mine.period} budget of tenant {tenant.tenant_id!r} "
                    f"({cap} {name}); a key never gets more than its tenant",
                )
            )
    return out


NO_KEY_LIMITS = KeyLimits()
