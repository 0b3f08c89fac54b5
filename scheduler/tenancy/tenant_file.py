"""Load tenants from YAML, with errors that name the file, the tenant and the field.

Format (see deploy/tenants.example.yaml):

    default_tenant: public        # optional; requests without a tenant go here
    tenants:
      - id: team-a
        weight: 2
        priorities: [interactive, batch]
        enabled: true
        over_quota: reject        # or wait
        quotas: {requests_per_s: 5, tokens_per_min: 60000, max_concurrent: 8, ...}
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import yaml

from scheduler.request import Priority
from scheduler.tenancy.tenants import OVER_QUOTA_MODES, TenantConfig, TenantQuotas, TenantRegistry

_TOP_FIELDS = ("default_tenant", "tenants")
_TENANT_FIELDS = ("id", "weight", "priorities", "enabled", "over_quota", "quotas")
_INT_QUOTAS = {
    "max_concurrent",
    "max_queued",
    "max_prompt_tokens",
    "max_output_tokens",
    "max_output_tokens_interactive",
}
_QUOTA_FIELDS = tuple(f.name for f in dataclasses.fields(TenantQuotas))


class TenantConfigError(ValueError):
    """The tenant file is invalid; the message says where and what to fix."""

    def __init__(self, source: str, tenant: str | None, field: str | None, problem: str) -> None:
        where = source
        if tenant is not None:
            where += f": tenant {tenant!r}"
        if field is not None:
            where += f": field {field!r}"
        super().__init__(f"{where}: {problem}")
        self.source = source
        self.tenant = tenant
        self.field = field
        self.problem = problem


class _Reader:
    def __init__(self, source: str) -> None:
        self.source = source
        self.tenant: str | None = None

    def fail(self, field: str | None, problem: str) -> TenantConfigError:
        return TenantConfigError(self.source, self.tenant, field, problem)

    def mapping(self, value: Any, field: str | None, known: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(value, dict):
            raise self.fail(field, f"expected a mapping, got {type(value).__name__}")
        for key in value:
            if key not in known:
                name = f"{field}.{key}" if field else str(key)
                raise self.fail(name, f"unknown field (known: {', '.join(known)})")
        return value

    def number(self, value: Any, field: str, *, integer: bool = False) -> float | int | None:
        if value is None:
            return None
        # bool is an int in Python; `weight: yes` is a mistake, not 1.
        ok = isinstance(value, int) if integer else isinstance(value, int | float)
        if isinstance(value, bool) or not ok:
            kind = "an integer" if integer else "a number"
            raise self.fail(field, f"expected {kind} or null, got {value!r}")
        return int(value) if integer else float(value)

    def quotas(self, value: Any) -> TenantQuotas:
        if value is None:
            return TenantQuotas()
        raw = self.mapping(value, "quotas", _QUOTA_FIELDS)
        kwargs: dict[str, Any] = {
            name: self.number(raw.get(name), f"quotas.{name}", integer=name in _INT_QUOTAS)
            for name in raw
        }
        return TenantQuotas(**kwargs)

    def priorities(self, value: Any) -> frozenset[Priority]:
        if value is None:
            return frozenset(Priority)
        names = {p.name.lower(): p for p in Priority}
        if not isinstance(value, list) or not value:
            raise self.fail("priorities", f"expected a non-empty list of {sorted(names)}")
        out = set()
        for item in value:
            if item not in names:
                raise self.fail("priorities", f"unknown class {item!r} (known: {sorted(names)})")
            out.add(names[item])
        return frozenset(out)

    def read_tenant(self, value: Any, index: int) -> TenantConfig:
        self.tenant = None
        if not isinstance(value, dict):
            raise self.fail(f"tenants[{index}]", "expected a mapping with at least `id`")
        tid = value.get("id")
        if not isinstance(tid, str) or not tid.strip():
            raise self.fail(f"tenants[{index}].id", "every tenant needs a non-empty string id")
        self.tenant = tid
        raw = self.mapping(value, None, _TENANT_FIELDS)
        weight = self.number(raw.get("weight", 1.0), "weight")
        enabled = raw.get("enabled", True)
        if not isinstance(enabled, bool):
            raise self.fail("enabled", f"expected true or false, got {enabled!r}")
        mode = raw.get("over_quota", "reject")
        if mode not in OVER_QUOTA_MODES:
            raise self.fail("over_quota", f"expected one of {list(OVER_QUOTA_MODES)}, got {mode!r}")
        cfg = TenantConfig(
            tenant_id=tid,
            weight=float(weight if weight is not None else 1.0),
            priorities=self.priorities(raw.get("priorities")),
            enabled=enabled,
            quotas=self.quotas(raw.get("quotas")),
            over_quota=mode,
        )
        problems = cfg.problems()
        if problems:
            field, problem = problems[0]
            raise self.fail(field, problem)
        return cfg


def parse_tenants(data: Any, source: str = "<tenants>") -> TenantRegistry:
    """Build a registry from already-parsed YAML/JSON data."""
    r = _Reader(source)
    top = r.mapping(data, None, _TOP_FIELDS)
    raw_tenants = top.get("tenants")
    if not isinstance(raw_tenants, list) or not raw_tenants:
        raise r.fail("tenants", "expected a non-empty list of tenants")
    tenants: list[TenantConfig] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_tenants):
        cfg = r.read_tenant(raw, i)
        if cfg.tenant_id in seen:
            raise r.fail("id", "defined twice; tenant ids must be unique")
        seen.add(cfg.tenant_id)
        tenants.append(cfg)
    r.tenant = None
    default = top.get("default_tenant")
    if default is not None and (not isinstance(default, str) or default not in seen):
        raise r.fail(
            "default_tenant", f"{default!r} is not one of the tenants defined: {sorted(seen)}"
        )
    return TenantRegistry(tenants, default_tenant_id=default)


def load_tenants(path: str | Path) -> TenantRegistry:
    """Read and validate a tenant file; raises TenantConfigError naming what to fix."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise TenantConfigError(source, None, None, f"cannot read: {exc.strerror}") from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise TenantConfigError(source, None, None, f"not valid YAML: {exc}") from exc
    return parse_tenants(data, source)
