"""`fairgate admin usage --period day|month`: spend per tenant (and key) per window.

Reads `AdminService.GetPeriodUsage` (the usage log's counters, fleet-wide
with store=redis) and prints one row per tenant, or per key with `--by-key`:
prompt (cached ones included), cached and completion tokens, requests,
refusals, the period's budget, the share of it spent and the warning flag
("!" at or past warn_at, "x" spent: new requests are refused), as a table,
JSON or CSV.
"""

from __future__ import annotations

import csv
import json
import sys
from typing import Any

from fairgate.cli.admin import render
from fairgate.v1 import admin_pb2 as apb

FORMATS = ("table", "json", "csv")
COLUMNS = (
    "tenant_id",
    "key_id",
    "period",
    "window",
    "prompt_tokens",
    "cached_tokens",
    "completion_tokens",
    "requests",
    "refusals",
    "budget",
    "budget_spent_pct",
    "warning",
    "exhausted",
)


def row(u: apb.PeriodUsage) -> dict[str, Any]:
    has_budget = u.HasField("budget")
    return {
        "tenant_id": u.tenant_id,
        "key_id": u.key_id,
        "period": u.period,
        "window": u.window,
        "prompt_tokens": u.prompt_tokens,
        "cached_tokens": u.cached_tokens,
        "completion_tokens": u.completion_tokens,
        "requests": u.requests,
        "refusals": u.refusals,
        "refusals_by_reason": dict(sorted(u.refusals_by_reason.items())),
        "budget": render.budget_text(u.budget) if has_budget else "",
        "budget_spent_pct": round(100 * u.budget_spent, 2) if has_budget else None,
        "warning": u.warning,
        "exhausted": u.exhausted,
    }


def print_period_usage(resp: apb.GetPeriodUsageResponse, fmt: str) -> None:
    rows = [row(u) for u in resp.usage]
    if not resp.durable:
        sys.stderr.write("note: this server keeps its usage counters in memory only\n")
    if fmt == "json":
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    elif fmt == "csv":
        writer = csv.writer(sys.stdout)
        writer.writerow(COLUMNS)
        for r in rows:
            writer.writerow("" if r[c] is None else r[c] for c in COLUMNS)
    else:
        render.console().print(_table(resp, rows))


def _table(resp: apb.GetPeriodUsageResponse, rows: list[dict[str, Any]]) -> Any:
    window = resp.usage[0].window if resp.usage else ""
    table = render.period_table(f"usage in {window or 'the window'}")
    for r in rows:
        who = r["tenant_id"] + (f"/{r['key_id']}" if r["key_id"] else "")
        pct = r["budget_spent_pct"]
        flag = "x" if r["exhausted"] else "!" if r["warning"] else ""
        table.add_row(
            who,
            str(r["prompt_tokens"]),
            str(r["cached_tokens"]),
            str(r["completion_tokens"]),
            str(r["requests"]),
            str(r["refusals"]),
            r["budget"] or "-",
            "-" if pct is None else f"{pct:g}%{flag}",
        )
    return table
