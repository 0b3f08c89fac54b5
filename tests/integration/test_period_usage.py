"""The spend per calendar window (service/period_usage.py) as the usage log writes
it: in memory and in a real Redis the same records give the same counters; a
batch written again (a lost reply) counts nothing twice, while two refusals of
one request id are two refusals; the counters outlive their window."""

from __future__ import annotations

import time

import redis as redis_lib

from scheduler.redis_io import connect
from scheduler.tenancy.budgets import Spend, window
from service import period_usage
from service.usage_log import MemoryUsageLog, RedisUsageLog, UsageRecord

NOW_S = time.time()


def _served(rid: str, tenant: str, key: str = "", prompt: int = 10, cached: int = 4) -> UsageRecord:
    return UsageRecord(rid, tenant, "m", prompt, cached, 3, "stop", NOW_S, key_id=key)


def _refused(rid: str, tenant: str, reason: str, n: int) -> UsageRecord:
    return UsageRecord(
        rid, tenant, "m", 0, 0, 0, "refused", NOW_S, refusal=reason, record_id=f"{rid}/r{n}"
    )


RECORDS = [
    _served("a1", "acme"),
    _served("a2", "acme", key="k1", prompt=20, cached=0),
    _served("a3", "acme", key="k2"),
    _served("b1", "beta"),
    _refused("a4", "acme", "BUDGET_EXHAUSTED", 1),
    _refused("a4", "acme", "BUDGET_EXHAUSTED", 2),  # the client retried under the same id
    _refused("b2", "beta", "QUEUE_TIMEOUT", 1),
]
EXPECTED = {
    ("acme", ""): Spend(40, 8, 9, 3, 2, {"BUDGET_EXHAUSTED": 2}),
    ("acme", "k1"): Spend(20, 0, 3, 1),
    ("acme", "k2"): Spend(10, 4, 3, 1),
    ("beta", ""): Spend(10, 4, 3, 1, 1, {"QUEUE_TIMEOUT": 1}),
}


async def _spends(log: MemoryUsageLog | RedisUsageLog) -> list[dict[tuple[str, str], Spend]]:
    wins = [window(p, NOW_S) for p in ("day", "month")]
    return [period_usage.spends(f) for f in await log.window_fields(wins)]


async def test_memory_counts_each_record_into_the_day_and_the_month() -> None:
    log = MemoryUsageLog()
    for r in RECORDS:
        log.append(r)
    day, month = await _spends(log)
    assert day == month == EXPECTED


async def test_redis_counts_the_same_once_per_record(redis_url: str) -> None:
    log = RedisUsageLog(connect(redis_url), "pu")
    try:
        for r in RECORDS:
            log.append(r)
        assert await log.flush()
        # The same batch again (its reply was lost): the markers keep it out.
        for r in RECORDS:
            log.append(r)
        assert await log.flush()
        day, month = await _spends(log)
        assert day == month == EXPECTED
        records, _ = await log.read("", 100)
        assert len(records) == len(RECORDS)
        assert [r.refusal for r in records if r.finish_reason == "refused"] == [
            "BUDGET_EXHAUSTED",
            "BUDGET_EXHAUSTED",
            "QUEUE_TIMEOUT",
        ]
        # The budget check's read: only the fields it asks for.
        win = window("day", NOW_S)
        wanted = period_usage.spend_fields(["acme|", "acme|k1"])
        (fields,) = await log.window_fields([win], wanted)
        assert period_usage.spends(fields)[("acme", "k1")] == Spend(20, 0, 3, 1)
        assert set(fields) <= set(wanted)
    finally:
        await log.aclose()
    r = redis_lib.Redis.from_url(redis_url)
    for period, keep_s in period_usage.KEEP_S.items():
        win = window(period, NOW_S)
        redis_now_s = r.time()[0]
        ttl_s = r.ttl(period_usage.hash_key("pu", win))
        left_s = int(win.end_s) + keep_s - redis_now_s  # EXPIREAT the window's end + keep
        assert left_s - 2 <= ttl_s <= left_s
    r.close()


async def test_an_empty_window_reads_as_no_spend(redis_url: str) -> None:
    tenant = "acme"
    log = RedisUsageLog(connect(redis_url), "empty")
    try:
        wins = [window("day", NOW_S)]
        assert await log.window_fields(wins, period_usage.spend_fields([f"{tenant}|"])) == [{}]
        assert await log.window_fields(wins) == [{}]
    finally:
        await log.aclose()
