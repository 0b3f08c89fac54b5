"""Load tenants from YAML, with every error at once, each naming the file, the
tenant and the field (the checks are scheduler/tenancy/tenant_check.py's).

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

from pathlib import Path
from typing import Any, NamedTuple

import yaml

from scheduler.tenancy.tenant_check import check_tenant
from scheduler.tenancy.tenants import TenantConfig, TenantRegistry

_TOP_FIELDS = ("default_tenant", "tenants")


class TenantProblem(NamedTuple):
    tenant: str | None
    field: str | None
    problem: str

    def where(self) -> str:
        out = [f"tenant {self.tenant!r}"] if self.tenant is not None else []
        out += [f"field {self.field!r}"] if self.field is not None else []
        return ": ".join([*out, self.problem])


class TenantConfigError(ValueError):
    """The tenant file is invalid: every problem, each naming the tenant and the field.

    `tenant`, `field` and `problem` are the first problem's."""

    def __init__(self, source: str, problems: list[TenantProblem]) -> None:
        self.source = source
        self.problems = problems
        self.tenant, self.field, self.problem = problems[0]
        if len(problems) == 1:
            message = f"{source}: {problems[0].where()}"
        else:
            lines = "".join(f"\n  {p.where()}" for p in problems)
            message = f"{source}: {len(problems)} problems:{lines}"
        super().__init__(message)

    def lines(self) -> list[str]:
        """One line per problem, each naming the file."""
        return [f"{self.source}: {p.where()}" for p in self.problems]


def parse_tenants(data: Any, source: str = "<tenants>") -> TenantRegistry:
    """Build a registry from already-parsed YAML/JSON data; TenantConfigError lists
    every problem in it."""
    problems: list[TenantProblem] = []
    if not isinstance(data, dict):
        raise TenantConfigError(
            source, [TenantProblem(None, None, f"expected a mapping, got {type(data).__name__}")]
        )
    for key in data:
        if key not in _TOP_FIELDS:
            known = ", ".join(_TOP_FIELDS)
            problems.append(TenantProblem(None, str(key), f"unknown field (known: {known})"))
    raw_tenants = data.get("tenants")
    if not isinstance(raw_tenants, list) or not raw_tenants:
        problems.append(TenantProblem(None, "tenants", "expected a non-empty list of tenants"))
        raw_tenants = []
    tenants: list[TenantConfig] = []
    seen: set[str] = set()
    for i, raw in enumerate(raw_tenants):
        if not isinstance(raw, dict):
            problems.append(
                TenantProblem(None, f"tenants[{i}]", "expected a mapping with at least `id`")
            )
            continue
        tid = raw.get("id")
        name = tid if isinstance(tid, str) and tid.strip() else None
        cfg, found = check_tenant(raw)
        for field, problem in found:
            if name is None and field == "id":
                field = f"tenants[{i}].id"
            problems.append(TenantProblem(name, field, problem))
        if name is not None and name in seen:
            problems.append(TenantProblem(name, "id", "defined twice; tenant ids must be unique"))
        if name is not None:
            seen.add(name)
        if cfg is not None:
            tenants.append(cfg)
    default = data.get("default_tenant")
    if default is not None and (not isinstance(default, str) or default not in seen):
        problems.append(
            TenantProblem(
                None,
                "default_tenant",
                f"{default!r} is not one of the tenants defined: {sorted(seen)}",
            )
        )
    if problems:
        raise TenantConfigError(source, problems)
    return TenantRegistry(tenants, default_tenant_id=default)


def load_tenants(path: str | Path) -> TenantRegistry:
    """Read and validate a tenant file; raises TenantConfigError naming what to fix."""
    source = str(path)
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        problem = TenantProblem(None, None, f"cannot read: {exc.strerror}")
        raise TenantConfigError(source, [problem]) from exc
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        problem = TenantProblem(None, None, f"not valid YAML: {exc}")
        raise TenantConfigError(source, [problem]) from exc
    return parse_tenants(data, source)
