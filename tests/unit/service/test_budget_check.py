"""The budget check before queueing (service/budget_check.py) over the in-memory
usage log: a tenant's and a key's budgets, the retry delay to the window's end,
the state the gauges read, no read for a tenant without budgets, and Redis down
(open: unchecked; closed: UNAVAILABLE)."""

from __future__ import annotations

import datetime as dt
import socket

import pytest

from scheduler.errors import BudgetExhausted, StoreUnavailable
from scheduler.redis_io import connect
from scheduler.tenancy.budgets import Budget, Window
from scheduler.tenancy.tenants import TenantConfig
from service.budget_check import BudgetCheck
from service.usage_log import MemoryUsageLog, RedisUsageLog, UsageRecord

# 18:00 UTC on 2026-12-04: six hours to the day's end.
NOW_S = dt.datetime(2026, 12, 4, 18, tzinfo=dt.UTC).timestamp()


def _spend(log: MemoryUsageLog, tenant: str, key: str = "", completion: int = 10) -> None:
    log.append(UsageRecord("r", tenant, "m", 5, 0, completion, "stop", NOW_S - 60, key_id=key))


async def test_the_tenant_budget_refuses_until_the_day_ends() -> None:
    log = MemoryUsageLog()
    check = BudgetCheck(log, now_s=lambda: NOW_S)
    acme = TenantConfig("acme", budgets=(Budget("day", tokens=30, warn_at=0.5),))
    await check.check(acme)  # nothing spent
    _spend(log, "acme")
    await check.check(acme)  # 15 of 30: warned, not spent
    state = check.seen[("acme", "", "day")]
    assert (state.tokens_used, state.warning, state.exhausted) == (15, True, None)
    _spend(log, "acme", key="k1")  # a key's spend is the tenant's too
    with pytest.raises(BudgetExhausted) as info:
        await check.check(acme, "k1")
    exc = info.value
    assert exc.reason == "BUDGET_EXHAUSTED" and exc.subject == "tenant:acme"
    assert exc.limit == "budget.day.tokens"
    assert exc.retry_after_s == 6 * 3600
    assert "30 of its day budget of 30 tokens (2026-12-04)" in str(exc)
    # At midnight a new day begins: yesterday's spend does not count.
    await BudgetCheck(log, now_s=lambda: NOW_S + 6 * 3600).check(acme)


async def test_a_key_budget_binds_the_key_alone() -> None:
    log = MemoryUsageLog()
    check = BudgetCheck(log, now_s=lambda: NOW_S)
    acme = TenantConfig("acme", budgets=(Budget("month", requests=10),))
    own = (Budget("day", requests=1),)
    _spend(log, "acme", key="k1")
    with pytest.raises(BudgetExhausted) as info:
        await check.check(acme, "k1", own)
    assert info.value.subject == "tenant:acme/key:k1"
    assert info.value.metadata() == {
        "tenant": "acme",
        "limit": "budget.day.requests",
        "key": "k1",
    }
    await check.check(acme, "k2", own)  # another key of the tenant goes on
    assert check.seen[("acme", "k2", "day")].requests_used == 0
    assert check.seen[("acme", "", "month")].requests_used == 1


async def test_the_tenant_budget_is_checked_before_the_keys() -> None:
    """Both spent: the refusal names the tenant's (the wider one: another key
    would be refused too); a tenant without budgets still checks its key's."""
    log = MemoryUsageLog()
    check = BudgetCheck(log, now_s=lambda: NOW_S)
    own = (Budget("day", tokens=15),)
    _spend(log, "acme", key="k1")  # 15 tokens: the key's day budget is spent
    free = TenantConfig("acme")
    with pytest.raises(BudgetExhausted) as info:
        await check.check(free, "k1", own)
    assert info.value.subject == "tenant:acme/key:k1"
    assert "key 'k1' has spent 15 of its day budget of 15 tokens" in str(info.value)
    acme = TenantConfig("acme", budgets=(Budget("day", requests=1),))
    with pytest.raises(BudgetExhausted) as info:
        await check.check(acme, "k1", own)
    assert (info.value.subject, info.value.limit) == ("tenant:acme", "budget.day.requests")
    # The gauges read the key's state beside the tenant's.
    assert check.seen[("acme", "k1", "day")].exhausted == "tokens"


class _NoReads(MemoryUsageLog):
    async def window_fields(
        self, wins: list[Window], wanted: list[str] | None = None
    ) -> list[dict[str, int]]:
        raise AssertionError("read for a tenant without budgets")


async def test_no_budget_no_read() -> None:
    await BudgetCheck(_NoReads()).check(TenantConfig("free"), "k1")


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_redis_down_open_goes_on_closed_refuses() -> None:
    log = RedisUsageLog(connect(f"redis://127.0.0.1:{_closed_port()}/0", timeout_s=0.2), "x")
    acme = TenantConfig("acme", budgets=(Budget("day", tokens=1),))
    try:
        await BudgetCheck(log).check(acme)
        with pytest.raises(StoreUnavailable):
            await BudgetCheck(log, fail_closed=True).check(acme)
    finally:
        await log.client.aclose()
