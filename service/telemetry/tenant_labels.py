"""Tenant ids as metric label values: bounded, whatever callers send.

A label value is a time series per metric, kept for the life of the
process, so no unauthenticated input may choose one:

- a call refused before authentication: `_unauthenticated`;
- a tenant the registry does not know (configured tenants only): `_unknown`;
- open mode (no tenants configured: every id is served): the first
  `max_open_labels` ids seen keep their own label, later ones share `_other`.

Configured tenants always keep their own label (an operator created them).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from service.identity import current_identity

if TYPE_CHECKING:
    from scheduler.tenancy.tenants import TenantRegistry

UNAUTHENTICATED = "_unauthenticated"
UNKNOWN = "_unknown"
OTHER = "_other"
DEFAULT_MAX_OPEN_LABELS = 256


class TenantLabels:
    def __init__(self, max_open_labels: int = DEFAULT_MAX_OPEN_LABELS) -> None:
        self.max_open_labels = max_open_labels
        self._registry: Callable[[], TenantRegistry] | None = None
        self._open: set[str] = set()
        self._seen: object = None

    def changed(self) -> bool:
        """Whether the registry changed since the last call (labels may differ)."""
        now = self._registry() if self._registry is not None else None
        if now is self._seen:
            return False
        self._seen = now
        return True

    def watch(self, registry: Callable[[], TenantRegistry]) -> None:
        """Judge ids against `registry()` (the live one: tenants change at run time)."""
        self._registry = registry

    def of(self, tenant_id: str) -> str:
        """The label of a tenant id the server accepted or resolved."""
        registry = self._registry() if self._registry is not None else None
        if registry is None:
            return self._open_label(tenant_id) if tenant_id else UNKNOWN
        if not tenant_id:
            tenant_id = registry.default_tenant_id or ""
        if tenant_id in registry:
            return tenant_id
        if registry.template is not None and tenant_id:
            return self._open_label(tenant_id)
        return UNKNOWN

    def of_caller(self) -> str:
        """The label of the current call's caller, as authentication left it."""
        identity = current_identity.get()
        if identity is None:
            return UNAUTHENTICATED
        return self.of(identity.tenant_id)

    def _open_label(self, tenant_id: str) -> str:
        if tenant_id in self._open:
            return tenant_id
        if len(self._open) < self.max_open_labels:
            self._open.add(tenant_id)
            return tenant_id
        return OTHER
