"""Blocking client for fairgate.v1.AdminService (raises FairgateError)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import grpc
from google.protobuf import field_mask_pb2

from fairgate.errors import from_rpc_error
from fairgate.tls import TlsArg, sync_channel
from fairgate.v1 import admin_pb2 as apb
from fairgate.v1 import admin_pb2_grpc as apb_grpc

R = TypeVar("R")


class AdminClient:
    """`with AdminClient("host:port", token="...") as admin: admin.list_tenants()`."""

    def __init__(
        self,
        target: str,
        *,
        token: str | None,
        tls: TlsArg = None,
        timeout_s: float | None = 10.0,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._channel = sync_channel(target, tls, options)
        self._stub = apb_grpc.AdminServiceStub(self._channel)
        self._metadata = (("authorization", f"Bearer {token}"),) if token else ()
        self._timeout_s = timeout_s

    def __enter__(self) -> AdminClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._channel.close()

    def _call(self, method: Callable[..., R], request: Any) -> R:
        try:
            return method(request, metadata=self._metadata, timeout=self._timeout_s)
        except grpc.RpcError as exc:
            raise from_rpc_error(exc) from None

    # -- tenants --------------------------------------------------------------
    def list_tenants(self) -> apb.ListTenantsResponse:
        return self._call(self._stub.ListTenants, apb.ListTenantsRequest())

    def get_tenant(self, tenant_id: str) -> apb.Tenant:
        return self._call(self._stub.GetTenant, apb.GetTenantRequest(tenant_id=tenant_id)).tenant

    def create_tenant(self, tenant: apb.Tenant) -> apb.Tenant:
        return self._call(self._stub.CreateTenant, apb.CreateTenantRequest(tenant=tenant)).tenant

    def update_tenant(self, tenant: apb.Tenant, paths: Sequence[str] = ()) -> apb.Tenant:
        """Change the fields in `paths` (all when empty); `tenant.etag` makes it conditional."""
        req = apb.UpdateTenantRequest(
            tenant=tenant, update_mask=field_mask_pb2.FieldMask(paths=list(paths))
        )
        return self._call(self._stub.UpdateTenant, req).tenant

    def delete_tenant(self, tenant_id: str, etag: str = "") -> None:
        self._call(self._stub.DeleteTenant, apb.DeleteTenantRequest(tenant_id=tenant_id, etag=etag))

    def set_default_tenant(self, tenant_id: str) -> None:
        self._call(self._stub.SetDefaultTenant, apb.SetDefaultTenantRequest(tenant_id=tenant_id))

    def apply(
        self,
        tenants: Sequence[apb.Tenant],
        default_tenant_id: str,
        *,
        prune: bool = False,
        dry_run: bool = False,
    ) -> apb.ApplyTenantsResponse:
        req = apb.ApplyTenantsRequest(
            tenants=tenants, default_tenant_id=default_tenant_id, prune=prune, dry_run=dry_run
        )
        return self._call(self._stub.ApplyTenants, req)

    # -- keys -----------------------------------------------------------------
    def issue_key(
        self, tenant_id: str, display_name: str = "", limits: apb.ApiKeyLimits | None = None
    ) -> apb.IssueApiKeyResponse:
        req = apb.IssueApiKeyRequest(tenant_id=tenant_id, display_name=display_name, limits=limits)
        return self._call(self._stub.IssueApiKey, req)

    def update_key(
        self, key_id: str, limits: apb.ApiKeyLimits, paths: Sequence[str] = ()
    ) -> apb.ApiKey:
        """Change a key's own limits: the `paths` given (empty: replace them all)."""
        req = apb.UpdateApiKeyRequest(key_id=key_id, limits=limits)
        req.update_mask.paths.extend(paths)
        return self._call(self._stub.UpdateApiKey, req).key

    def rotate_key(self, key_id: str, grace_period_s: float = 0.0) -> apb.RotateApiKeyResponse:
        req = apb.RotateApiKeyRequest(key_id=key_id, grace_period_s=grace_period_s)
        return self._call(self._stub.RotateApiKey, req)

    def revoke_key(self, key_id: str) -> apb.ApiKey:
        return self._call(self._stub.RevokeApiKey, apb.RevokeApiKeyRequest(key_id=key_id)).key

    def list_keys(self, tenant_id: str = "", *, include_inactive: bool = False) -> list[apb.ApiKey]:
        req = apb.ListApiKeysRequest(tenant_id=tenant_id, include_inactive=include_inactive)
        return list(self._call(self._stub.ListApiKeys, req).keys)

    # -- usage ----------------------------------------------------------------
    def usage(self, tenant_ids: Sequence[str] = ()) -> apb.GetUsageResponse:
        return self._call(self._stub.GetUsage, apb.GetUsageRequest(tenant_ids=list(tenant_ids)))

    def period_usage(
        self, period: str, tenant_ids: Sequence[str] = (), by_key: bool = False, window: str = ""
    ) -> apb.GetPeriodUsageResponse:
        """Spend per tenant (and key) in a day or month window, with budgets."""
        req = apb.GetPeriodUsageRequest(
            period=period, tenant_ids=list(tenant_ids), by_key=by_key, window=window
        )
        return self._call(self._stub.GetPeriodUsage, req)

    def export_usage(self, cursor: str = "", limit: int = 0) -> apb.ExportUsageResponse:
        """Usage-log records after `cursor` (billing); resume from `next_cursor`."""
        return self._call(
            self._stub.ExportUsage, apb.ExportUsageRequest(cursor=cursor, limit=limit)
        )
