"""Recorded spend survives a restart of Redis (docs/operations.md#usage-per-period).

A real redis-server with AOF (`appendonly yes`, `appendfsync everysec`, the
persistence the docs require) is killed (SIGKILL: a crash, no shutdown save)
after the documented second has passed, and started again on the same
directory: the day's counters are back, and the budget still binds, exactly
where it was: the requests left before the restart are served and the next is
refused.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from fairgate import AsyncClient, FairgateError

from scheduler.tenancy.budgets import window
from service import period_usage
from service.app import App
from tests.conftest import StartServer
from tests.redis_server import RedisServer, find_redis_server

TENANTS = """
tenants:
  - id: capped
    budgets:
      - {period: day, requests: 4}
"""


@pytest.fixture
def aof_redis() -> Iterator[RedisServer]:
    binary = find_redis_server()
    assert binary is not None, "no redis-server (install the dev extra)"
    srv = RedisServer(binary, args=["--appendonly", "yes", "--appendfsync", "everysec"])
    srv.start()
    yield srv
    srv.stop()


async def _requests_today(app: App) -> int:
    assert app.usage is not None
    win = window("day", time.time(), app.usage.utc_offset_min)
    (fields,) = await app.usage.window_fields([win])
    return period_usage.spends(fields).get(("capped", ""), period_usage.Spend()).requests


async def _complete(app: App) -> None:
    async with AsyncClient(app.address, tenant="capped") as c:
        await c.complete("hello", max_tokens=2)


async def test_spend_survives_a_redis_crash_with_aof(
    start_server: StartServer, aof_redis: RedisServer, tmp_path: Path
) -> None:
    tenants = tmp_path / "tenants.yaml"
    tenants.write_text(TENANTS)
    app = await start_server(store="redis", redis_url=aof_redis.url, tenants_file=str(tenants))
    for _ in range(3):
        await _complete(app)
    deadline = time.monotonic() + 10
    while await _requests_today(app) < 3:
        assert time.monotonic() < deadline, "the spend was never written"
        await asyncio.sleep(0.05)
    # everysec: what was written more than a second ago is on disk.
    await asyncio.sleep(1.5)
    aof_redis.kill()
    aof_redis.start()

    # The counters are back (read once the client has reconnected).
    deadline = time.monotonic() + 10
    while True:
        try:
            assert await _requests_today(app) == 3
            break
        except ConnectionError:
            assert time.monotonic() < deadline
            await asyncio.sleep(0.1)
    # One request left in the day's budget, then refused: nothing was lost or doubled.
    deadline = time.monotonic() + 10
    while True:  # the scheduler's own store may hold new admissions for a moment
        try:
            await _complete(app)
            break
        except FairgateError as exc:
            assert exc.reason != "BUDGET_EXHAUSTED", exc
            assert time.monotonic() < deadline, exc
            await asyncio.sleep(0.1)
    deadline = time.monotonic() + 10
    while await _requests_today(app) < 4:
        assert time.monotonic() < deadline
        await asyncio.sleep(0.05)
    with pytest.raises(FairgateError) as info:
        await _complete(app)
    assert info.value.reason == "BUDGET_EXHAUSTED"
