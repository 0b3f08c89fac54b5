"""Command-line flags and tenants files → admin protos.

Tenants files are read by `scheduler.tenancy.tenant_file`, the loader `fairgate serve
--tenants` uses, so `apply` accepts exactly the same format (and refuses the
same mistakes, naming the file, the tenant and the field).
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import Any

from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import inference_pb2 as pb

QUOTA_NAMES = (
    "requests_per_s",
    "requests_burst",
    "tokens_per_min",
    "tokens_burst",
    "max_concurrent",
    "max_queued",
    "max_queue_wait_s",
    "max_prompt_tokens",
    "max_output_tokens",
    "max_output_tokens_interactive",
)
_INT_QUOTAS = frozenset(n for n in QUOTA_NAMES if n.startswith("max_") and n != "max_queue_wait_s")
PRIORITIES = {"interactive": pb.PRIORITY_CLASS_INTERACTIVE, "batch": pb.PRIORITY_CLASS_BATCH}
MODES = {"reject": apb.OVER_QUOTA_MODE_REJECT, "wait": apb.OVER_QUOTA_MODE_WAIT}


class FlagErrors(ValueError):
    """Every bad flag at once, one per line."""

    def __init__(self, problems: list[str]) -> None:
        super().__init__("\n".join(problems))
        self.problems = problems


def quota_updates(
    items: Sequence[str], problems: list[str] | None = None
) -> dict[str, float | int | None]:
    """["requests_per_s=5", "max_queued=none"] → {name: value or None (no limit)};
    bad items are appended to `problems` (or raised together)."""
    found: list[str] = [] if problems is None else problems
    out: dict[str, float | int | None] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or name not in QUOTA_NAMES:
            found.append(
                f"--quota {item!r}: expected NAME=VALUE with NAME one of {', '.join(QUOTA_NAMES)}"
            )
            continue
        if raw.lower() in ("none", "null", ""):
            out[name] = None
            continue
        try:
            out[name] = int(raw) if name in _INT_QUOTAS else float(raw)
        except ValueError:
            kind = "an integer" if name in _INT_QUOTAS else "a number"
            found.append(f"--quota {name}: expected {kind} or 'none', got {raw!r}")
    if problems is None and found:
        raise FlagErrors(found)
    return out


def tenant_from_flags(
    tenant_id: str,
    weight: float | None,
    priorities: Sequence[str] | None,
    over_quota: str | None,
    quotas: Sequence[str] | None,
    enabled: bool | None,
) -> tuple[apb.Tenant, list[str]]:
    """The tenant the flags describe, and the update-mask paths they touch.

    Raises `FlagErrors` listing every flag that cannot be read; the values'
    ranges are the server's to judge (it lists every violation too)."""
    t = apb.Tenant(id=tenant_id)
    paths: list[str] = []
    problems: list[str] = []
    if weight is not None:
        t.weight = weight
        paths.append("weight")
    if priorities:
        unknown = [p for p in priorities if p not in PRIORITIES]
        for p in unknown:
            problems.append(f"--priority {p!r}: use {' or '.join(PRIORITIES)}")
        t.priorities.extend(PRIORITIES[p] for p in priorities if p in PRIORITIES)
        paths.append("priorities")
    if over_quota is not None:
        if over_quota not in MODES:
            problems.append(f"--over-quota {over_quota!r}: use reject or wait")
        else:
            t.over_quota = MODES[over_quota]
        paths.append("over_quota")
    if enabled is not None:
        t.enabled = enabled
        paths.append("enabled")
    for name, value in quota_updates(quotas or (), problems).items():
        if value is not None:
            setattr(t.quotas, name, value)
        paths.append(f"quotas.{name}")
    if problems:
        raise FlagErrors(problems)
    return t, paths


def file_problems(path: str) -> list[str]:
    """Every problem of a tenants file, each as the server's loader words it.

    The loader (`scheduler.tenancy.tenant_file`) stops at the first bad field; to
    list them all without restating its rules, each tenant is checked alone
    and a field it names is dropped before checking again."""
    import yaml

    from scheduler.tenancy.tenant_file import TenantConfigError, load_tenants, parse_tenants

    try:
        load_tenants(path)
        return []
    except TenantConfigError as exc:
        if exc.tenant is None:  # unreadable, not YAML, not a list: nothing more to find
            return [str(exc)]
        first = str(exc)
    with open(path, encoding="utf-8") as f:
        data = yaml.safe_load(f)
    problems: list[str] = []
    entries = data.get("tenants") if isinstance(data, dict) else None
    for entry in entries if isinstance(entries, list) else ():
        if not isinstance(entry, dict):
            continue
        probe: dict[str, Any] = copy.deepcopy(entry)
        for _ in range(64):
            try:
                parse_tenants({"tenants": [probe]}, path)
                break
            except TenantConfigError as exc:
                problems.append(str(exc))
                if not _drop(probe, exc.field):
                    break
    return problems or [first]


def _drop(entry: dict[str, Any], field: str | None) -> bool:
    """Remove `field` ("weight", "quotas.max_queued") from a tenant entry."""
    if not field or field == "id" or field.startswith("tenants["):
        return False
    head, _, rest = field.partition(".")
    if rest and isinstance(entry.get(head), dict) and rest in entry[head]:
        del entry[head][rest]
        return True
    if not rest and head in entry:
        del entry[head]
        return True
    return False


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
        quotas = {n: getattr(t.quotas, n) for n in QUOTA_NAMES if t.quotas.HasField(n)}  # type: ignore[arg-type]
        if quotas:
            entry["quotas"] = quotas
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
    except TenantConfigError:
        raise FlagErrors(file_problems(path)) from None
    out = []
    for cfg in registry:
        t = apb.Tenant(
            id=cfg.tenant_id,
            weight=cfg.weight,
            enabled=cfg.enabled,
            over_quota=MODES[cfg.over_quota],
            priorities=[PRIORITIES[p.name.lower()] for p in sorted(cfg.priorities)],
        )
        for name in QUOTA_NAMES:
            value = getattr(cfg.quotas, name)
            if value is not None:
                setattr(t.quotas, name, value)
        out.append(t)
    return out, registry.default_tenant_id or ""
