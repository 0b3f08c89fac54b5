"""FAIRGATE_IDLE_TENANT_TTL_S reaches both dispatchers `build_dispatcher` makes;
FAIRGATE_FAIR_ALLOWANCE_TOKENS the shared one."""

from __future__ import annotations

import pytest

from scheduler.budget import AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.dispatcher import Dispatcher
from scheduler.request import QueuedRequest
from scheduler.shared.admission import SharedAdmission
from scheduler.tenancy.tenants import TenantConfig, TenantRegistry
from service.admission_setup import policy_options
from service.settings import Settings
from service.shared_state import build_dispatcher


@pytest.mark.parametrize("store", ["memory", "redis"])
async def test_an_idle_unconfigured_tenant_is_forgotten_after_the_configured_ttl(
    store: str, request: pytest.FixtureRequest
) -> None:
    env = {"FAIRGATE_IDLE_TENANT_TTL_S": "1"}  # not the default, 600 s
    if store == "redis":
        env |= {
            "FAIRGATE_STORE": "redis",
            "FAIRGATE_REDIS_URL": request.getfixturevalue("redis_url"),
        }
    settings = Settings.from_env(env)
    clock = FakeClock(100.0)  # the dispatchers sweep on it; the test moves it
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
        clock.advance(0.9)  # idle, but not for the TTL yet
        await one("other")  # arrivals run the sweep
        assert "caller" in known()
        clock.advance(0.35)  # 1.25 s idle, past a sweep (every TTL / 4)
        await one("other")
        assert "caller" not in known() and "other" in known()
    finally:
        await gate.aclose()


async def test_the_fleet_allowance_setting_reaches_the_shared_dispatcher(redis_url: str) -> None:
    env = {
        "FAIRGATE_FAIR_ALLOWANCE_TOKENS": "123",
        "FAIRGATE_STORE": "redis",
        "FAIRGATE_REDIS_URL": redis_url,
    }
    settings = Settings.from_env(env)
    clock = FakeClock(100.0)
    reg = TenantRegistry([], template=TenantConfig("x"))
    gate = await build_dispatcher(
        settings, policy_options(settings, clock, reg), AdmissionLimits(4, 10_000), clock, reg, "m"
    )
    try:
        assert isinstance(gate, Dispatcher) and isinstance(gate.state, SharedAdmission)
        assert gate.state.options.step(AdmissionLimits(4, 10_000)).allowance == 123.0
    finally:
        await gate.aclose()
