"""This replica's view of the tenant store, applied to its dispatchers.

`refresh()` reloads the store's snapshot when its revision moved, builds a
`TenantRegistry` and hands it to every dispatcher (`set_tenants`: live, no
restart). The admin servicer refreshes right after each write, so a change
takes effect at once on the replica that made it; `run()` polls the revision
every `interval_s` so other replicas sharing a store follow within it.

With no tenants in the store the registry is permissive (every tenant
allowed, the settings' default tenant): the zero-config quick start.

When the store cannot be read (Redis down), the replica keeps serving the
last snapshot it loaded (tenants, weights, quotas, keys) and polls on; admin
writes fail with UNAVAILABLE meanwhile. Once keys have been seen in use they
stay required (`auto` auth) even if the store later reports none. If the
store's revision goes backwards (a Redis that restarted without its data), the
first replica to notice writes its last snapshot back (`restore`), so the
fleet keeps its tenants and keys instead of falling back to an empty store.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Iterable
from typing import TYPE_CHECKING

from scheduler.errors import StoreUnavailable
from scheduler.tasks import raise_if_cancelling
from scheduler.tenancy.tenant_file import load_tenants
from scheduler.tenancy.tenant_store import (
    ApiKeyRecord,
    PutTenant,
    SetDefaultTenant,
    TenantSnapshot,
    TenantStore,
    TenantWrite,
    VersionConflict,
)
from scheduler.tenancy.tenants import TenantRegistry
from service.api_keys import KeyHasher, key_id_of

if TYPE_CHECKING:
    from scheduler.gate import AdmissionGate

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
        self._dispatchers: list[AdmissionGate] = []
        self._lock = asyncio.Lock()
        self._keys_seen = False

    def attach(self, dispatchers: Iterable[AdmissionGate]) -> None:
        added = list(dispatchers)
        self._dispatchers.extend(added)
        for d in added:
            d.set_tenants(self.registry)

    def weight_of(self, tenant_id: str) -> float:
        """Always the current registry's weight (for the fair policy)."""
        return self.registry.weight_of(tenant_id)

    async def seed_from_file(self, path: str) -> None:
        """Load a tenants file into a store never written to (the file seeds; the store
        then rules). Conditional on revision 0, so of replicas starting together on
        one shared store exactly one seeds it."""
        registry = load_tenants(path)
        snap = await self.store.snapshot()
        if snap.revision != 0 or snap.tenants:
            log.info("tenant store in use (revision %d); %s not loaded", snap.revision, path)
            return
        writes: list[TenantWrite] = [PutTenant(cfg) for cfg in registry]
        writes.append(SetDefaultTenant(registry.default_tenant_id))
        try:
            await self.store.write_tenants(
                writes, now_s=self.wall_clock(), expected_revision=snap.revision
            )
        except VersionConflict:
            log.info("tenant store seeded meanwhile by another replica; %s not loaded", path)
            return
        log.info("tenants file %s loaded: %d tenants", path, len(registry))

    async def refresh(self) -> None:
        async with self._lock:
            snap = await self.store.snapshot()
            if snap.revision == self.snapshot.revision:
                return
            if snap.revision < self.snapshot.revision:
                snap = await self._restore(snap)
            registry = registry_of(snap, self.fallback_default)
            self.snapshot, self.registry = snap, registry
            self._keys_seen = self._keys_seen or snap.keys_issued_total > 0
            for d in self._dispatchers:
                d.set_tenants(registry)

    async def _restore(self, found: TenantSnapshot) -> TenantSnapshot:
        """The store went back in time (Redis restarted empty): put our snapshot back."""
        restore = getattr(self.store, "restore", None)
        if restore is None:
            return found
        log.error(
            "tenant store lost its data (revision %d, had %d): writing this replica's last "
            "snapshot back",
            found.revision,
            self.snapshot.revision,
        )
        try:
            restored: TenantSnapshot = await restore(self.snapshot, found)
        except VersionConflict:
            return await self.store.snapshot()  # another replica restored it
        return restored

    async def run(self, interval_s: float) -> None:
        while True:
            await asyncio.sleep(interval_s)
            try:
                if await self.store.revision() != self.snapshot.revision:
                    await self.refresh()
            except (StoreUnavailable, OSError, ConnectionError, ValueError) as exc:
                raise_if_cancelling(exc)
                log.warning("tenant store refresh failed, keeping the last config: %s", exc)

    # -- API keys -------------------------------------------------------------
    @property
    def keys_in_use(self) -> bool:
        """Keys were issued at some point (revoking them all does not reopen the door)."""
        return self._keys_seen

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
