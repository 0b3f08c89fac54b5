"""Command-line flags and tenants files → admin protos.

Tenants files are read by `scheduler.tenant_file`, the loader `fairgate serve
--tenants` uses, so `apply` accepts exactly the same format (and refuses the
same mistakes, naming the file, the tenant and the field).
"""

from __future__ import annotations

from collections.abc import Sequence

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


def quota_updates(items: Sequence[str]) -> dict[str, float | int | None]:
    """["requests_per_s=5", "max_queued=none"] → {name: value or None (no limit)}."""
    out: dict[str, float | int | None] = {}
    for item in items:
        name, sep, raw = item.partition("=")
        name, raw = name.strip(), raw.strip()
        if not sep or name not in QUOTA_NAMES:
            raise ValueError(
                f"--quota {item!r}: expected NAME=VALUE with NAME one of {', '.join(QUOTA_NAMES)}"
            )
        if raw.lower() in ("none", "null", ""):
            out[name] = None
            continue
        try:
            out[name] = int(raw) if name in _INT_QUOTAS else float(raw)
        except ValueError:
            kind = "an integer" if name in _INT_QUOTAS else "a number"
            raise ValueError(f"--quota {name}: expected {kind} or 'none', got {raw!r}") from None
    return out


def tenant_from_flags(
    tenant_id: str,
    weight: float | None,
    priorities: Sequence[str] | None,
    over_quota: str | None,
    quotas: Sequence[str] | None,
    enabled: bool | None,
) -> tuple[apb.Tenant, list[str]]:
    """The tenant the flags describe, and the update-mask paths they touch."""
    t = apb.Tenant(id=tenant_id)
    paths: list[str] = []
    if weight is not None:
        t.weight = weight
        paths.append("weight")
    if priorities:
        unknown = [p for p in priorities if p not in PRIORITIES]
        if unknown:
            raise ValueError(f"--priority {unknown[0]!r}: use {' or '.join(PRIORITIES)}")
        t.priorities.extend(PRIORITIES[p] for p in priorities)
        paths.append("priorities")
    if over_quota is not None:
        if over_quota not in MODES:
            raise ValueError(f"--over-quota {over_quota!r}: use reject or wait")
        t.over_quota = MODES[over_quota]
        paths.append("over_quota")
    if enabled is not None:
        t.enabled = enabled
        paths.append("enabled")
    for name, value in quota_updates(quotas or ()).items():
        if value is not None:
            setattr(t.quotas, name, value)
        paths.append(f"quotas.{name}")
    return t, paths


def tenants_from_file(path: str) -> tuple[list[apb.Tenant], str]:
    """(tenants, default tenant id) from a tenants YAML file; ValueError says what to fix."""
    from scheduler.tenant_file import load_tenants

    registry = load_tenants(path)
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
