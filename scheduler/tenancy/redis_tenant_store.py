"""The Redis `TenantStore`: tenants and API-key hashes shared by every replica.

Key layout (prefix p, default "fg"; `{tenants}` is the Redis Cluster hash
tag, so all three keys share one slot and every script may touch them all):

    p:{tenants}:meta  HASH  rev (store revision), default (default tenant id),
                            issued (keys ever issued); absent = revision 0
    p:{tenants}:t     HASH  tenant id -> JSON {config, version, created_at_s, updated_at_s}
    p:{tenants}:k     HASH  key id -> JSON {tenant, hash, name, created_at_s, expires_at_s,
                            limits: {quotas, priorities?}}

Values are JSON written and read by Python only (Lua never decodes them, so
floats keep their exact repr). No secret is stored: `hash` is the key's HMAC.

How a write works (optimistic concurrency on the store revision):
1. READ (one Lua script, atomic): the whole snapshot at revision R.
2. The rules in `scheduler.tenancy.tenant_store` (`apply_writes`, `with_key`, ...)
   compute the next snapshot in Python, exactly as `InMemoryTenantStore`
   does; a refused write raises there and nothing is sent.
3. COMMIT (one Lua script, atomic): if the revision is still R, write the
   difference and set the revision to R + 1; otherwise nothing is written
   and the write is retried from 1 on the newer snapshot (where a stale
   etag then fails with VersionConflict, as it would in memory).
So each mutation is one atomic script and a batch is all-or-nothing.
COMMIT writes the new revision it is given: normally R + 1; `restore` uses it
to put back a replica's last snapshot when Redis lost the data (restarted
empty), at a revision above what every replica has seen. Why not
put the rules themselves in Lua: they would be a second copy of
`apply_writes` (version checks, the default-tenant invariant, keys deleted
with their tenant, rotation) that could drift from the in-memory store; admin
writes are rare, so the extra round trip costs nothing. Why not WATCH/MULTI:
the asyncio Cluster client has no WATCH; a script with a revision check is
the same compare-and-set and works on Cluster too.

Polling (`revision()`) is one HGET. Scripts run by EVALSHA with an EVAL
fallback on NOSCRIPT, as in redis_store.py. An unreachable Redis raises
`StoreUnavailable` (admin calls answer UNAVAILABLE; the replica keeps serving
the snapshot it last loaded).
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import random
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from redis.exceptions import NoScriptError

from scheduler.errors import StoreUnavailable
from scheduler.redis_io import UNAVAILABLE, Script, connect, text
from scheduler.request import Priority
from scheduler.tenancy.budgets import budget_of, budget_to_dict
from scheduler.tenancy.key_limits import KeyLimits
from scheduler.tenancy.tenant_store import (
    ApiKeyRecord,
    TenantRecord,
    TenantSnapshot,
    TenantWrite,
    VersionConflict,
    apply_writes,
    with_expiry,
    with_key,
    with_key_limits,
    with_rotation,
)
from scheduler.tenancy.tenants import TenantConfig, TenantQuotas

READ = r"""
local m = redis.call('HMGET', KEYS[1], 'rev', 'default', 'issued')
return {m[1] or '0', m[2] or '', m[3] or '0',
  redis.call('HGETALL', KEYS[2]), redis.call('HGETALL', KEYS[3])}
"""

COMMIT = r"""
-- KEYS: meta, tenants, keys. ARGV: expected revision, new revision,
-- default ('' = none), keys issued, then counted lists: tenants set (id, json),
-- tenants deleted, keys set (id, json), keys deleted.
local rev = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if rev ~= tonumber(ARGV[1]) then return {0, rev} end
local i = 5
local function nxt() local v = ARGV[i]; i = i + 1; return v end
for _, h in ipairs({KEYS[2], KEYS[3]}) do
  for _ = 1, tonumber(nxt()) do local id = nxt(); redis.call('HSET', h, id, nxt()) end
  for _ = 1, tonumber(nxt()) do redis.call('HDEL', h, nxt()) end
end
redis.call('HSET', KEYS[1], 'rev', ARGV[2], 'issued', ARGV[4])
if ARGV[3] == '' then redis.call('HDEL', KEYS[1], 'default')
else redis.call('HSET', KEYS[1], 'default', ARGV[3]) end
return {1, tonumber(ARGV[2])}
"""

_READ, _COMMIT = Script.of(READ), Script.of(COMMIT)
T = TypeVar("T")
V = TypeVar("V")
# Commits lost to concurrent writers before giving up (ABORTED: retry later).
MAX_ATTEMPTS = 32


# -- JSON codec -----------------------------------------------------------------
def _quotas_dict(q: TenantQuotas) -> dict[str, Any]:
    return {
        name: getattr(q, name)
        for name in TenantQuotas.__dataclass_fields__
        if getattr(q, name) is not None
    }


def config_to_dict(cfg: TenantConfig) -> dict[str, Any]:
    return {
        "id": cfg.tenant_id,
        "weight": cfg.weight,
        "priorities": sorted(p.name.lower() for p in cfg.priorities),
        "enabled": cfg.enabled,
        "over_quota": cfg.over_quota,
        "quotas": _quotas_dict(cfg.quotas),
        "budgets": [budget_to_dict(b) for b in cfg.budgets],
    }


def _limits_dict(k: KeyLimits) -> dict[str, Any]:
    out: dict[str, Any] = {"quotas": _quotas_dict(k.quotas)}
    if k.priorities is not None:
        out["priorities"] = sorted(p.name.lower() for p in k.priorities)
    if k.budgets:
        out["budgets"] = [budget_to_dict(b) for b in k.budgets]
    return out


def _limits_of(d: dict[str, Any] | None) -> KeyLimits:
    if not d:
        return KeyLimits()  # written before keys had limits
    names = d.get("priorities")
    return KeyLimits(
        quotas=TenantQuotas(**d["quotas"]),
        priorities=None if names is None else frozenset(Priority[p.upper()] for p in names),
        # Written before keys had budgets: none.
        budgets=tuple(budget_of(b) for b in d.get("budgets", ())),
    )


def config_from_dict(d: dict[str, Any]) -> TenantConfig:
    return TenantConfig(
        tenant_id=d["id"],
        weight=float(d["weight"]),
        priorities=frozenset(Priority[p.upper()] for p in d["priorities"]),
        enabled=bool(d["enabled"]),
        quotas=TenantQuotas(**d["quotas"]),
        over_quota=d["over_quota"],
        budgets=tuple(budget_of(b) for b in d.get("budgets", ())),
    )


def _tenant_json(r: TenantRecord) -> str:
    return json.dumps(
        {
            "config": config_to_dict(r.config),
            "version": r.version,
            "created_at_s": r.created_at_s,
            "updated_at_s": r.updated_at_s,
        },
        sort_keys=True,
    )


def _tenant_of(raw: str) -> TenantRecord:
    d = json.loads(raw)
    return TenantRecord(
        config=config_from_dict(d["config"]),
        version=int(d["version"]),
        created_at_s=float(d["created_at_s"]),
        updated_at_s=float(d["updated_at_s"]),
    )


def _key_json(k: ApiKeyRecord) -> str:
    return json.dumps(
        {
            "tenant": k.tenant_id,
            "hash": k.secret_hash,
            "name": k.display_name,
            "created_at_s": k.created_at_s,
            "expires_at_s": k.expires_at_s,
            "limits": _limits_dict(k.limits),
        },
        sort_keys=True,
    )


def _key_of(key_id: str, raw: str) -> ApiKeyRecord:
    d = json.loads(raw)
    exp = d["expires_at_s"]
    return ApiKeyRecord(
        key_id=key_id,
        tenant_id=d["tenant"],
        secret_hash=d["hash"],
        display_name=d["name"],
        created_at_s=float(d["created_at_s"]),
        expires_at_s=None if exp is None else float(exp),
        limits=_limits_of(d.get("limits")),
    )


def _diff(old: Mapping[str, V], new: Mapping[str, V], enc: Callable[[V], str]) -> list[str]:
    """Counted lists for COMMIT: entries set (id, json), then ids deleted."""
    put = [(k, v) for k, v in new.items() if old.get(k) != v]
    gone = [k for k in old if k not in new]
    out = [str(len(put))]
    for k, v in put:
        out += [k, enc(v)]
    return [*out, str(len(gone)), *gone]


def _pairs(flat: list[Any]) -> list[tuple[str, str]]:
    return [(text(flat[i]), text(flat[i + 1])) for i in range(0, len(flat), 2)]


class RedisTenantStore:
    """`TenantStore` on Redis; one instance per replica, all on the same keys."""

    def __init__(self, client: Any, *, prefix: str = "fg") -> None:
        if any(c in prefix for c in "{}"):
            raise ValueError("the Redis prefix may not contain braces")
        self._r = client
        base = f"{prefix}:{{tenants}}"
        self.keys = [f"{base}:meta", f"{base}:t", f"{base}:k"]
        self.noscript_reloads = 0
        self.commit_retries = 0

    @classmethod
    def from_url(cls, url: str, *, timeout_s: float = 1.0, prefix: str = "fg") -> RedisTenantStore:
        return cls(connect(url, timeout_s=timeout_s), prefix=prefix)

    async def _eval(self, script: Script, args: list[str]) -> Any:
        try:
            try:
                return await self._r.evalsha(script.sha, len(self.keys), *self.keys, *args)
            except NoScriptError:
                self.noscript_reloads += 1
                return await self._r.eval(script.source, len(self.keys), *self.keys, *args)
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc

    # -- reads ------------------------------------------------------------------
    async def snapshot(self) -> TenantSnapshot:
        rev, default, issued, tenants, keys = await self._eval(_READ, [])
        return TenantSnapshot(
            revision=int(text(rev)),
            tenants={tid: _tenant_of(raw) for tid, raw in _pairs(tenants)},
            keys={kid: _key_of(kid, raw) for kid, raw in _pairs(keys)},
            default_tenant_id=text(default) or None,
            keys_issued_total=int(text(issued)),
        )

    async def revision(self) -> int:
        try:
            raw = await self._r.hget(self.keys[0], "rev")
        except UNAVAILABLE as exc:
            raise StoreUnavailable(f"redis unreachable: {exc}") from exc
        return 0 if raw is None else int(text(raw))

    # -- writes -----------------------------------------------------------------
    async def _commit(self, old: TenantSnapshot, new: TenantSnapshot) -> bool:
        """Write `new` over `old` if the store is still at old's revision."""
        if new is old:
            return True  # nothing changed: no write, no revision bump
        args = [str(old.revision), str(new.revision), new.default_tenant_id or ""]
        args.append(str(new.keys_issued_total))
        args += _diff(old.tenants, new.tenants, _tenant_json)
        args += _diff(old.keys, new.keys, _key_json)
        ok, _rev = await self._eval(_COMMIT, args)
        return bool(int(ok))

    async def _update(
        self, change: Callable[[TenantSnapshot], tuple[TenantSnapshot, T]]
    ) -> tuple[TenantSnapshot, T]:
        """Read, apply `change(snapshot) -> (next snapshot, result)`, commit; retry on a race."""
        for attempt in range(MAX_ATTEMPTS):
            snap = await self.snapshot()
            new, result = change(snap)
            if await self._commit(snap, new):
                return new, result
            self.commit_retries += 1
            await asyncio.sleep(random.uniform(0, 0.002 * (attempt + 1)))
        raise VersionConflict(
            "the tenants kept changing while this change was applied; retry", current=-1
        )

    async def write_tenants(
        self,
        writes: Sequence[TenantWrite],
        *,
        now_s: float,
        expected_revision: int | None = None,
    ) -> TenantSnapshot:
        new, _ = await self._update(
            lambda s: (apply_writes(s, writes, now_s, expected_revision), None)
        )
        return new

    async def add_key(self, record: ApiKeyRecord) -> None:
        await self._update(lambda s: (with_key(s, record), None))

    async def expire_key(self, key_id: str, at_s: float) -> ApiKeyRecord:
        _, record = await self._update(lambda s: with_expiry(s, key_id, at_s))
        return record

    async def rotate_key(
        self, old_key_id: str, new: ApiKeyRecord, old_expires_at_s: float
    ) -> ApiKeyRecord:
        _, record = await self._update(
            lambda s: with_rotation(s, old_key_id, new, old_expires_at_s)
        )
        return record

    async def set_key_limits(self, key_id: str, limits: KeyLimits) -> ApiKeyRecord:
        _, record = await self._update(lambda s: with_key_limits(s, key_id, limits))
        return record

    async def restore(self, last: TenantSnapshot, found: TenantSnapshot) -> TenantSnapshot:
        """Write back `last` (a replica's last loaded snapshot) over a store that lost its
        data (`found`, at a lower revision), under a revision above both, so every
        replica reloads it. Conditional on `found.revision`: of several replicas that
        notice, one restores; the others get VersionConflict and re-read."""
        new = dataclasses.replace(last, revision=max(last.revision, found.revision) + 1)
        if not await self._commit(found, new):
            raise VersionConflict("the tenant store changed meanwhile", current=-1)
        return new

    async def aclose(self) -> None:
        await self._r.aclose()
