"""This replica's view of the tenant store, applied to its dispatchers.

`refresh()` reloads the store's snapshot when its revision moved, builds a
`TenantRegistry` and hands it to every dispatcher (`set_tenants`: live, no
restart). The admin servicer refreshes right after each write, so a change
takes effect at once on the replica that made it; `run()` polls the revision
every `interval_s` so other replicas sharing a store follow within it.

With no tenants in the store the registry is permissive (every tenant
allowed, the settings' default tenant): the zero-config quick start.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from scheduler.tenant_file import load_tenants
from scheduler.tenant_store import (
    ApiKeyRecord,
    PutTenant,
    SetDefaultTenant,
    TenantSnapshot,
    TenantStore,
    TenantWrite,
)
from scheduler.tenants import TenantRegistry
from service.api_keys import KeyHasher, key_id_of

if TYPE_CHECKING:
    from service.shared_state import AnyDispatcher

log = logging.getLogger(__name__)


def registry_of(snap: TenantSnapshot, fallback_default: str | None) -> TenantRegistry:
    if not snap.tenants:
        return TenantRegistry.permissive(fallback_default or None)
    return TenantRegistry(
        (r.config for r in snap.tenants.values()), default_tenant_id=snap.default_tenant_id
    )


class TenantDirectory:
    def __init__(
        self,
        store: TenantStore,
        hasher: KeyHasher,
        *,
        fallback_default: str | None,
        wall_clock: Callable[[], float] = time.time,
    ) -> None:
        self.store = store
        self.hasher = hasher
        self.fallback_default = fallback_default
        self.wall_clock = wall_clock
        self.snapshot = TenantSnapshot(revision=-1)
        self.registry = TenantRegistry.permissive(fallback_default or None)
        self._dispatchers: list[AnyDispatcher] = []
        self._lock = asyncio.Lock()

    def attach(self, dispatchers: Iterable[AnyDispatcher]) -> None:
        added = list(dispatchers)
        self._dispatchers.extend(added)
        for d in added:
            d.set_tenants(self.registry)

    def weight_of(self, tenant_id: str) -> float:
        """Always the current registry's weight (for the fair policy)."""
        return self.registry.weight_of(tenant_id)

    async def seed_from_file(self, path: str) -> None:
        """Load a tenants file into an empty store (the file seeds; the store then rules)."""
        registry = load_tenants(path)
        if (await self.store.snapshot()).tenants:
            log.info("tenant store already holds tenants; %s not loaded", path)
            return
        writes: list[TenantWrite] = [PutTenant(cfg) for cfg in registry]
        writes.append(SetDefaultTenant(registry.default_tenant_id))
        await self.store.write_tenants(writes, now_s=self.wall_clock())

    async def refresh(self) -> None:
        async with self._lock:
            snap = await self.store.snapshot()
            if snap.revision == self.snapshot.revision:
                return
            registry = registry_of(snap, self.fallback_default)
            self.snapshot, self.registry = snap, registry
            for d in self._dispatchers:
                d.set_tenants(registry)

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                if await self.store.revision() != self.snapshot.revision:
                    await self.refresh()
            except (OSError, ConnectionError, ValueError) as exc:
                log.warning("tenant store refresh failed, keeping the last config: %s", exc)

    # -- API keys -------------------------------------------------------------
    @property
    def keys_in_use(self) -> bool:
        """Keys were issued at some point (revoking them all does not reopen the door)."""
        return self.snapshot.keys_issued_total > 0

    def verify_key(self, secret: str) -> ApiKeyRecord | None:
        """The key's record if `secret` is a valid, active key; else None."""
        key_id = key_id_of(secret)
        record = self.snapshot.keys.get(key_id) if key_id else None
        if record is None:
            # Same work as a hit, so timing does not tell whether the id exists.
            self.hasher.verify(secret, "hmac-sha256:" + "0" * 64)
            return None
        if not self.hasher.verify(secret, record.secret_hash):
            return None
        return record if record.active(self.wall_clock()) else None
