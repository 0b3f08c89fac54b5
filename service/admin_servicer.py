"""AdminService: tenants, API keys and live usage.

Writes go to the tenant store (atomic, optimistic concurrency on each
tenant's version = etag), then `TenantDirectory.refresh()` applies them to
this replica's dispatchers at once (other replicas follow by polling). With
the store unreachable (Redis down) every call answers UNAVAILABLE with a
retry delay. Authentication happens in service/auth.py.
"""

from __future__ import annotations

import functools
import logging
import math
import re
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import grpc
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import admin_pb2_grpc as apb_grpc

from scheduler.errors import StoreUnavailable
from scheduler.tenancy.key_limits import KeyLimits
from scheduler.tenancy.tenant_store import (
    MUST_NOT_EXIST,
    ApiKeyRecord,
    DeleteTenant,
    NotFound,
    PutTenant,
    SetDefaultTenant,
    StoreConstraint,
    StoreError,
    TenantSnapshot,
    TenantWrite,
)
from service import errors
from service.admin_apply import plan_apply
from service.admin_convert import (
    MAX_DISPLAY_NAME_CHARS,
    apply_mask,
    config_to_proto,
    key_to_proto,
    parse_etag,
    record_to_proto,
    require_tenant_id,
    tenant_from_proto,
    usage_record,
    usage_to_proto,
)
from service.admin_key_limits import judged, limits_from_proto, masked
from service.api_keys import generate_key
from service.errors import FieldViolation, InvalidRequest
from service.models import ModelRegistry
from service.period_report import period_usage_response
from service.tenant_directory import TenantDirectory
from service.usage_log import MAX_EXPORT, MemoryUsageLog, UsageLog

Req = TypeVar("Req")
Resp = TypeVar("Resp")
Ctx = grpc.aio.ServicerContext[Any, Any]
MAX_GRACE_PERIOD_S = 7 * 24 * 3600.0
_UPDATE_RETRIES = 3
# A usage-log cursor: a sequence number (memory) or a Redis stream id.
_CURSOR = re.compile(r"\d{1,20}(-\d{1,20})?")
log = logging.getLogger(__name__)


def _mapped(
    rpc: Callable[[AdminServicer, Req], Awaitable[Resp]],
) -> Callable[[AdminServicer, Req, Ctx], Awaitable[Resp]]:
    """The RPC `rpc(self, request)` as grpc calls it, with its context: a store or
    service error becomes the call's status (errors.abort)."""

    @functools.wraps(rpc)
    async def handler(self: AdminServicer, request: Req, context: Ctx) -> Resp:
        try:
            return await rpc(self, request)
        except (errors.ServiceError, StoreError, StoreUnavailable) as exc:
            await errors.abort(context, exc)

    return handler


class AdminServicer(apb_grpc.AdminServiceServicer):
    def __init__(
        self,
        directory: TenantDirectory,
        models: ModelRegistry,
        policy: str,
        usage: UsageLog | None = None,
    ) -> None:
        self.directory = directory
        self.store = directory.store
        self.models = models
        self.policy = policy
        self.usage: UsageLog = usage or MemoryUsageLog()

    def _now(self) -> float:
        return self.directory.wall_clock()

    async def _write(self, writes: list[TenantWrite], **kwargs: Any) -> TenantSnapshot:
        snap = await self.store.write_tenants(writes, now_s=self._now(), **kwargs)
        await self._refresh()
        return snap

    async def _refresh(self) -> None:
        """Apply a write here at once; if the store just went away, polling catches up."""
        try:
            await self.directory.refresh()
        except StoreUnavailable as exc:
            log.warning("written, but not re-read at once (polling will): %s", exc)

    def _tenant_proto(self, snap: TenantSnapshot, tenant_id: str) -> apb.Tenant:
        now = self._now()
        active = sum(1 for k in snap.keys.values() if k.tenant_id == tenant_id and k.active(now))
        return record_to_proto(snap.tenants[tenant_id], active)

    # -- tenants --------------------------------------------------------------
    @_mapped
    async def CreateTenant(self, request: apb.CreateTenantRequest) -> apb.CreateTenantResponse:
        cfg = tenant_from_proto(request.tenant)
        snap = await self._write([PutTenant(cfg, MUST_NOT_EXIST)])
        return apb.CreateTenantResponse(tenant=self._tenant_proto(snap, cfg.tenant_id))

    @_mapped
    async def GetTenant(self, request: apb.GetTenantRequest) -> apb.GetTenantResponse:
        tid = require_tenant_id(request.tenant_id)
        snap = await self.store.snapshot()
        snap.tenant(tid)
        return apb.GetTenantResponse(tenant=self._tenant_proto(snap, tid))

    @_mapped
    async def ListTenants(self, request: apb.ListTenantsRequest) -> apb.ListTenantsResponse:
        snap = await self.store.snapshot()
        return apb.ListTenantsResponse(
            tenants=[self._tenant_proto(snap, tid) for tid in sorted(snap.tenants)],
            default_tenant_id=snap.default_tenant_id or "",
        )

    @_mapped
    async def UpdateTenant(self, request: apb.UpdateTenantRequest) -> apb.UpdateTenantResponse:
        tid = require_tenant_id(request.tenant.id, "tenant.id")
        etag = parse_etag(request.tenant.etag, "tenant.etag")
        paths = list(request.update_mask.paths)
        for attempt in range(_UPDATE_RETRIES):
            snap = await self.store.snapshot()
            current = snap.tenant(tid)
            merged = (
                apply_mask(config_to_proto(current.config), request.tenant, paths)
                if paths
                else request.tenant
            )
            cfg = tenant_from_proto(merged)
            # Without an etag the merge is retried on a concurrent change;
            # with one, a concurrent change is the caller's conflict.
            expected = etag if etag is not None else current.version
            try:
                snap = await self._write([PutTenant(cfg, expected)])
            except StoreError:
                if etag is not None or attempt == _UPDATE_RETRIES - 1:
                    raise
                continue
            return apb.UpdateTenantResponse(tenant=self._tenant_proto(snap, tid))
        raise AssertionError("unreachable")  # pragma: no cover

    @_mapped
    async def DeleteTenant(self, request: apb.DeleteTenantRequest) -> apb.DeleteTenantResponse:
        tid = require_tenant_id(request.tenant_id)
        await self._write([DeleteTenant(tid, parse_etag(request.etag, "etag"))])
        return apb.DeleteTenantResponse()

    @_mapped
    async def SetDefaultTenant(
        self, request: apb.SetDefaultTenantRequest
    ) -> apb.SetDefaultTenantResponse:
        tid = request.tenant_id or None
        if tid is not None:
            require_tenant_id(tid)
            (await self.store.snapshot()).tenant(tid)
        await self._write([SetDefaultTenant(tid)])
        return apb.SetDefaultTenantResponse()

    @_mapped
    async def ApplyTenants(self, request: apb.ApplyTenantsRequest) -> apb.ApplyTenantsResponse:
        snap = await self.store.snapshot()
        resp, writes = plan_apply(request, snap)
        if writes and not request.dry_run:
            await self._write(writes, expected_revision=snap.revision)
            resp.applied = True
        return resp

    # -- API keys -------------------------------------------------------------
    @_mapped
    async def IssueApiKey(self, request: apb.IssueApiKeyRequest) -> apb.IssueApiKeyResponse:
        tid = require_tenant_id(request.tenant_id)
        tenant = (await self.store.snapshot()).tenant(tid)
        limits, problems = limits_from_proto(request.limits)
        problems += judged(limits, tenant.config)
        problems += _display_name_problems(request.display_name)
        if problems:
            raise InvalidRequest(problems)
        record, secret = self._new_key(tid, request.display_name, limits)
        await self.store.add_key(record)
        await self._refresh()
        return apb.IssueApiKeyResponse(key=key_to_proto(record, self._now()), secret=secret)

    def _new_key(
        self, tenant_id: str, display_name: str, limits: KeyLimits
    ) -> tuple[ApiKeyRecord, str]:
        new = generate_key()
        record = ApiKeyRecord(
            key_id=new.key_id,
            tenant_id=tenant_id,
            secret_hash=self.directory.hasher.hash(new.secret),
            display_name=display_name,
            created_at_s=self._now(),
            limits=limits,
        )
        return record, new.secret

    @_mapped
    async def UpdateApiKey(self, request: apb.UpdateApiKeyRequest) -> apb.UpdateApiKeyResponse:
        snap = await self.store.snapshot()
        old = snap.key(request.key_id)
        tenant = snap.tenants[old.tenant_id]
        patch, problems = limits_from_proto(request.limits)
        paths = list(request.update_mask.paths)
        limits = masked(old.limits, patch, paths) if paths else patch
        # The result judged whole, against the tenant: every problem listed.
        problems += judged(limits, tenant.config)
        if problems:
            raise InvalidRequest(problems)
        record = await self.store.set_key_limits(old.key_id, limits)
        await self._refresh()
        return apb.UpdateApiKeyResponse(key=key_to_proto(record, self._now()))

    @_mapped
    async def RotateApiKey(self, request: apb.RotateApiKeyRequest) -> apb.RotateApiKeyResponse:
        grace = request.grace_period_s
        if not (math.isfinite(grace) and 0 <= grace <= MAX_GRACE_PERIOD_S):
            raise InvalidRequest(
                [
                    FieldViolation(
                        "grace_period_s",
                        f"must be in [0, {MAX_GRACE_PERIOD_S:g}] seconds, got {grace:g}",
                    )
                ]
            )
        old = (await self.store.snapshot()).key(request.key_id)
        now = self._now()
        if not old.active(now):
            raise StoreConstraint(
                f"API key {old.key_id!r} no longer works; issue a new key instead",
                key_id=old.key_id,
            )
        # The same key, a new secret: its limits carry over.
        record, secret = self._new_key(old.tenant_id, old.display_name, old.limits)
        retired = await self.store.rotate_key(old.key_id, record, now + grace)
        await self._refresh()
        return apb.RotateApiKeyResponse(
            key=key_to_proto(record, now), secret=secret, retired=key_to_proto(retired, now)
        )

    @_mapped
    async def RevokeApiKey(self, request: apb.RevokeApiKeyRequest) -> apb.RevokeApiKeyResponse:
        now = self._now()
        record = await self.store.expire_key(request.key_id, now)
        await self._refresh()
        return apb.RevokeApiKeyResponse(key=key_to_proto(record, now))

    @_mapped
    async def ListApiKeys(self, request: apb.ListApiKeysRequest) -> apb.ListApiKeysResponse:
        snap = await self.store.snapshot()
        now = self._now()
        keys = sorted(snap.keys.values(), key=lambda k: (k.tenant_id, k.created_at_s, k.key_id))
        return apb.ListApiKeysResponse(
            keys=[
                key_to_proto(k, now)
                for k in keys
                if (not request.tenant_id or k.tenant_id == request.tenant_id)
                and (request.include_inactive or k.active(now))
            ]
        )

    # -- usage ----------------------------------------------------------------
    @_mapped
    async def GetUsage(self, request: apb.GetUsageRequest) -> apb.GetUsageResponse:
        snap = await self.store.snapshot()
        resp = apb.GetUsageResponse(policy=self.policy)
        for model in self.models:
            # The whole fleet's: buckets and counters read from Redis now, queues
            # and totals summed over the live replicas (store=redis).
            await model.dispatcher.refresh_stats()
            stats = model.dispatcher.stats(include=snap.tenants, fleet=True)
            resp.replicas = max(resp.replicas, stats.replicas)
            known = {t.tenant_id: t for t in stats.tenants}
            wanted = list(request.tenant_ids) or sorted(known)
            for tid in wanted:
                found = known.get(tid)
                if found is None:
                    raise NotFound.tenant(tid)
                resp.usage.append(usage_to_proto(found, model.name))
        return resp

    @_mapped
    async def ExportUsage(self, request: apb.ExportUsageRequest) -> apb.ExportUsageResponse:
        if not 0 <= request.limit <= MAX_EXPORT:
            bad = FieldViolation("limit", f"0 (1000) to {MAX_EXPORT}")
            raise InvalidRequest([bad])
        if request.cursor and not _CURSOR.fullmatch(request.cursor):
            raise InvalidRequest([FieldViolation("cursor", "a next_cursor from this API")])
        records, cursor = await self.usage.read(request.cursor, request.limit or 1000)
        return apb.ExportUsageResponse(
            records=[usage_record(r) for r in records],
            next_cursor=cursor,
            durable=self.usage.durable,
        )

    @_mapped
    async def GetPeriodUsage(
        self, request: apb.GetPeriodUsageRequest
    ) -> apb.GetPeriodUsageResponse:
        for i, tid in enumerate(request.tenant_ids):
            require_tenant_id(tid, f"tenant_ids[{i}]")
        snap = await self.store.snapshot()
        return await period_usage_response(request, self.usage, snap)


def _display_name_problems(name: str) -> list[FieldViolation]:
    if len(name) > MAX_DISPLAY_NAME_CHARS or not name.isprintable():
        what = f"at most {MAX_DISPLAY_NAME_CHARS} printable characters"
        return [FieldViolation("display_name", what)]
    return []
