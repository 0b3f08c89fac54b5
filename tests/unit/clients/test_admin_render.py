"""Admin tables: a legend appears only when a row carries its mark."""

from __future__ import annotations

import io

from fairgate.cli.admin.render import tenants_table, usage_table
from fairgate.v1 import admin_pb2 as apb
from rich.console import Console
from rich.table import Table


def _text(table: Table) -> str:
    console = Console(width=100, record=True, file=io.StringIO())
    console.print(table)
    return console.export_text()


def test_tenant_legend_only_when_the_default_is_listed() -> None:
    a, b = apb.Tenant(id="a", weight=1), apb.Tenant(id="b", weight=2)
    assert "* default tenant" in _text(tenants_table([a, b], "a"))
    assert "a *" in _text(tenants_table([a, b], "a"))
    assert "*" not in _text(tenants_table([a, b], "elsewhere"))
    assert "*" not in _text(tenants_table([b], ""))


def test_usage_legend_only_when_a_tenant_is_paused() -> None:
    held = apb.TenantUsage(tenant_id="held", paused=True)
    free = apb.TenantUsage(tenant_id="free")
    both = apb.GetUsageResponse(policy="vtc", usage=[held, free])
    assert "* paused" in _text(usage_table(both))
    # Kept to the unpaused tenant: no mark, no legend; the -o json hint stays.
    text = _text(usage_table(both, keep=["free"]))
    assert "*" not in text and "more columns: -o json" in text
