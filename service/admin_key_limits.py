"""Admin API protos ⇄ an API key's own limits (scheduler/tenancy/key_limits.py).

The rules (ranges, fields a key may set, within its tenant's) are
`KeyLimits.problems`; here only the proto's own enums and field paths.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable

from fairgate.admin.convert import budget_values
from fairgate.v1 import admin_pb2 as apb

from scheduler.tenancy.key_limits import KEY_QUOTA_FIELDS, KeyLimits
from scheduler.tenancy.tenant_check import read_budget
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas
from service.admin_convert import PRIORITY_FROM_PB, QUOTA_FIELDS
from service.errors import FieldViolation, InvalidRequest

KEY_MASK_PATHS = frozenset(
    {"priorities", "quotas", *(f"quotas.{q}" for q in KEY_QUOTA_FIELDS), "budgets"}
)


def limits_from_proto(
    msg: apb.ApiKeyLimits, path: str = "limits"
) -> tuple[KeyLimits, list[FieldViolation]]:
    """The limits `msg` declares, and what is wrong with its enums (the values are
    judged by `judged`, once whole)."""
    out: list[FieldViolation] = []
    priorities = []
    for i, p in enumerate(msg.priorities):
        if p in PRIORITY_FROM_PB:
            priorities.append(PRIORITY_FROM_PB[p])
        else:
            bad = "use PRIORITY_CLASS_INTERACTIVE or _BATCH"
            out.append(FieldViolation(f"{path}.priorities[{i}]", bad))
    quotas = {
        name: getattr(msg.quotas, name)
        for name in QUOTA_FIELDS
        if msg.quotas.HasField(name)  # type: ignore[arg-type]
    }
    kinds: list[tuple[str, str]] = []
    budgets = tuple(
        read_budget(budget_values(b), f"budgets[{i}]", False, kinds)
        for i, b in enumerate(msg.budgets)
    )
    out += [FieldViolation(f"{path}.{f}", m) for f, m in kinds]
    limits = KeyLimits(
        TenantQuotas(**quotas), frozenset(priorities) if priorities else None, budgets
    )
    return limits, out


def judged(limits: KeyLimits, tenant: TenantConfig, path: str = "limits") -> list[FieldViolation]:
    """Every problem of `limits` for a key of `tenant` (KeyLimits.problems)."""
    return [FieldViolation(f"{path}.{f}", m) for f, m in limits.problems(tenant)]


def masked(current: KeyLimits, patch: KeyLimits, paths: Iterable[str]) -> KeyLimits:
    """`current` with the masked fields taken from `patch` (unset there: cleared)."""
    paths = list(paths)
    bad = [p for p in paths if p not in KEY_MASK_PATHS]
    if bad:
        known = sorted(KEY_MASK_PATHS)
        raise InvalidRequest(
            [FieldViolation("update_mask", f"unknown path {p!r}; known: {known}") for p in bad]
        )
    out = current
    for p in paths:
        if p == "priorities":
            out = dataclasses.replace(out, priorities=patch.priorities)
        elif p == "quotas":
            out = dataclasses.replace(out, quotas=patch.quotas)
        elif p == "budgets":
            out = dataclasses.replace(out, budgets=patch.budgets)
        else:
            name = p.removeprefix("quotas.")
            quotas = dataclasses.replace(out.quotas, **{name: getattr(patch.quotas, name)})
            out = dataclasses.replace(out, quotas=quotas)
    return out
