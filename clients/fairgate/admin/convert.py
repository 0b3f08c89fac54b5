"""Admin protos as the plain values the tenant validator reads
(scheduler/tenancy/tenant_check.py), for the server's admin API and the CLI alike."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fairgate.v1 import admin_pb2 as apb


def budget_values(b: apb.Budget) -> dict[str, Any]:
    """A Budget proto as the tenants file writes it: the fields it sets."""
    out: dict[str, Any] = {"period": b.period}
    for name in ("tokens", "requests", "warn_at"):
        if b.HasField(name):
            out[name] = getattr(b, name)
    if b.counts:
        out["counts"] = list(b.counts)
    return out


def budget_message(values: Mapping[str, Any]) -> apb.Budget:
    """Plain budget values (as `budget_values` or the tenants file gives them) as the
    proto: the fields given set, the others left to the defaults."""
    out = apb.Budget(period=values["period"])
    for name in ("tokens", "requests", "warn_at"):
        if name in values:
            setattr(out, name, values[name])
    out.counts.extend(values.get("counts", []))
    return out
