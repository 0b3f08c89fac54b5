"""The budget check: before a request is queued, is its subject's budget spent?

A subject is a tenant, or one of its API keys (its own budgets). The spend is
read from the usage log's counters (service/period_usage.py) at every check:
with store=redis one Redis call (HMGET of the current day and month windows,
one slot), so a budget spent through one replica refuses on the others at
their next request. A refusal is BudgetExhausted (RESOURCE_EXHAUSTED,
QuotaFailure naming the budget, RetryInfo until the window ends). A tenant
without budgets costs nothing (no read).

Redis unreachable: with `fail_closed` (redis_failure_mode=closed) the request
is refused with UNAVAILABLE, else it goes on unchecked (the refusal would not
be fair to a tenant within its budget; the spend is still recorded once Redis
is back, so the budget binds again at the next request).

The last state seen per (tenant, key, period) feeds the budget gauges
(service/telemetry/telemetry.py): the fraction spent and the warning flag.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable

from scheduler.errors import BudgetExhausted, StoreUnavailable
from scheduler.redis_io import UNAVAILABLE
from scheduler.tenancy.budgets import Budget, BudgetState, Spend, judge, window
from scheduler.tenancy.tenants import TenantConfig
from service import period_usage
from service.usage_log import UsageLog

log = logging.getLogger(__name__)

# Gauge series are bounded: beyond this many (tenant, key, period) the oldest go.
MAX_SEEN = 4096


class BudgetCheck:
    def __init__(
        self,
        usage: UsageLog,
        *,
        fail_closed: bool = False,
        now_s: Callable[[], float] = time.time,
    ) -> None:
        self.usage = usage
        self.fail_closed = fail_closed
        self.now_s = now_s
        self.seen: dict[tuple[str, str, str], BudgetState] = {}
        self._warned = False

    async def check(
        self, tenant: TenantConfig, key_id: str = "", key_budgets: tuple[Budget, ...] = ()
    ) -> None:
        """Raise BudgetExhausted when a budget of the tenant (or of its key) is spent."""
        subjects = [(period_usage.subject(tenant.tenant_id), "", tenant.budgets)]
        if key_id and key_budgets:
            subjects.append((period_usage.subject(tenant.tenant_id, key_id), key_id, key_budgets))
        if not any(budgets for _, _, budgets in subjects):
            return
        now_s = self.now_s()
        periods = sorted({b.period for _, _, budgets in subjects for b in budgets})
        wins = [window(p, now_s, self.usage.utc_offset_min) for p in periods]
        wanted = period_usage.spend_fields(s for s, _, _ in subjects)
        try:
            fields = await self.usage.window_fields(wins, wanted)
        except UNAVAILABLE as exc:
            if self.fail_closed:
                raise StoreUnavailable(f"budgets cannot be read: {exc}") from exc
            if not self._warned:
                log.warning("budgets unchecked while Redis is unreachable: %s", exc)
                self._warned = True
            return
        self._warned = False
        by_period = {
            w.period: (w, period_usage.spends(f)) for w, f in zip(wins, fields, strict=True)
        }
        for _, key, budgets in subjects:
            for budget in budgets:
                win, found = by_period[budget.period]
                spend = found.get((tenant.tenant_id, key), Spend())
                state = judge(budget, spend, win)
                self._note(tenant.tenant_id, key, state)
                limit = state.exhausted
                if limit is not None:
                    raise _refusal(tenant.tenant_id, key, state, limit, now_s)

    def _note(self, tenant_id: str, key_id: str, state: BudgetState) -> None:
        where = (tenant_id, key_id, state.budget.period)
        self.seen.pop(where, None)
        self.seen[where] = state
        if len(self.seen) > MAX_SEEN:
            del self.seen[next(iter(self.seen))]


def _refusal(
    tenant_id: str, key_id: str, state: BudgetState, limit: str, now_s: float
) -> BudgetExhausted:
    b, win = state.budget, state.window
    cap, used = (
        (b.tokens, state.tokens_used) if limit == "tokens" else (b.requests, state.requests_used)
    )
    whose = f"key {key_id!r}" if key_id else "the tenant"
    return BudgetExhausted(
        tenant_id,
        f"{b.name}.{limit}",
        f"{whose} has spent {used} of its {b.period} budget of {cap} {limit} "
        f"({win.label}); it resets at the window's end",
        retry_after_s=max(0.001, win.end_s - now_s),
        key_id=key_id,
    )
