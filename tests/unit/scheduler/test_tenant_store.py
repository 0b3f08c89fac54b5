"""Every tenant store (in memory; Redis, a real server): versions, atomic batches,
invariants, key records. One contract, so the Redis store cannot drift."""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import AsyncIterator

import pytest
import redis as redis_lib

from scheduler.errors import StoreUnavailable
from scheduler.request import Priority
from scheduler.tenancy import redis_tenant_store
from scheduler.tenancy.budgets import Budget
from scheduler.tenancy.key_limits import KeyLimits
from scheduler.tenancy.redis_tenant_store import RedisTenantStore
from scheduler.tenancy.tenant_store import (
    MUST_NOT_EXIST,
    AlreadyExists,
    ApiKeyRecord,
    DeleteTenant,
    InMemoryTenantStore,
    NotFound,
    PutTenant,
    SetDefaultTenant,
    StoreConstraint,
    TenantStore,
    VersionConflict,
)
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas
from tests.redis_server import free_port


@pytest.fixture(params=["memory", "redis"])
async def store(request: pytest.FixtureRequest) -> AsyncIterator[TenantStore]:
    if request.param == "memory":
        yield InMemoryTenantStore()
        return
    s = RedisTenantStore.from_url(request.getfixturevalue("redis_url"))
    yield s
    await s.aclose()


def _key(key_id: str, tenant: str) -> ApiKeyRecord:
    return ApiKeyRecord(key_id, tenant, "hmac-sha256:00", "", created_at_s=1.0)


async def test_versions_and_conflicts(store: TenantStore) -> None:
    snap = await store.write_tenants([PutTenant(TenantConfig("a"), MUST_NOT_EXIST)], now_s=1.0)
    assert snap.tenants["a"].version == 1 and snap.revision == 1
    with pytest.raises(AlreadyExists):
        await store.write_tenants([PutTenant(TenantConfig("a"), MUST_NOT_EXIST)], now_s=2.0)
    snap = await store.write_tenants([PutTenant(TenantConfig("a", weight=2), 1)], now_s=3.0)
    rec = snap.tenants["a"]
    assert (rec.version, rec.created_at_s, rec.updated_at_s) == (2, 1.0, 3.0)
    with pytest.raises(VersionConflict) as err:
        await store.write_tenants([PutTenant(TenantConfig("a", weight=5), 1)], now_s=4.0)
    assert err.value.current == 2 and "stale" in str(err.value)
    with pytest.raises(VersionConflict):
        await store.write_tenants([DeleteTenant("a", 1)], now_s=4.0)
    with pytest.raises(NotFound):
        await store.write_tenants([DeleteTenant("zzz")], now_s=4.0)
    with pytest.raises(VersionConflict):
        await store.write_tenants([], now_s=4.0, expected_revision=0)


async def test_batches_are_atomic_and_keep_the_default_valid(store: TenantStore) -> None:
    await store.write_tenants(
        [PutTenant(TenantConfig("a")), PutTenant(TenantConfig("b")), SetDefaultTenant("a")],
        now_s=1.0,
    )
    before = await store.snapshot()
    with pytest.raises(VersionConflict):
        await store.write_tenants(
            [PutTenant(TenantConfig("c")), PutTenant(TenantConfig("b", weight=9), 7)], now_s=2.0
        )
    assert await store.snapshot() == before  # nothing of the batch applied
    with pytest.raises(StoreConstraint, match="default tenant"):
        await store.write_tenants([DeleteTenant("a")], now_s=2.0)
    snap = await store.write_tenants([SetDefaultTenant(None), DeleteTenant("a")], now_s=2.0)
    assert snap.default_tenant_id is None and set(snap.tenants) == {"b"}


async def test_keys_follow_their_tenant_and_issued_count_is_sticky(store: TenantStore) -> None:
    await store.write_tenants([PutTenant(TenantConfig("a"))], now_s=1.0)
    with pytest.raises(NotFound):
        await store.add_key(_key("k0", "nobody"))
    await store.add_key(_key("k1", "a"))
    revoked = await store.expire_key("k1", 5.0)
    assert not revoked.active(5.0) and revoked.active(4.9)
    # Expiry never moves later.
    assert (await store.expire_key("k1", 9.0)).expires_at_s == 5.0
    old = await store.rotate_key("k1", _key("k2", "a"), 3.0)
    assert old.expires_at_s == 3.0
    with pytest.raises(AlreadyExists):
        await store.rotate_key("k2", _key("k1", "a"), 3.0)
    assert "k1" in (await store.snapshot()).keys  # the failed rotation changed nothing
    snap = await store.write_tenants([DeleteTenant("a")], now_s=6.0)
    assert snap.keys == {} and snap.keys_issued_total == 2


async def test_records_round_trip_exactly_and_each_write_is_one_revision(
    store: TenantStore,
) -> None:
    cfg = TenantConfig(
        "team-a",
        weight=0.1 + 0.2,
        priorities=frozenset({Priority.BATCH}),
        enabled=False,
        quotas=TenantQuotas(requests_per_s=2.5, tokens_per_min=60000, max_concurrent=3),
        over_quota="wait",
    )
    snap = await store.write_tenants([PutTenant(cfg), SetDefaultTenant("team-a")], now_s=1.25)
    key = ApiKeyRecord("k1", "team-a", "hmac-sha256:ab", "ci bot ✓", created_at_s=1.5)
    await store.add_key(key)
    rotated = ApiKeyRecord("k2", "team-a", "hmac-sha256:cd", "ci bot ✓", created_at_s=2.0)
    await store.rotate_key("k1", rotated, 1234567890.123456)
    got = await store.snapshot()
    assert got.revision == snap.revision + 2 == await store.revision()
    assert got.tenants == snap.tenants and got.tenants["team-a"].config == cfg
    assert got.default_tenant_id == "team-a" and got.keys_issued_total == 2
    assert got.keys == {
        "k1": dataclasses.replace(key, expires_at_s=1234567890.123456),
        "k2": rotated,
    }
    # A no-op (expiry never moves later) writes nothing.
    await store.expire_key("k1", 9e9)
    assert await store.revision() == got.revision


async def test_redis_concurrent_writers_one_wins_and_state_outlives_clients(
    redis_url: str,
) -> None:
    first = RedisTenantStore.from_url(redis_url)
    await first.write_tenants([PutTenant(TenantConfig("a"), MUST_NOT_EXIST)], now_s=1.0)
    others = [RedisTenantStore.from_url(redis_url) for _ in range(4)]
    try:
        results = await asyncio.gather(
            *(
                s.write_tenants([PutTenant(TenantConfig("a", weight=i + 2), 1)], now_s=2.0)
                for i, s in enumerate(others)
            ),
            return_exceptions=True,
        )
        assert sum(not isinstance(r, BaseException) for r in results) == 1, results
        assert all(isinstance(r, VersionConflict) for r in results if isinstance(r, Exception))
        # Unconditional writes all land (each retried on the newer revision).
        await asyncio.gather(
            *(
                s.write_tenants([PutTenant(TenantConfig(f"n{i}"))], now_s=3.0)
                for i, s in enumerate(others)
            )
        )
        fresh = RedisTenantStore.from_url(redis_url)
        snap = await fresh.snapshot()
        await fresh.aclose()
        assert set(snap.tenants) == {"a", "n0", "n1", "n2", "n3"}
        assert snap.tenants["a"].version == 2 and snap.revision == 6
    finally:
        for s in others:
            await s.aclose()
    r = redis_lib.Redis.from_url(redis_url)
    # One hash tag: every key in one Cluster slot.
    # (Only keys naming tenants: other tests' leftovers may share the session's Redis.)
    written = sorted(k.decode() for k in r.keys("*tenants*"))
    assert written == ["fg:{tenants}:meta", "fg:{tenants}:t"]
    r.script_flush()
    r.close()
    await first.write_tenants([DeleteTenant("n0")], now_s=4.0)  # NOSCRIPT → EVAL
    assert first.noscript_reloads >= 1 and "n0" not in (await first.snapshot()).tenants
    await first.aclose()


async def test_redis_unreachable_is_store_unavailable() -> None:
    store = RedisTenantStore.from_url(f"redis://127.0.0.1:{free_port()}/0", timeout_s=0.2)
    with pytest.raises(StoreUnavailable):
        await store.revision()
    with pytest.raises(StoreUnavailable):
        await store.write_tenants([PutTenant(TenantConfig("a"))], now_s=1.0)
    await store.aclose()


async def test_a_keys_budgets_round_trip(store: TenantStore) -> None:
    cfg = TenantConfig("team-b", budgets=(Budget("day", tokens=1000),))
    await store.write_tenants([PutTenant(cfg)], now_s=1.0)
    await store.add_key(_key("kb", "team-b"))
    limits = KeyLimits(
        priorities=frozenset({Priority.BATCH}),
        budgets=(
            Budget("day", tokens=500, counts=frozenset({"completion"}), warn_at=0.5),
            Budget("month", requests=20),
        ),
    )
    assert (await store.set_key_limits("kb", limits)).limits == limits
    assert (await store.snapshot()).keys["kb"].limits == limits
    cleared = await store.set_key_limits("kb", dataclasses.replace(limits, budgets=()))
    assert (await store.snapshot()).keys["kb"] == cleared and cleared.limits.budgets == ()


def test_a_redis_key_record_written_before_budgets_reads_back_none() -> None:
    old = (
        '{"created_at_s": 1.0, "expires_at_s": null, "hash": "hmac-sha256:00", '
        '"limits": {"priorities": ["batch"], "quotas": {"max_concurrent": 2}}, '
        '"name": "", "tenant": "t"}'
    )
    record = redis_tenant_store._key_of("k", old)
    assert record.limits == KeyLimits(
        TenantQuotas(max_concurrent=2), frozenset({Priority.BATCH}), budgets=()
    )
