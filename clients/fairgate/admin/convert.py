"""Admin protos as the plain values the tenant validator reads
(scheduler/tenancy/tenant_check.py), for the server's admin API and the CLI alike."""

from __future__ import annotations

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
