"""FAIRGATE_IDLE_TENANT_TTL_S reaches both dispatchers `build_dispatcher` makes."""

from __future__ import annotations

import asyncio

import pytest

from scheduler.budget import AdmissionLimits
from scheduler.clock import MonotonicClock
from scheduler.request import QueuedRequest
from scheduler.tenancy.tenants import TenantConfig, TenantRegistry
from service.app import policy_options
from service.settings import Settings
from service.shared_state import build_dispatcher


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_an_idle_unconfigured_tenant_is_forgotten_after_the_configured_ttl(
    store: str, request: pytest.FixtureRequest
) -> None:
    env = {"FAIRGATE_IDLE_TENANT_TTL_S": "1"}  # the default, 600 s, would outlast the test
    if store == "redis":
        env |= {
            "FAIRGATE_STORE": "redis",
            "FAIRGATE_REDIS_URL": request.getfixturevalue("redis_url"),
        }
    settings = Settings.from_env(env)
    clock = MonotonicClock()
    reg = TenantRegistry([], template=TenantConfig("x"))  # open mode: any id is a tenant
    gate = await build_dispatcher(
        settings, policy_options(settings, clock, reg), AdmissionLimits(4, 10_000), clock, reg, "m"
    )
    n = 0

    async def one(tenant_id: str) -> None:
        nonlocal n
        n += 1
        async with gate.admitted(QueuedRequest(f"r{n}", tenant_id, 10, 10)) as ticket:
            ticket.charge(10)

    def known() -> set[str]:
        return {t.tenant_id for t in gate.stats().tenants}

    try:
        await one("caller")
        assert "caller" in known()

        async def gone() -> None:
            while "caller" in known():
                await one("other")  # arrivals (and the pump) run the sweep
                await asyncio.sleep(0.05)

        await asyncio.wait_for(gone(), 10.0)
    finally:
        await gate.aclose()
