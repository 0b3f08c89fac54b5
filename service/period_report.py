"""`AdminService.GetPeriodUsage`: spend per tenant (and key) in one calendar window.

Read from the usage log's counters (service/period_usage.py; fleet-wide with
store=redis), beside each tenant's (and, with by_key, each key's own) budget
for the period (scheduler/tenancy/budgets.py: the fraction spent, the warning,
exhausted).
"""

from __future__ import annotations

import datetime as dt
import re
import time

from fairgate.v1 import admin_pb2 as apb

from scheduler.tenancy.budgets import PERIODS, Spend, Window, judge, window
from scheduler.tenancy.tenant_store import TenantSnapshot
from service import period_usage
from service.admin_convert import budget_to_proto, timestamp
from service.errors import FieldViolation, InvalidRequest
from service.usage_log import UsageLog

_LABELS = {"day": re.compile(r"\d{4}-\d{2}-\d{2}"), "month": re.compile(r"\d{4}-\d{2}")}
_FORMATS = {"day": "%Y-%m-%d", "month": "%Y-%m"}


def _window(period: str, label: str, utc_offset_min: int, now_s: float) -> Window:
    if period not in PERIODS:
        raise InvalidRequest([FieldViolation("period", f"one of {list(PERIODS)}, got {period!r}")])
    if not label:
        return window(period, now_s, utc_offset_min)
    if not _LABELS[period].fullmatch(label):
        raise InvalidRequest([FieldViolation("window", f"{_FORMATS[period]} for a {period}")])
    tz = dt.timezone(dt.timedelta(minutes=utc_offset_min))
    try:
        start = dt.datetime.strptime(label, _FORMATS[period]).replace(tzinfo=tz)
    except ValueError:
        raise InvalidRequest([FieldViolation("window", f"no such {period}: {label!r}")]) from None
    return window(period, start.timestamp(), utc_offset_min)


async def period_usage_response(
    request: apb.GetPeriodUsageRequest,
    usage: UsageLog,
    snap: TenantSnapshot,
    now_s: float | None = None,
) -> apb.GetPeriodUsageResponse:
    now_s = time.time() if now_s is None else now_s
    win = _window(request.period, request.window, usage.utc_offset_min, now_s)
    wanted = list(request.tenant_ids)
    for tid in wanted:
        # With no tenants configured (open mode) any id may have spent.
        if snap.tenants:
            snap.tenant(tid)
    (fields,) = await usage.window_fields([win])
    spent = period_usage.spends(fields)
    owners = [((tid, ""), rec.config.budgets) for tid, rec in snap.tenants.items()]
    if request.by_key:
        # A revoked key's budget binds nothing: left out (its spend still shows).
        owners += [
            ((k.tenant_id, kid), k.limits.budgets)
            for kid, k in snap.keys.items()
            if k.active(now_s)
        ]
    budgets = {who: b for who, theirs in owners for b in theirs if b.period == win.period}
    rows = {who for who in spent if request.by_key or not who[1]}
    rows |= set(budgets)
    if wanted:
        rows = {who for who in rows if who[0] in wanted} | {(tid, "") for tid in wanted}
    resp = apb.GetPeriodUsageResponse(durable=usage.durable)
    for tid, key in sorted(rows):
        s = spent.get((tid, key), Spend())
        row = apb.PeriodUsage(
            tenant_id=tid,
            key_id=key,
            period=win.period,
            window=win.label,
            window_start=timestamp(win.start_s),
            window_end=timestamp(win.end_s),
            prompt_tokens=s.prompt,
            cached_tokens=s.cached,
            completion_tokens=s.completion,
            requests=s.requests,
            refusals=s.refusals,
            refusals_by_reason=dict(s.refused),
        )
        budget = budgets.get((tid, key))
        if budget is not None:
            state = judge(budget, s, win)
            row.budget.CopyFrom(budget_to_proto(budget))
            row.budget_spent = state.fraction
            row.warning = state.warning
            row.exhausted = state.exhausted is not None
        resp.usage.append(row)
    return resp
