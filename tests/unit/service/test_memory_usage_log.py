"""The in-memory usage log: read in pages from a cursor, the oldest dropped past
its bound, and its rows out of the garbage collector's walks."""

from __future__ import annotations

import gc

from service.usage_log import MemoryUsageLog, UsageRecord


def _record(i: int) -> UsageRecord:
    return UsageRecord(f"r{i}", "acme", "m", 10 + i, 0, 5, "stop", 1.0e9 + i, key_id="k1")


async def test_pages_follow_the_cursor_past_the_dropped_oldest() -> None:
    log = MemoryUsageLog(max_records=5)
    for i in range(8):
        log.append(_record(i))
    # Records 0-2 were dropped: a cursor before them starts at the oldest kept.
    page, cursor = await log.read("", 2)
    assert [r.request_id for r in page] == ["r3", "r4"]
    assert [r.cursor for r in page] == ["4", "5"] and cursor == "5"
    page, cursor = await log.read(cursor, 10)
    assert [r.request_id for r in page] == ["r5", "r6", "r7"] and cursor == "8"
    assert page[-1] == UsageRecord(
        "r7", "acme", "m", 17, 0, 5, "stop", 1.0e9 + 7, cursor="8", key_id="k1"
    )
    assert await log.read(cursor, 10) == ([], "8")
    log.append(_record(8))
    assert [r.request_id for r in (await log.read(cursor, 10))[0]] == ["r8"]


def test_kept_records_leave_the_collectors_sight() -> None:
    log = MemoryUsageLog()
    for i in range(100):
        log.append(_record(i))
    gc.collect()
    assert not any(gc.is_tracked(row) for row in log._rows)
