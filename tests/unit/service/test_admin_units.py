"""API-key format and hashing, admin proto validation, masks, live weights, settings."""

from __future__ import annotations

import dataclasses

import pytest
from fairgate.v1 import admin_pb2 as apb

from scheduler.clock import FakeClock
from scheduler.ordering.policies import PolicyOptions, make_policy
from scheduler.request import Priority, QueuedRequest
from scheduler.tenancy.tenant_store import InMemoryTenantStore, PutTenant, SetDefaultTenant
from scheduler.tenancy.tenants import INTEGER_QUOTAS, QUOTA_RANGES, TenantConfig, TenantQuotas
from service.admin_convert import apply_mask, config_to_proto, diff, tenant_from_proto
from service.api_keys import KeyHasher, generate_key, key_id_of, tokens_equal
from service.errors import InvalidRequest
from service.settings import Settings
from service.tenant_directory import TenantDirectory


def test_key_format_and_hash() -> None:
    key = generate_key()
    assert key.secret.startswith(f"fg_{key.key_id}_") and len(key.key_id) == 16
    assert key_id_of(key.secret) == key.key_id
    assert key_id_of("fg_short_x") is None and key_id_of("sk-" + key.secret) is None
    hasher = KeyHasher(b"p" * 32)
    stored = hasher.hash(key.secret)
    assert stored.startswith("hmac-sha256:") and key.secret not in stored
    assert hasher.verify(key.secret, stored)
    assert not hasher.verify(key.secret + "x", stored)
    # Another pepper (another deployment) cannot verify it.
    assert not KeyHasher(b"q" * 32).verify(key.secret, stored)
    with pytest.raises(ValueError):
        KeyHasher(b"short")
    assert tokens_equal("a", "a") and not tokens_equal("a", "ab")


def test_validation_reports_every_problem_with_its_field() -> None:
    bad = apb.Tenant(id="ok", weight=-1)
    bad.quotas.requests_per_s = 0
    bad.quotas.max_concurrent = -3
    with pytest.raises(InvalidRequest) as err:
        tenant_from_proto(bad)
    fields = [v.field for v in err.value.violations]
    assert fields == [
        "tenant.weight",
        "tenant.quotas.requests_per_s",
        "tenant.quotas.max_concurrent",
    ]
    assert all("finite number in" in v.description for v in err.value.violations)
    cfg = tenant_from_proto(apb.Tenant(id="defaults"))
    assert cfg == TenantConfig("defaults")  # weight 1, enabled, all classes, reject


def test_update_mask_merges_and_clears() -> None:
    current = config_to_proto(TenantConfig("t", weight=2))
    current.quotas.requests_per_s = 5
    current.quotas.max_queued = 10
    patch = apb.Tenant(id="t", weight=3)
    patch.quotas.tokens_per_min = 600
    merged = apply_mask(current, patch, ["weight", "quotas.tokens_per_min", "quotas.max_queued"])
    cfg = tenant_from_proto(merged)
    assert cfg.weight == 3
    assert (cfg.quotas.requests_per_s, cfg.quotas.tokens_per_min) == (5, 600)
    assert cfg.quotas.max_queued is None
    with pytest.raises(InvalidRequest, match="unknown path"):
        apply_mask(current, patch, ["wieght"])
    changes = {c.field: (c.before, c.after) for c in diff(TenantConfig("t"), cfg)}
    assert changes["weight"] == ("1", "3") and changes["quotas.requests_per_s"] == ("", "5")


async def test_weights_follow_the_store_live() -> None:
    store = InMemoryTenantStore()
    directory = TenantDirectory(store, KeyHasher(b"p" * 32), fallback_default="default")
    await directory.refresh()
    assert directory.registry.get("anyone") is not None  # empty store: permissive
    policy = make_policy("vtc", PolicyOptions(clock=FakeClock(), weight_of=directory.weight_of))
    await store.write_tenants(
        [PutTenant(TenantConfig("a", weight=1)), SetDefaultTenant("a")], now_s=0.0
    )
    await directory.refresh()
    assert directory.registry.get("anyone") is None  # tenants defined: strict

    def charge(n: int) -> float:
        req = QueuedRequest(
            request_id=str(n),
            tenant_id="a",
            prompt_tokens=100,
            max_tokens=1,
            priority=Priority.INTERACTIVE,
        )
        policy.push(req)
        assert policy.pop_next() is req
        return policy.counter("a")  # type: ignore[attr-defined, no-any-return]

    first = charge(1)
    await store.write_tenants([PutTenant(TenantConfig("a", weight=4))], now_s=1.0)
    await directory.refresh()
    assert charge(2) - first == pytest.approx(first / 4)


def test_settings_for_auth_and_tls() -> None:
    with pytest.raises(ValueError, match="auth_mode"):
        Settings(auth_mode="none")
    with pytest.raises(ValueError, match="go together"):
        Settings(tls_cert_file="c.pem")
    with pytest.raises(ValueError, match="mutual TLS"):
        Settings(tls_client_ca_file="ca.pem")
    s = Settings.from_env({"FAIRGATE_ADMIN_TOKEN": "secret-token", "FAIRGATE_AUTH_MODE": "api-key"})
    assert s.admin_token == "secret-token" and "secret-token" not in repr(s)


def test_the_quota_names_kinds_and_ranges_are_declared_once() -> None:
    """The tenant validator's quotas (scheduler/tenancy) are the admin API's."""
    fields = dataclasses.fields(TenantQuotas)
    assert list(QUOTA_RANGES) == [f.name for f in fields]
    # The admin API carries exactly these, integers as int64.
    proto = apb.TenantQuotas.DESCRIPTOR.fields_by_name
    assert set(proto) == set(QUOTA_RANGES)
    ints = {n for n, f in proto.items() if f.type == f.TYPE_INT64}
    assert ints == INTEGER_QUOTAS
    assert all(isinstance(QUOTA_RANGES[n][0], int) for n in INTEGER_QUOTAS)
