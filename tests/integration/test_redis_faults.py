"""Redis faults against a fleet of replicas, with real redis-server processes
(SIGKILL, SIGSTOP, restart, a broken key): judged by invariants — nothing lost,
the engine limit never exceeded, one failover transition per outage per
replica, quota overshoot, recovery. Numbers are printed (pytest -s)."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator, Iterator

import pytest
import redis as redis_lib

from scheduler.budget import AdmissionLimits
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas, TenantRegistry
from tests.helpers import eventually
from tests.integration.redis_fleet import DOMAIN, LIMIT, Fleet, assert_nothing_left
from tests.redis_server import RedisServer, find_redis_server


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    binary = find_redis_server()
    assert binary is not None
    srv = RedisServer(binary)
    srv.start()
    yield srv
    if srv.proc is not None:
        srv.resume()  # a stopped server ignores SIGTERM
    srv.stop()


@pytest.fixture
async def fleets() -> AsyncIterator[list[Fleet]]:
    made: list[Fleet] = []
    yield made
    for f in made:
        await f.aclose()


async def started(fleets: list[Fleet], fleet: Fleet) -> Fleet:
    fleets.append(fleet)
    await fleet.start()
    return fleet


@pytest.mark.parametrize("mode", ["open", "closed"])
async def test_restart_is_one_outage_per_replica(
    own_redis: RedisServer, fleets: list[Fleet], mode: str
) -> None:
    """SIGKILL, then a restart (empty) under load: each replica fails over once and
    comes back once, though its pooled connections to the old server each fail once
    (a request quota in reject mode: each arrival reserves in Redis beside the pump's
    steps, so each replica's pool holds several); fail-closed refuses nothing once
    back; the engine limit holds throughout."""
    tenants = TenantRegistry(
        [TenantConfig("t", quotas=TenantQuotas(requests_per_s=1e4, requests_burst=1e4))]
    )
    fleet = await started(
        fleets,
        Fleet(own_redis.url, 3, AdmissionLimits(LIMIT, 10_000), tenants, failure_mode=mode),
    )
    fleet.load(per_replica=4)
    await eventually(lambda: fleet.record.count("done") >= 30, what="load runs")
    own_redis.kill()
    await eventually(lambda: fleet.modes() == [mode] * 3, what=f"every replica fails {mode}")
    await asyncio.sleep(0.3)
    own_redis.start()
    await eventually(lambda: fleet.modes() == ["ok"] * 3, what="every replica is back")
    back_s = time.monotonic()
    done = fleet.record.count("done")
    await eventually(lambda: fleet.record.count("done") >= done + 30, what="load runs again")
    await fleet.stop_load()
    print(
        f"\nrestart ({mode}): transitions per replica {fleet.transitions()}, "
        f"engine peak {fleet.engine.peak}/{LIMIT}, refused after back "
        f"{fleet.record.count('unavailable', after_s=back_s)}, "
        f"refused during {fleet.record.count('unavailable')}"
    )
    assert fleet.transitions() == [2, 2, 2]
    assert fleet.engine.peak <= LIMIT
    assert fleet.record.count("unavailable", after_s=back_s) == 0
    assert {o for _, _, o in fleet.record.outcomes} <= {"done", "unavailable"}
    await assert_nothing_left(fleet)


async def test_one_slow_call_does_not_fail_over(
    own_redis: RedisServer, fleets: list[Fleet]
) -> None:
    """Redis stopped (SIGSTOP) a little longer than one call's timeout: calls time out
    once, are retried after a backoff, and no replica fails over — though arrivals
    reserving their request quota (reject mode) time out all through the pause."""
    tenants = TenantRegistry(
        [TenantConfig("t", quotas=TenantQuotas(requests_per_s=1e4, requests_burst=1e4))]
    )
    fleet = await started(fleets, Fleet(own_redis.url, 3, AdmissionLimits(LIMIT, 10_000), tenants))
    fleet.load(per_replica=4)
    await eventually(lambda: fleet.record.count("done") >= 20, what="load runs")
    own_redis.pause()
    await asyncio.sleep(0.4)  # the timeout is 0.3 s
    own_redis.resume()
    done = fleet.record.count("done")
    await eventually(lambda: fleet.record.count("done") >= done + 20, what="load runs again")
    await fleet.stop_load()
    print(f"\nSIGSTOP 0.4 s (timeout 0.3 s): transitions per replica {fleet.transitions()}")
    assert fleet.transitions() == [0, 0, 0]
    assert fleet.record.count("unavailable") == 0
    assert fleet.engine.peak <= LIMIT
    await assert_nothing_left(fleet)


async def test_fail_open_overshoots_a_quota_by_at_most_a_request_per_replica(
    own_redis: RedisServer, fleets: list[Fleet]
) -> None:
    """A token quota half used when Redis dies under load: the fail-open buckets
    start from the levels last seen (each replica's share, less what it took since),
    so the fleet's grant over the whole outage stays within the quota plus one
    request per replica (the step in flight when Redis died)."""
    burst, kv = 2000, 100
    tenants = TenantRegistry(
        [
            TenantConfig(
                "q",
                over_quota="wait",
                quotas=TenantQuotas(tokens_per_min=6, tokens_burst=burst),  # 0.1 token/s
            )
        ]
    )
    fleet = await started(fleets, Fleet(own_redis.url, 3, AdmissionLimits(100, 100_000), tenants))
    start_s = time.monotonic()
    fleet.load(per_replica=3, tenant="q", kv=kv, hold_s=0.01)
    await eventually(lambda: fleet.record.granted_tokens["q"] >= burst // 2, what="half used")
    own_redis.kill()
    await eventually(lambda: fleet.modes() == ["open"] * 3, what="every replica fails open")
    await asyncio.sleep(1.0)  # the outage: the clients keep asking
    await fleet.stop_load()
    quota = burst + 0.1 * (time.monotonic() - start_s)
    overshoot = (fleet.record.granted_tokens["q"] - quota) / kv
    print(
        f"\nfail-open quota: granted {fleet.record.granted_tokens['q']} tokens of "
        f"{quota:.0f}: overshoot {overshoot:+.2f} max requests (3 replicas)"
    )
    assert overshoot <= 3


async def test_a_script_error_is_a_store_failure_and_the_pump_lives(
    own_redis: RedisServer, fleets: list[Fleet], caplog: pytest.LogCaptureFixture
) -> None:
    """A key of the wrong type makes the STEP script fail (ResponseError): that is a
    store failure (fail open), never an exception that kills the pump."""
    caplog.set_level(logging.ERROR, logger="scheduler.shared.dispatcher")
    fleet = await started(fleets, Fleet(own_redis.url, 1, AdmissionLimits(LIMIT, 10_000)))
    fleet.load(per_replica=2)
    await eventually(lambda: fleet.record.count("done") >= 10, what="load runs")
    r = redis_lib.Redis(port=own_redis.port)
    key = f"fg:{{{DOMAIN}}}:in"
    r.delete(key)
    r.set(key, "not a hash")  # every step's script now fails
    await eventually(lambda: fleet.modes() == ["open"], what="failing open")
    done = fleet.record.count("done")
    await eventually(lambda: fleet.record.count("done") >= done + 10, what="fail-open admits")
    r.delete(key)
    r.close()
    await eventually(lambda: fleet.modes() == ["ok"], what="back")
    await fleet.stop_load()
    d = fleet.replicas[0]
    assert d.state.health.transitions_total == 2 and "script" in d.state.health.last_error.lower()
    assert d.state.pump_restarts_total == 0 and not caplog.records
    assert fleet.record.count("unavailable") == 0


async def test_leases_that_end_during_a_probe_are_released(
    own_redis: RedisServer, fleets: list[Fleet]
) -> None:
    """Requests admitted while failing open end while the reconciling probe is away
    (Redis stopped mid-probe): the leases the probe re-registered are released at
    once, not left to expire (lease TTL 10 s)."""
    fleet = await started(
        fleets, Fleet(own_redis.url, 1, AdmissionLimits(LIMIT, 10_000), timeout_s=1.5)
    )
    own_redis.kill()
    d = fleet.replicas[0]
    running = [asyncio.create_task(fleet.one(0, "t", 100, hold_s=0.8)) for _ in range(3)]
    await eventually(lambda: d.state.health.mode == "open" and d.in_flight == 3, what="3 fail-open")
    own_redis.start()
    own_redis.pause()  # the next probe is sent and hangs
    await asyncio.gather(*running)  # they end while the probe waits
    own_redis.resume()
    await eventually(lambda: d.state.health.mode == "ok", what="reconciled")
    assert d.state.health.reconciled_leases == 3  # the probe did re-register them
    await assert_nothing_left(fleet)


async def test_a_wiped_redis_under_load(own_redis: RedisServer, fleets: list[Fleet]) -> None:
    """FLUSHALL under load (no replica sees an outage): the replica whose step finds
    the state gone re-registers its leases and admits nothing until every replica
    has renewed its own (a heartbeat); the others learn nothing from the store."""
    fleet = await started(fleets, Fleet(own_redis.url, 3, AdmissionLimits(LIMIT, 10_000)))
    fleet.load(per_replica=4, hold_s=0.1)
    await eventually(lambda: fleet.record.count("done") >= 20, what="load runs")
    r = redis_lib.Redis(port=own_redis.port)
    r.flushall()
    r.close()
    done = fleet.record.count("done")
    await eventually(lambda: fleet.record.count("done") >= done + 40, what="load runs again")
    await fleet.stop_load()
    print(f"\nFLUSHALL: engine peak {fleet.engine.peak}/{LIMIT}, transitions {fleet.transitions()}")
    assert fleet.transitions() == [0, 0, 0]
    assert fleet.engine.peak <= LIMIT
    await assert_nothing_left(fleet)
