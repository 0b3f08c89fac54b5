"""Admin API protos ⇄ tenant domain values, with every violation reported at once."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable
from typing import Any

from fairgate.admin.convert import budget_message, budget_values
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import inference_pb2 as pb
from google.protobuf import timestamp_pb2

from scheduler.gate_stats import BucketStats, TenantStats
from scheduler.request import Priority
from scheduler.tenancy.budgets import Budget, budget_to_dict
from scheduler.tenancy.key_limits import KeyLimits
from scheduler.tenancy.tenant_check import config_of, read_tenant
from scheduler.tenancy.tenant_store import ApiKeyRecord, TenantRecord
from scheduler.tenancy.tenants import (
    QUOTA_RANGES,
    OverQuotaMode,
    TenantConfig,
    tenant_id_problem,
)
from service.api_keys import hint
from service.errors import FieldViolation, InvalidRequest
from service.usage_log import UsageRecord

MAX_DISPLAY_NAME_CHARS = 64
QUOTA_FIELDS = tuple(QUOTA_RANGES)
MASK_PATHS = frozenset(
    {
        "weight",
        "priorities",
        "enabled",
        "over_quota",
        "quotas",
        *(f"quotas.{q}" for q in QUOTA_FIELDS),
        "budgets",
    }
)
PRIORITY_FROM_PB = {
    pb.PRIORITY_CLASS_INTERACTIVE: Priority.INTERACTIVE,
    pb.PRIORITY_CLASS_BATCH: Priority.BATCH,
}
PRIORITY_TO_PB = {v: k for k, v in PRIORITY_FROM_PB.items()}
_MODE_FROM_PB: dict[int, OverQuotaMode] = {
    apb.OVER_QUOTA_MODE_UNSPECIFIED: "reject",
    apb.OVER_QUOTA_MODE_REJECT: "reject",
    apb.OVER_QUOTA_MODE_WAIT: "wait",
}
_MODE_TO_PB = {"reject": apb.OVER_QUOTA_MODE_REJECT, "wait": apb.OVER_QUOTA_MODE_WAIT}


def timestamp(seconds: float) -> timestamp_pb2.Timestamp:
    ts = timestamp_pb2.Timestamp()
    ts.FromNanoseconds(int(seconds * 1e9))
    return ts


def check_tenant_id(tenant_id: str, field: str) -> list[FieldViolation]:
    problem = tenant_id_problem(tenant_id)
    return [FieldViolation(field, problem)] if problem else []


def require_tenant_id(tenant_id: str, field: str = "tenant_id") -> str:
    problems = check_tenant_id(tenant_id, field)
    if problems:
        raise InvalidRequest(problems)
    return tenant_id


def tenant_violations(t: apb.Tenant, path: str) -> tuple[TenantConfig | None, list[FieldViolation]]:
    """(config, []) when valid, else (None, every violation with its field path):
    the proto's own enums here, the rest by the validator every source uses."""
    out = check_tenant_id(t.id, f"{path}.id")
    priorities: list[str] = []
    for i, p in enumerate(t.priorities):
        if p not in PRIORITY_FROM_PB:
            out.append(
                FieldViolation(
                    f"{path}.priorities[{i}]", "use PRIORITY_CLASS_INTERACTIVE or _BATCH"
                )
            )
        else:
            priorities.append(PRIORITY_FROM_PB[p].name.lower())
    mode = _MODE_FROM_PB.get(t.over_quota)
    if mode is None:
        out.append(FieldViolation(f"{path}.over_quota", f"unknown mode {t.over_quota}"))
    raw: dict[str, Any] = {
        "id": t.id,
        "weight": float(t.weight) if t.HasField("weight") else None,
        "enabled": t.enabled if t.HasField("enabled") else None,
        "over_quota": mode,
        "quotas": {
            name: getattr(t.quotas, name)
            for name in QUOTA_FIELDS
            if t.quotas.HasField(name)  # type: ignore[arg-type]
        },
    }
    if priorities:
        raw["priorities"] = priorities
    if t.budgets:
        raw["budgets"] = [budget_values(b) for b in t.budgets]
    values, problems = read_tenant(raw)
    out.extend(FieldViolation(f"{path}.{f}", m) for f, m in problems if f != "id")
    return (None, out) if out else (config_of(values), [])


def budget_to_proto(b: Budget) -> apb.Budget:
    """The server's answers always carry `warn_at` (the default too)."""
    return budget_message({**budget_to_dict(b), "warn_at": b.warn_at})


def tenant_from_proto(t: apb.Tenant, path: str = "tenant") -> TenantConfig:
    cfg, problems = tenant_violations(t, path)
    if cfg is None:
        raise InvalidRequest(problems)
    return cfg


def config_to_proto(cfg: TenantConfig) -> apb.Tenant:
    t = apb.Tenant(
        id=cfg.tenant_id,
        weight=cfg.weight,
        enabled=cfg.enabled,
        over_quota=_MODE_TO_PB[cfg.over_quota],
        priorities=[PRIORITY_TO_PB[p] for p in sorted(cfg.priorities)],
        budgets=[budget_to_proto(b) for b in cfg.budgets],
    )
    for name in QUOTA_FIELDS:
        value = getattr(cfg.quotas, name)
        if value is not None:
            setattr(t.quotas, name, value)
    return t


def record_to_proto(rec: TenantRecord, active_keys: int = 0) -> apb.Tenant:
    t = config_to_proto(rec.config)
    t.etag = str(rec.version)
    t.create_time.CopyFrom(timestamp(rec.created_at_s))
    t.update_time.CopyFrom(timestamp(rec.updated_at_s))
    t.active_api_keys = active_keys
    return t


def parse_etag(etag: str, field: str) -> int | None:
    if not etag:
        return None
    if not etag.isdigit() or int(etag) < 1:
        raise InvalidRequest([FieldViolation(field, f"{etag!r} is not an etag from this server")])
    return int(etag)


def apply_mask(current: apb.Tenant, patch: apb.Tenant, paths: Iterable[str]) -> apb.Tenant:
    """`current` with the masked fields taken from `patch` (unset there: cleared)."""
    paths = list(paths)
    bad = [p for p in paths if p not in MASK_PATHS]
    if bad:
        raise InvalidRequest(
            [
                FieldViolation("update_mask", f"unknown path {p!r}; known: {sorted(MASK_PATHS)}")
                for p in bad
            ]
        )
    out = apb.Tenant()
    out.CopyFrom(current)
    for p in paths:
        if p == "quotas":
            out.quotas.CopyFrom(patch.quotas)
        elif p == "priorities":
            del out.priorities[:]
            out.priorities.extend(patch.priorities)
        elif p == "budgets":
            del out.budgets[:]
            out.budgets.extend(patch.budgets)
        elif p == "over_quota":
            out.over_quota = patch.over_quota
        elif p.startswith("quotas."):
            name = p.removeprefix("quotas.")
            if patch.quotas.HasField(name):  # type: ignore[arg-type]
                setattr(out.quotas, name, getattr(patch.quotas, name))
            else:
                out.quotas.ClearField(name)  # type: ignore[arg-type]
        elif patch.HasField(p):  # type: ignore[arg-type]
            setattr(out, p, getattr(patch, p))
        else:
            out.ClearField(p)  # type: ignore[arg-type]
    return out


def _text(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return f"{value:g}" if math.isfinite(value) else str(value)
    if isinstance(value, frozenset):
        return ",".join(p.name.lower() for p in sorted(value))
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def flatten(cfg: TenantConfig) -> dict[str, str]:
    """Field → text, the unit of apply's diff."""
    out = {
        "weight": _text(cfg.weight),
        "priorities": _text(cfg.priorities),
        "enabled": _text(cfg.enabled),
        "over_quota": cfg.over_quota,
    }
    for name in QUOTA_FIELDS:
        out[f"quotas.{name}"] = _text(getattr(cfg.quotas, name))
    out["budgets"] = json.dumps([budget_to_dict(b) for b in cfg.budgets]) if cfg.budgets else ""
    return out


def diff(before: TenantConfig | None, after: TenantConfig | None) -> list[apb.FieldChange]:
    a = flatten(before) if before else {}
    b = flatten(after) if after else {}
    return [
        apb.FieldChange(field=k, before=a.get(k, ""), after=b.get(k, ""))
        for k in sorted(set(a) | set(b), key=lambda k: (k.startswith("quotas."), k))
        if a.get(k, "") != b.get(k, "")
    ]


def key_to_proto(rec: ApiKeyRecord, now_s: float) -> apb.ApiKey:
    k = apb.ApiKey(
        key_id=rec.key_id,
        tenant_id=rec.tenant_id,
        display_name=rec.display_name,
        hint=hint(rec.key_id),
        active=rec.active(now_s),
    )
    k.create_time.CopyFrom(timestamp(rec.created_at_s))
    if rec.expires_at_s is not None:
        k.expire_time.CopyFrom(timestamp(rec.expires_at_s))
    if not rec.limits.empty:
        k.limits.CopyFrom(limits_to_proto(rec.limits))
    return k


def limits_to_proto(limits: KeyLimits) -> apb.ApiKeyLimits:
    msg = apb.ApiKeyLimits()
    if limits.priorities is not None:
        msg.priorities.extend(PRIORITY_TO_PB[p] for p in sorted(limits.priorities))
    for name in QUOTA_FIELDS:
        value = getattr(limits.quotas, name)
        if value is not None:
            setattr(msg.quotas, name, value)
    msg.budgets.extend(budget_to_proto(b) for b in limits.budgets)
    return msg


def usage_record(r: UsageRecord) -> apb.UsageRecord:
    """One usage-log record (service/usage_log.py) for ExportUsage."""
    return apb.UsageRecord(
        cursor=r.cursor,
        request_id=r.request_id,
        tenant_id=r.tenant_id,
        model=r.model,
        prompt_tokens=r.prompt_tokens,
        cached_tokens=r.cached_tokens,
        completion_tokens=r.completion_tokens,
        finish_reason=r.finish_reason,
        finished_at=timestamp(r.finished_at_s),
        key_id=r.key_id,
        refusal=r.refusal,
    )


def _bucket_proto(b: BucketStats | None) -> apb.BucketLevel | None:
    if b is None:
        return None
    return apb.BucketLevel(level=b.level, burst=b.burst, rate_per_s=b.rate_per_s)


def usage_to_proto(t: TenantStats, model: str) -> apb.TenantUsage:
    out = apb.TenantUsage(
        tenant_id=t.tenant_id,
        model=model,
        charged_tokens_total=t.charged_tokens,
        charged_requests_total=t.charged_requests,
        in_flight=t.in_flight,
        queued=t.queued,
        rejected_total=t.rejected_total,
        finished_total=t.finished_total,
        paused=t.paused,
    )
    if t.virtual_counter is not None:
        out.virtual_counter = t.virtual_counter
    request_bucket, token_bucket = _bucket_proto(t.request_bucket), _bucket_proto(t.token_bucket)
    if request_bucket is not None:
        out.request_bucket.CopyFrom(request_bucket)
    if token_bucket is not None and t.token_bucket is not None:
        out.token_bucket.CopyFrom(token_bucket)
        out.tokens_used_in_window = t.token_bucket.used
    for limit, n in t.rejections.items():
        out.rejections[limit] = n
    return out
