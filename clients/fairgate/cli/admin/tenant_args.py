"""Command-line flags and tenants files → admin protos.

Tenants files are read by `scheduler.tenancy.tenant_file`, the loader `fairgate serve
--tenants` uses, so `apply` accepts exactly the same format (and refuses the
same mistakes, every one at once, naming the file, the tenant and the field).
The create/update flags go through the same validator (`tenant_check.read_tenant`),
so every bad flag is listed at once too.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fairgate.admin.convert import budget_message, budget_values
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import inference_pb2 as pb
from scheduler.tenancy.budgets import budget_to_dict
from scheduler.tenancy.tenant_check import read_tenant
from scheduler.tenancy.tenants import QUOTA_RANGES

PRIORITIES = {"interactive": pb.PRIORITY_CLASS_INTERACTIVE, "batch": pb.PRIORITY_CLASS_BATCH}
MODES = {"reject": apb.OVER_QUOTA_MODE_REJECT, "wait": apb.OVER_QUOTA_MODE_WAIT}
_FLAGS = {
    "id": "TENANT_ID",
    "weight": "--weight",
    "priorities": "--priority",
    "over_quota": "--over-quota",
    "enabled": "--enable/--disable",
}


class FlagErrors(ValueError):
    """Every bad flag at once, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def _flag(field: str) -> str:
    """A tenant field as the flag that sets it: "quotas.max_queued" → "--quota max_queued"."""
    if field.startswith("quotas."):
        return "--quota " + field.removeprefix("quotas.")
    if field.startswith("budgets"):
        return "--budget " + field.removeprefix("budgets")
    return _FLAGS.get(field, field)


def _quota_items(items: Sequence[str], problems: list[str]) -> dict[str, str]:
    """["requests_per_s=5", "max_queued=none"] → {name: text}; the values are
    read_tenant's to judge."""
    out: dict[str, str] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        if not sep or not name.strip():
            names = ", ".join(QUOTA_RANGES)
            problems.append(f"--quota {item!r}: expected NAME=VALUE with NAME one of {names}")
            continue
        out[name.strip()] = raw.strip()
    return out


def _set_quotas(quotas: apb.TenantQuotas, values: dict[str, Any]) -> list[str]:
    """The quotas `read_tenant` read set on `quotas` (None: cleared); their mask paths."""
    for name, value in values.get("quotas", {}).items():
        if value is not None:
            setattr(quotas, name, value)
    return [f"quotas.{name}" for name in values.get("quotas", {})]


def _budget_items(items: Sequence[str], problems: list[str]) -> list[dict[str, Any]]:
    """["day:tokens=1000000,counts=prompt+completion", ...] → budgets as plain values
    (read_tenant judges them); "none" alone: no budgets."""
    if [i.strip().lower() for i in items] == ["none"]:
        return []
    out: list[dict[str, Any]] = []
    for item in items:
        period, sep, rest = item.partition(":")
        budget: dict[str, Any] = {"period": period.strip()}
        for part in rest.split(",") if sep else []:
            name, eq, value = part.partition("=")
            if not eq:
                problems.append(f"--budget {item!r}: expected PERIOD:NAME=VALUE,... ({part!r})")
                continue
            name = name.strip()
            budget[name] = value.strip().split("+") if name == "counts" else value.strip()
        if not sep:
            problems.append(
                f"--budget {item!r}: expected PERIOD:NAME=VALUE,..., "
                "e.g. day:tokens=1000000,requests=500 (or none)"
            )
        out.append(budget)
    return out


def tenant_from_flags(
    tenant_id: str,
    weight: float | None,
    priorities: Sequence[str] | None,
    over_quota: str | None,
    quotas: Sequence[str] | None,
    enabled: bool | None,
    budgets: Sequence[str] | None = None,
    *,
    whole: bool = False,
) -> tuple[apb.Tenant, list[str]]:
    """The tenant the flags describe, and the update-mask paths they touch.

    Raises `FlagErrors` listing every bad flag, judged by the validator the
    tenants file and the server use (scheduler/tenancy/tenant_check.py); `whole`
    (create): the flags are the whole tenant, so the rules between quotas apply
    too, else (update) the server judges them with the fields it keeps."""
    raw: dict[str, Any] = {"id": tenant_id}
    problems: list[str] = []
    if weight is not None:
        raw["weight"] = weight
    if priorities:
        raw["priorities"] = list(priorities)
    if over_quota is not None:
        raw["over_quota"] = over_quota
    if enabled is not None:
        raw["enabled"] = enabled
    if quotas:
        raw["quotas"] = _quota_items(quotas, problems)
    if budgets:
        raw["budgets"] = _budget_items(budgets, problems)
    values, found = read_tenant(raw, text=True, partial=not whole)
    problems.extend(f"{_flag(field)}: {message}" for field, message in found)
    if problems:
        raise FlagErrors(problems)
    t = apb.Tenant(id=tenant_id)
    paths: list[str] = []
    if "weight" in values:
        t.weight = values["weight"]
        paths.append("weight")
    if "priorities" in values:
        t.priorities.extend(PRIORITIES[p] for p in dict.fromkeys(raw["priorities"]))
        paths.append("priorities")
    if "over_quota" in values:
        t.over_quota = MODES[values["over_quota"]]
        paths.append("over_quota")
    if "enabled" in values:
        t.enabled = values["enabled"]
        paths.append("enabled")
    paths += _set_quotas(t.quotas, values)
    if "budgets" in values:
        t.budgets.extend(budget_proto(b) for b in values["budgets"])
        paths.append("budgets")
    return t, paths


def key_limits_from_flags(
    quotas: Sequence[str] | None,
    priorities: Sequence[str] | None,
    any_priority: bool = False,
    budgets: Sequence[str] | None = None,
) -> tuple[apb.ApiKeyLimits, list[str]]:
    """A key's own limits from `-q NAME=VALUE`, `--priority` and `--budget` flags
    (the tenant flags' syntax; `--budget none`: no budgets of its own), and the
    update-mask paths they touch (`any_priority`: clear the key's priorities, so
    its tenant's apply). `FlagErrors` lists every bad flag: kinds and ranges by
    the tenants' validator, the fields a key may set and its tenant's ceilings by
    the server."""
    problems: list[str] = []
    raw: dict[str, Any] = {"id": "key"}
    if quotas:
        raw["quotas"] = _quota_items(quotas, problems)
    if budgets:
        raw["budgets"] = _budget_items(budgets, problems)
    if priorities:
        raw["priorities"] = list(priorities)
    if priorities and any_priority:
        problems.append("--priority and --any-priority: give one of them")
    values, found = read_tenant(raw, text=True, partial=True)
    problems.extend(f"{_flag(field)}: {message}" for field, message in found)
    if problems:
        raise FlagErrors(problems)
    limits = apb.ApiKeyLimits()
    paths: list[str] = []
    if "priorities" in values or any_priority:
        limits.priorities.extend(PRIORITIES[p] for p in dict.fromkeys(priorities or ()))
        paths.append("priorities")
    paths += _set_quotas(limits.quotas, values)
    if "budgets" in values:
        limits.budgets.extend(budget_proto(b) for b in values["budgets"])
        paths.append("budgets")
    return limits, paths


def budget_proto(b: Any) -> apb.Budget:
    """A validated `Budget` as its proto (unset fields: the defaults)."""
    return budget_message(budget_to_dict(b))


def tenants_to_file(tenants: Sequence[apb.Tenant], default_tenant_id: str) -> dict[str, Any]:
    """Tenants as a tenants file (`serve --tenants`, `admin apply -f`): the
    inverse of `tenants_from_file`, so an export applies back unchanged."""
    names = {v: k for k, v in PRIORITIES.items()}
    modes = {v: k for k, v in MODES.items()}
    out: list[dict[str, Any]] = []
    for t in tenants:
        entry: dict[str, Any] = {"id": t.id, "weight": t.weight}
        if t.priorities:
            entry["priorities"] = [names[p] for p in t.priorities]
        if not t.enabled:
            entry["enabled"] = False
        entry["over_quota"] = modes.get(t.over_quota, "reject")
        quotas = {n: getattr(t.quotas, n) for n in QUOTA_RANGES if t.quotas.HasField(n)}  # type: ignore[arg-type]
        if quotas:
            entry["quotas"] = quotas
        if t.budgets:
            entry["budgets"] = [budget_values(b) for b in t.budgets]
        out.append(entry)
    doc: dict[str, Any] = {}
    if default_tenant_id:
        doc["default_tenant"] = default_tenant_id
    doc["tenants"] = out
    return doc


def tenants_from_file(path: str) -> tuple[list[apb.Tenant], str]:
    """(tenants, default tenant id) from a tenants YAML file; `FlagErrors` lists
    every problem."""
    from scheduler.tenancy.tenant_file import TenantConfigError, load_tenants

    try:
        registry = load_tenants(path)
    except TenantConfigError as exc:
        raise FlagErrors(exc.lines()) from None
    out = []
    for cfg in registry:
        t = apb.Tenant(
            id=cfg.tenant_id,
            weight=cfg.weight,
            enabled=cfg.enabled,
            over_quota=MODES[cfg.over_quota],
            priorities=[PRIORITIES[p.name.lower()] for p in sorted(cfg.priorities)],
            budgets=[budget_proto(b) for b in cfg.budgets],
        )
        for name in QUOTA_RANGES:
            value = getattr(cfg.quotas, name)
            if value is not None:
                setattr(t.quotas, name, value)
        out.append(t)
    return out, registry.default_tenant_id or ""
