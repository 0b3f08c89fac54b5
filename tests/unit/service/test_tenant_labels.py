"""Tenant metric labels stay bounded whatever ids callers send."""

from __future__ import annotations

from scheduler.tenancy.tenants import TenantConfig, TenantRegistry
from service.identity import Identity, current_identity
from service.telemetry.tenant_labels import OTHER, UNAUTHENTICATED, UNKNOWN, TenantLabels


def test_configured_tenants_keep_their_label_unknown_ones_share_one() -> None:
    registry = TenantRegistry([TenantConfig("a"), TenantConfig("b")], default_tenant_id="a")
    labels = TenantLabels()
    labels.watch(lambda: registry)
    assert labels.of("a") == "a"
    assert labels.of("") == "a"  # the default tenant
    assert {labels.of(f"x{i}") for i in range(1000)} == {UNKNOWN}


def test_open_mode_labels_are_capped() -> None:
    registry = TenantRegistry.permissive()
    labels = TenantLabels(max_open_labels=3)
    labels.watch(lambda: registry)
    seen = [labels.of(f"t{i}") for i in range(10)]
    assert seen[:3] == ["t0", "t1", "t2"]
    assert set(seen[3:]) == {OTHER}
    assert labels.of("t1") == "t1"  # a labelled tenant keeps its label


def test_caller_label_comes_from_authentication_only() -> None:
    registry = TenantRegistry([TenantConfig("a")])
    labels = TenantLabels()
    labels.watch(lambda: registry)
    assert labels.of_caller() == UNAUTHENTICATED
    token = current_identity.set(Identity("a", "api-key"))
    try:
        assert labels.of_caller() == "a"
    finally:
        current_identity.reset(token)


def test_registry_change_is_noticed() -> None:
    registries = [TenantRegistry([TenantConfig("a")])]
    labels = TenantLabels()
    labels.watch(lambda: registries[-1])
    assert labels.changed()
    assert not labels.changed()
    assert labels.of("b") == UNKNOWN
    registries.append(TenantRegistry([TenantConfig("a"), TenantConfig("b")]))
    assert labels.changed()
    assert labels.of("b") == "b"
