"""Where tenant config and API-key hashes live: a small async protocol.

`InMemoryTenantStore` serves a single replica and the tests. A Redis store
(shared by replicas) implements the same protocol: every write is one atomic
step (a Lua script or MULTI under WATCH), `revision` is one counter that every
write bumps, so each replica notices a change by polling it (or by pub/sub)
and reloads the snapshot.

Optimistic concurrency: each tenant has a `version` (1 when created, +1 per
change). A write may name the version it expects; if the tenant changed since,
the write fails with VersionConflict and nothing in the batch is applied.
The store keeps only hashes of API keys, never their secrets.

The rules live once, in the pure functions below (`apply_writes`,
`with_key`, `with_expiry`, `with_rotation`, `with_key_limits`); both stores
apply them.
"""

from __future__ import annotations

import asyncio
import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Protocol

from scheduler.tenancy.key_limits import NO_KEY_LIMITS, KeyLimits
from scheduler.tenancy.tenants import TenantConfig

# expected_version for "must not exist yet" (versions start at 1).
MUST_NOT_EXIST = 0


class StoreError(Exception):
    """A store write was refused; nothing in its batch was applied."""

    reason = "STORE_ERROR"

    def __init__(self, message: str, *, tenant_id: str = "", key_id: str = "") -> None:
        super().__init__(message)
        self.tenant_id = tenant_id
        self.key_id = key_id

    def metadata(self) -> dict[str, str]:
        out = {}
        if self.tenant_id:
            out["tenant"] = self.tenant_id
        if self.key_id:
            out["key_id"] = self.key_id
        return out


class NotFound(StoreError):
    reason = "NOT_FOUND"

    @classmethod
    def tenant(cls, tenant_id: str) -> NotFound:
        return cls(f"no tenant {tenant_id!r}", tenant_id=tenant_id)

    @classmethod
    def key(cls, key_id: str) -> NotFound:
        return cls(f"no API key {key_id!r}", key_id=key_id)


class AlreadyExists(StoreError):
    reason = "ALREADY_EXISTS"


class VersionConflict(StoreError):
    """The tenant (or the store, for `expected_revision`) changed since it was read."""

    reason = "ETAG_MISMATCH"

    def __init__(self, message: str, *, tenant_id: str = "", current: int = 0) -> None:
        super().__init__(message, tenant_id=tenant_id)
        self.current = current

    def metadata(self) -> dict[str, str]:
        return {**super().metadata(), "current_etag": str(self.current)}


class StoreConstraint(StoreError):
    """The write would break an invariant (e.g. delete the default tenant)."""

    reason = "FAILED_PRECONDITION"


@dataclass(frozen=True, slots=True)
class TenantRecord:
    config: TenantConfig
    version: int
    created_at_s: float
    updated_at_s: float


@dataclass(frozen=True, slots=True)
class ApiKeyRecord:
    key_id: str
    tenant_id: str
    # "<scheme>:<hex digest>" of the whole secret; never the secret itself.
    secret_hash: str
    display_name: str
    created_at_s: float
    # Wall-clock time the key stops working (revoked, or rotated with grace).
    expires_at_s: float | None = None
    # Its own limits within its tenant's (scheduler/tenancy/key_limits.py).
    limits: KeyLimits = NO_KEY_LIMITS

    def active(self, now_s: float) -> bool:
        return self.expires_at_s is None or now_s < self.expires_at_s


@dataclass(frozen=True, slots=True)
class TenantSnapshot:
    """A consistent view of the whole store at one revision."""

    revision: int = 0
    tenants: Mapping[str, TenantRecord] = field(default_factory=dict)
    keys: Mapping[str, ApiKeyRecord] = field(default_factory=dict)
    default_tenant_id: str | None = None
    # Keys ever issued (never decreases): once > 0, `auto` auth requires keys.
    keys_issued_total: int = 0

    def tenant(self, tenant_id: str) -> TenantRecord:
        """The tenant's record, or NotFound."""
        record = self.tenants.get(tenant_id)
        if record is None:
            raise NotFound.tenant(tenant_id)
        return record

    def key(self, key_id: str) -> ApiKeyRecord:
        """The key's record, or NotFound."""
        record = self.keys.get(key_id)
        if record is None:
            raise NotFound.key(key_id)
        return record


@dataclass(frozen=True, slots=True)
class PutTenant:
    """Create or replace. expected_version: None = any, MUST_NOT_EXIST, or a version."""

    config: TenantConfig
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class DeleteTenant:
    tenant_id: str
    expected_version: int | None = None


@dataclass(frozen=True, slots=True)
class SetDefaultTenant:
    tenant_id: str | None


TenantWrite = PutTenant | DeleteTenant | SetDefaultTenant


class TenantStore(Protocol):
    async def snapshot(self) -> TenantSnapshot:
        """Everything, consistently, at the current revision."""
        ...

    async def revision(self) -> int:
        """Bumped by every write; cheap to poll."""
        ...

    async def write_tenants(
        self,
        writes: Sequence[TenantWrite],
        *,
        now_s: float,
        expected_revision: int | None = None,
    ) -> TenantSnapshot:
        """Apply all writes atomically (or none, raising a StoreError)."""
        ...

    async def add_key(self, record: ApiKeyRecord) -> None:
        """Store a new key hash; its tenant must exist."""
        ...

    async def expire_key(self, key_id: str, at_s: float) -> ApiKeyRecord:
        """Make a key stop working at `at_s` (now: revoke); never extends it."""
        ...

    async def rotate_key(
        self, old_key_id: str, new: ApiKeyRecord, old_expires_at_s: float
    ) -> ApiKeyRecord:
        """Add `new` and expire the old key, atomically; returns the old key's record."""
        ...

    async def set_key_limits(self, key_id: str, limits: KeyLimits) -> ApiKeyRecord:
        """Replace a key's own limits (judged by the caller against its tenant)."""
        ...


class InMemoryTenantStore:
    """The single-replica store: a snapshot replaced on every write."""

    def __init__(self) -> None:
        self._snap = TenantSnapshot()
        self._lock = asyncio.Lock()

    async def snapshot(self) -> TenantSnapshot:
        return self._snap

    async def revision(self) -> int:
        return self._snap.revision

    async def write_tenants(
        self,
        writes: Sequence[TenantWrite],
        *,
        now_s: float,
        expected_revision: int | None = None,
    ) -> TenantSnapshot:
        async with self._lock:
            self._snap = apply_writes(self._snap, writes, now_s, expected_revision)
            return self._snap

    async def add_key(self, record: ApiKeyRecord) -> None:
        async with self._lock:
            self._snap = with_key(self._snap, record)

    async def expire_key(self, key_id: str, at_s: float) -> ApiKeyRecord:
        async with self._lock:
            self._snap, record = with_expiry(self._snap, key_id, at_s)
            return record

    async def rotate_key(
        self, old_key_id: str, new: ApiKeyRecord, old_expires_at_s: float
    ) -> ApiKeyRecord:
        async with self._lock:
            self._snap, record = with_rotation(self._snap, old_key_id, new, old_expires_at_s)
            return record

    async def set_key_limits(self, key_id: str, limits: KeyLimits) -> ApiKeyRecord:
        async with self._lock:
            self._snap, record = with_key_limits(self._snap, key_id, limits)
            return record


# -- the rules, as pure functions: snapshot in, next snapshot out --------------
# Every store applies them (the Redis store on the snapshot it read, then
# commits the result only if the revision has not moved), so the semantics
# cannot drift between implementations. A write that changes nothing returns
# the same snapshot object (no revision bump).


def apply_writes(
    snap: TenantSnapshot,
    writes: Sequence[TenantWrite],
    now_s: float,
    expected_revision: int | None = None,
) -> TenantSnapshot:
    """All of `writes` applied to `snap` (revision + 1), or a StoreError."""
    if expected_revision is not None and snap.revision != expected_revision:
        raise VersionConflict(
            "the tenants changed while this change was prepared; read them again",
            current=snap.revision,
        )
    tenants = dict(snap.tenants)
    keys = dict(snap.keys)
    default = snap.default_tenant_id
    for w in writes:
        if isinstance(w, PutTenant):
            tid = w.config.tenant_id
            _check_version(tid, tenants.get(tid), w.expected_version)
            old = tenants.get(tid)
            tenants[tid] = TenantRecord(
                config=w.config,
                version=old.version + 1 if old else 1,
                created_at_s=old.created_at_s if old else now_s,
                updated_at_s=now_s,
            )
        elif isinstance(w, DeleteTenant):
            old = tenants.get(w.tenant_id)
            if old is None:
                raise NotFound.tenant(w.tenant_id)
            _check_version(w.tenant_id, old, w.expected_version)
            del tenants[w.tenant_id]
            keys = {k: r for k, r in keys.items() if r.tenant_id != w.tenant_id}
        else:
            default = w.tenant_id
    if default is not None and default not in tenants:
        raise StoreConstraint(
            f"the default tenant {default!r} would not exist; "
            "set another default tenant first (or none)",
            tenant_id=default,
        )
    return dataclasses.replace(
        snap,
        revision=snap.revision + 1,
        tenants=tenants,
        keys=keys,
        default_tenant_id=default,
    )


def with_key(snap: TenantSnapshot, record: ApiKeyRecord) -> TenantSnapshot:
    snap.tenant(record.tenant_id)  # it must exist
    if record.key_id in snap.keys:
        raise AlreadyExists(f"key {record.key_id!r} exists", key_id=record.key_id)
    return dataclasses.replace(
        snap,
        revision=snap.revision + 1,
        keys={**snap.keys, record.key_id: record},
        keys_issued_total=snap.keys_issued_total + 1,
    )


def _key_changed(
    snap: TenantSnapshot, key_id: str, change: Callable[[ApiKeyRecord], ApiKeyRecord]
) -> tuple[TenantSnapshot, ApiKeyRecord]:
    """`snap` with key `key_id`'s record changed (the same snapshot if it is not)."""
    old = snap.key(key_id)
    new = change(old)
    if new == old:
        return snap, old
    return (
        dataclasses.replace(snap, revision=snap.revision + 1, keys={**snap.keys, key_id: new}),
        new,
    )


def with_expiry(
    snap: TenantSnapshot, key_id: str, at_s: float
) -> tuple[TenantSnapshot, ApiKeyRecord]:
    def expire(old: ApiKeyRecord) -> ApiKeyRecord:
        if old.expires_at_s is not None and old.expires_at_s <= at_s:
            return old  # never extended
        return dataclasses.replace(old, expires_at_s=at_s)

    return _key_changed(snap, key_id, expire)


def with_key_limits(
    snap: TenantSnapshot, key_id: str, limits: KeyLimits
) -> tuple[TenantSnapshot, ApiKeyRecord]:
    return _key_changed(snap, key_id, lambda old: dataclasses.replace(old, limits=limits))


def with_rotation(
    snap: TenantSnapshot, old_key_id: str, new: ApiKeyRecord, old_expires_at_s: float
) -> tuple[TenantSnapshot, ApiKeyRecord]:
    """`new` added and the old key expired, as one revision; returns the old key's record."""
    snap.key(old_key_id)  # it must exist
    added = with_key(snap, new)
    after, old = with_expiry(added, old_key_id, old_expires_at_s)
    return dataclasses.replace(after, revision=snap.revision + 1), old


def _check_version(tenant_id: str, old: TenantRecord | None, expected: int | None) -> None:
    if expected is None:
        return
    if expected == MUST_NOT_EXIST:
        if old is not None:
            raise AlreadyExists(f"tenant {tenant_id!r} already exists", tenant_id=tenant_id)
        return
    if old is None:
        raise NotFound.tenant(tenant_id)
    if old.version != expected:
        raise VersionConflict(
            f"tenant {tenant_id!r} changed since it was read (etag {expected} is stale; "
            f"current {old.version}); read it again and retry",
            tenant_id=tenant_id,
            current=old.version,
        )
