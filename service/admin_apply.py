"""ApplyTenants' plan: the declared tenants against the store's, as changes and writes.

Pure: the request and one snapshot in, the answer (each tenant's change, the
default's) and the writes that make the store match out; AdminServicer
commits the writes at the snapshot's revision unless it is a dry run.
"""

from __future__ import annotations

from fairgate.v1 import admin_pb2 as apb

from scheduler.tenancy.tenant_store import (
    DeleteTenant,
    PutTenant,
    SetDefaultTenant,
    TenantSnapshot,
    TenantWrite,
)
from scheduler.tenancy.tenants import TenantConfig
from service.admin_convert import check_tenant_id, diff, tenant_violations
from service.errors import FieldViolation, InvalidRequest


def plan_apply(
    request: apb.ApplyTenantsRequest, snap: TenantSnapshot
) -> tuple[apb.ApplyTenantsResponse, list[TenantWrite]]:
    """What applying `request` to `snap` changes; InvalidRequest lists every problem."""
    declared = _declared(request, snap)
    default = request.default_tenant_id or None
    resp = apb.ApplyTenantsResponse()
    writes: list[TenantWrite] = []
    for tid in sorted(set(declared) | set(snap.tenants)):
        old = snap.tenants.get(tid)
        new = declared.get(tid)
        change = resp.changes.add(tenant_id=tid)
        if new is None:
            if request.prune:
                change.action = apb.TenantChange.ACTION_DELETE
                change.fields.extend(diff(old.config if old else None, None))
                writes.append(DeleteTenant(tid))
            else:
                change.action = apb.TenantChange.ACTION_KEEP
            continue
        fields = diff(old.config if old else None, new)
        change.fields.extend(fields)
        if old is None:
            change.action = apb.TenantChange.ACTION_CREATE
        elif fields:
            change.action = apb.TenantChange.ACTION_UPDATE
        else:
            change.action = apb.TenantChange.ACTION_UNCHANGED
            continue
        writes.append(PutTenant(new))
    if default != snap.default_tenant_id:
        resp.default_tenant.CopyFrom(
            apb.FieldChange(
                field="default_tenant",
                before=snap.default_tenant_id or "",
                after=default or "",
            )
        )
        # Set the default last, after its tenant exists (and first, cleared,
        # when its old tenant is deleted).
        writes.insert(0, SetDefaultTenant(None))
        writes.append(SetDefaultTenant(default))
    return resp, writes


def _declared(request: apb.ApplyTenantsRequest, snap: TenantSnapshot) -> dict[str, TenantConfig]:
    """The request's tenants by id, each checked; InvalidRequest lists every problem."""
    declared: dict[str, TenantConfig] = {}
    problems: list[FieldViolation] = []
    for i, t in enumerate(request.tenants):
        cfg, bad = tenant_violations(t, f"tenants[{i}]")
        problems.extend(bad)
        if cfg is not None and cfg.tenant_id in declared:
            problems.append(FieldViolation(f"tenants[{i}].id", f"{t.id!r} is declared twice"))
        elif cfg is not None:
            declared[cfg.tenant_id] = cfg
    default = request.default_tenant_id or None
    if default is not None:
        problems.extend(check_tenant_id(default, "default_tenant_id"))
    kept = set(declared) | (set() if request.prune else set(snap.tenants))
    if default is not None and not problems and default not in kept:
        problems.append(
            FieldViolation("default_tenant_id", f"{default!r} is not one of the declared tenants")
        )
    if problems:
        raise InvalidRequest(problems)
    return declared
