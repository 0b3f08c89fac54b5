"""Two replicas (two Apps in one process) sharing tenants and API keys through one
real Redis (store=redis): admin changes on one replica reach the other within a
second, concurrent conflicting updates leave exactly one winner, everything
survives a restart of both, and a Redis outage keeps the last snapshot serving."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from fairgate import AsyncClient, FairgateError
from fairgate.v1 import admin_pb2 as apb
from google.protobuf import field_mask_pb2

from scheduler.tenancy.redis_tenant_store import RedisTenantStore
from service.app import App
from tests.conftest import StartServer
from tests.integration.admin.conftest import ADMIN_TOKEN
from tests.integration.admin.test_auth import admin_call, issue
from tests.redis_server import RedisServer, find_redis_server

TENANTS = """
default_tenant: seeded
tenants:
  - id: seeded
    weight: 2
"""
PROPAGATION_S = 1.0


def settings(redis_url: str, tenants_file: str, **extra: Any) -> dict[str, Any]:
    return {
        "store": "redis",
        "redis_url": redis_url,
        "tenants_file": tenants_file,
        "admin_token": ADMIN_TOKEN,
        # The same pepper on every replica: a key issued on one verifies on all.
        "api_key_pepper": "replicas-share-this-pepper",
        "tenant_sync_interval_s": 0.5,
        **extra,
    }


async def pair(start_server: StartServer, **kw: Any) -> tuple[App, App]:
    """Two replicas starting together (both try to seed the empty store)."""
    a, b = await asyncio.gather(start_server(**kw), start_server(**kw))
    return a, b


async def within(seconds: float, check: Callable[[], Awaitable[bool]], what: str) -> float:
    """Seconds until `check()` held; fails after `seconds`."""
    start = time.monotonic()
    while not await check():
        if time.monotonic() - start > seconds:
            raise AssertionError(f"not within {seconds} s: {what}")
        await asyncio.sleep(0.02)
    return time.monotonic() - start


async def serves(app: App, secret: str) -> bool:
    async with AsyncClient(app.address, api_key=secret) as c:
        try:
            await c.complete("hi", max_tokens=2)
        except FairgateError as exc:
            assert exc.code == grpc.StatusCode.UNAUTHENTICATED, exc
            return False
    return True


async def refuses(app: App, secret: str) -> bool:
    return not await serves(app, secret)


async def update_weight(app: App, tenant: str, weight: float, etag: str = "") -> apb.Tenant:
    req = apb.UpdateTenantRequest(
        tenant=apb.Tenant(id=tenant, weight=weight, etag=etag),
        update_mask=field_mask_pb2.FieldMask(paths=["weight"]),
    )
    resp: apb.UpdateTenantResponse = await admin_call(app, "UpdateTenant", req)
    return resp.tenant


def dispatcher_weight(app: App, tenant: str) -> float:
    model = app.models.resolve("")
    assert model is not None
    return model.dispatcher.quotas.tenants.weight_of(tenant)


@pytest.fixture
def tenants_file(tmp_path: Path) -> str:
    path = tmp_path / "tenants.yaml"
    path.write_text(TENANTS)
    return str(path)


async def test_admin_changes_reach_the_other_replica_and_survive_restarts(
    start_server: StartServer, redis_url: str, tenants_file: str
) -> None:
    kw = settings(redis_url, tenants_file)
    a, b = await pair(start_server, **kw)
    store = RedisTenantStore.from_url(redis_url)
    seeded = await store.snapshot()
    assert seeded.revision == 1 and set(seeded.tenants) == {"seeded"}  # seeded once

    # Create a tenant and issue a key on A: usable on B within a second.
    await admin_call(
        a, "CreateTenant", apb.CreateTenantRequest(tenant=apb.Tenant(id="team", weight=1))
    )
    key = await issue(a, "team")
    spare = await issue(a, "team")
    await within(PROPAGATION_S, lambda: serves(b, key.secret), "key usable on B")
    # B follows: without a key it is now refused (auto mode, keys in use).
    assert await refuses(b, "")

    # Revoke on A: refused on B within a second (the spare key still works).
    await admin_call(a, "RevokeApiKey", apb.RevokeApiKeyRequest(key_id=key.key.key_id))
    await within(PROPAGATION_S, lambda: refuses(b, key.secret), "revoked on B")

    # A weight changed on A: B's registry and its fair scheduler see it.
    await update_weight(a, "team", 3.0)

    async def reweighed() -> bool:
        return b.directory is not None and b.directory.weight_of("team") == 3.0

    await within(PROPAGATION_S, reweighed, "weight on B")
    assert dispatcher_weight(b, "team") == 3.0

    # Conflicting updates through A and B with the same etag: exactly one wins.
    etag = (await admin_call(a, "GetTenant", apb.GetTenantRequest(tenant_id="team"))).tenant.etag
    results = await asyncio.gather(
        update_weight(a, "team", 5.0, etag),
        update_weight(b, "team", 7.0, etag),
        return_exceptions=True,
    )
    won = [r for r in results if isinstance(r, apb.Tenant)]
    lost = [r for r in results if isinstance(r, FairgateError)]
    assert len(won) == 1 and len(lost) == 1, results
    assert lost[0].code == grpc.StatusCode.ABORTED and lost[0].reason == "ETAG_MISMATCH"
    assert lost[0].metadata["current_etag"] == won[0].etag
    final_weight = won[0].weight

    # Restart both replicas (the tenants file must not re-seed a store in use).
    before = await store.snapshot()
    await asyncio.gather(a.stop(grace_s=0.2), b.stop(grace_s=0.2))
    a2, b2 = await pair(start_server, **kw)
    assert await store.snapshot() == before
    for app in (a2, b2):
        assert app.directory is not None
        assert app.directory.weight_of("team") == final_weight
        assert dispatcher_weight(app, "team") == final_weight
        assert await serves(app, spare.secret)
        assert await refuses(app, key.secret)
    await store.aclose()


@pytest.fixture
def own_redis() -> Iterator[RedisServer]:
    binary = find_redis_server()
    assert binary is not None
    srv = RedisServer(binary)
    srv.start()
    yield srv
    srv.stop()


async def test_redis_outage_keeps_the_last_snapshot_and_a_wiped_redis_is_restored(
    start_server: StartServer, own_redis: RedisServer, tenants_file: str
) -> None:
    kw = settings(own_redis.url, tenants_file, redis_timeout_s=0.3, redis_retry_s=0.1)
    a, b = await pair(start_server, **kw)
    key = await issue(a, "seeded")
    await within(PROPAGATION_S, lambda: serves(b, key.secret), "key usable on B")

    own_redis.kill()
    # Both replicas keep serving the last snapshot (the dispatcher fails open).
    assert await serves(b, key.secret) and await serves(a, key.secret)
    with pytest.raises(FairgateError) as err:
        await update_weight(a, "seeded", 4.0)
    assert err.value.code == grpc.StatusCode.UNAVAILABLE and err.value.retry_after_s
    with pytest.raises(FairgateError) as err:
        await admin_call(b, "ListTenants", apb.ListTenantsRequest())
    assert err.value.code == grpc.StatusCode.UNAVAILABLE

    # Redis comes back empty (no persistence): a replica writes its snapshot back.
    own_redis.start()
    store = RedisTenantStore.from_url(own_redis.url)

    async def restored() -> bool:
        return "seeded" in (await store.snapshot()).tenants

    await within(2 * PROPAGATION_S, restored, "tenant store restored")
    snap = await store.snapshot()
    assert key.key.key_id in snap.keys and snap.default_tenant_id == "seeded"
    assert await serves(b, key.secret)
    # Writes work again and reach the other replica.
    await update_weight(a, "seeded", 4.0)

    async def reweighed() -> bool:
        return b.directory is not None and b.directory.weight_of("seeded") == 4.0

    await within(PROPAGATION_S, reweighed, "weight on B after the outage")
    await store.aclose()
