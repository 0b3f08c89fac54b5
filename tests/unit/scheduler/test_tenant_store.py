"""The in-memory tenant store: versions, atomic batches, invariants, key records."""

from __future__ import annotations

import pytest

from scheduler.tenant_store import (
    MUST_NOT_EXIST,
    AlreadyExists,
    ApiKeyRecord,
    DeleteTenant,
    InMemoryTenantStore,
    NotFound,
    PutTenant,
    SetDefaultTenant,
    StoreConstraint,
    VersionConflict,
)
from scheduler.tenants import TenantConfig


def _key(key_id: str, tenant: str) -> ApiKeyRecord:
    return ApiKeyRecord(key_id, tenant, "hmac-sha256:00", "", created_at_s=1.0)


async def test_versions_and_conflicts() -> None:
    store = InMemoryTenantStore()
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


async def test_batches_are_atomic_and_keep_the_default_valid() -> None:
    store = InMemoryTenantStore()
    await store.write_tenants(
        [PutTenant(TenantConfig("a")), PutTenant(TenantConfig("b")), SetDefaultTenant("a")],
        now_s=1.0,
    )
    before = await store.snapshot()
    with pytest.raises(VersionConflict):
        await store.write_tenants(
            [PutTenant(TenantConfig("c")), PutTenant(TenantConfig("b", weight=9), 7)], now_s=2.0
        )
    assert await store.snapshot() is before  # nothing of the batch applied
    with pytest.raises(StoreConstraint, match="default tenant"):
        await store.write_tenants([DeleteTenant("a")], now_s=2.0)
    snap = await store.write_tenants([SetDefaultTenant(None), DeleteTenant("a")], now_s=2.0)
    assert snap.default_tenant_id is None and set(snap.tenants) == {"b"}


async def test_keys_follow_their_tenant_and_issued_count_is_sticky() -> None:
    store = InMemoryTenantStore()
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
