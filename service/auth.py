"""Authentication: API keys for tenants, a token for the admin API.

One grpc.aio server interceptor guards both services before any handler
runs (so a refused call never reaches the queue or the engine):

- `fairgate.v1.InferenceService`: `authorization: Bearer fg_…` maps to the
  key's tenant; nothing in the request can choose another one. Auth modes
  (`FAIRGATE_AUTH_MODE`):
    * `auto` (default): keys are required once any key has been issued.
      Before that the server is open: requests go to the tenant named by the
      `x-fairgate-tenant` header or to the default tenant (not
      authentication; it keeps the zero-config quick start working).
    * `api-key`: keys are always required (production).
    * `dev-header`: explicit opt-in dev mode: requests without a key may
      name their tenant in the header even when keys exist.
  A presented key is always checked (bad → UNAUTHENTICATED), and a header
  naming another tenant than the key's → PERMISSION_DENIED.
- `fairgate.v1.AdminService`: `authorization: Bearer <admin token>`
  (`FAIRGATE_ADMIN_TOKEN`), compared in constant time; no token configured
  means the admin API is off. A tenant key there → PERMISSION_DENIED.

Health and reflection stay open (probes).
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any, TypeVar, cast

import grpc

from scheduler.tenancy.tenants import tenant_id_problem
from service import errors
from service.api_keys import tokens_equal
from service.identity import Identity, current_identity
from service.settings import AUTH_MODES
from service.tenant_directory import TenantDirectory

__all__ = ["AuthInterceptor", "Authenticator", "Identity", "current_identity"]

INFERENCE_PREFIX = "/fairgate.v1.InferenceService/"
ADMIN_PREFIX = "/fairgate.v1.AdminService/"


class KeyRequired(errors.Unauthenticated):
    reason = "API_KEY_REQUIRED"


class KeyInvalid(errors.Unauthenticated):
    reason = "API_KEY_INVALID"


class AdminTokenInvalid(errors.Unauthenticated):
    reason = "ADMIN_TOKEN_INVALID"


class TenantMismatch(errors.PermissionDenied):
    reason = "TENANT_MISMATCH"


class TenantDisabled(errors.PermissionDenied):
    reason = "TENANT_DISABLED"


class AdminRequired(errors.PermissionDenied):
    reason = "ADMIN_REQUIRED"


def _metadata(details: grpc.HandlerCallDetails) -> dict[str, str]:
    out: dict[str, str] = {}
    for key, value in details.invocation_metadata or ():
        out[key] = value if isinstance(value, str) else value.decode(errors="replace")
    return out


def _bearer(md: dict[str, str]) -> str | None:
    raw = md.get("authorization")
    if raw is None:
        return None
    scheme, _, token = raw.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise KeyInvalid("malformed authorization header: expected `authorization: Bearer <key>`")
    return token.strip()


class Authenticator:
    def __init__(
        self, directory: TenantDirectory, *, mode: str, admin_token: str, tenant_header: str
    ) -> None:
        if mode not in AUTH_MODES:
            raise ValueError(f"unknown auth mode {mode!r} (available: {', '.join(AUTH_MODES)})")
        self.directory = directory
        self.mode = mode
        self.admin_token = admin_token
        self.tenant_header = tenant_header

    def keys_required(self) -> bool:
        return self.mode == "api-key" or (self.mode == "auto" and self.directory.keys_in_use)

    def tenant(self, md: dict[str, str]) -> Identity:
        """Who is calling the inference API; raises Unauthenticated / PermissionDenied."""
        token = _bearer(md)
        claimed = md.get(self.tenant_header, "")
        if token is None:
            if self.keys_required():
                raise KeyRequired(
                    "an API key is required: send `authorization: Bearer fg_…` "
                    "(ask an operator: `fairgate admin keys issue <tenant>`)"
                )
            self._check_claimed(claimed)
            return Identity(claimed, "header" if claimed else "anonymous")
        record = self.directory.verify_key(token)
        if record is None:
            raise KeyInvalid("the API key is not valid (unknown, revoked or expired)")
        self._check_claimed(claimed)
        tid = record.tenant_id
        if claimed and claimed != tid:
            raise TenantMismatch(
                f"this API key belongs to tenant {tid!r}; it cannot act as tenant {claimed!r}",
                metadata={"tenant": tid},
            )
        cfg = self.directory.registry.get(tid)
        if cfg is None or not cfg.enabled:
            raise TenantDisabled(f"tenant {tid!r} is disabled", metadata={"tenant": tid})
        return Identity(tid, "api-key", record.key_id)

    def _check_claimed(self, claimed: str) -> None:
        # The admin API's tenant id rule: a header id is never longer or odder
        # than an id an operator could create (it becomes labels, keys, logs).
        problem = tenant_id_problem(claimed) if claimed else None
        if problem:
            raise errors.InvalidRequest(
                [errors.FieldViolation(f"metadata.{self.tenant_header}", problem)]
            )

    def admin(self, md: dict[str, str]) -> None:
        if not self.admin_token:
            raise AdminTokenInvalid(
                "the admin API is disabled on this server: start it with FAIRGATE_ADMIN_TOKEN set"
            )
        token = _bearer(md)
        if token is None:
            raise AdminTokenInvalid(
                "no admin token sent: set FAIRGATE_ADMIN_TOKEN (or --token) to the server's "
                "admin token (sent as `authorization: Bearer <token>`)"
            )
        if tokens_equal(token, self.admin_token):
            return
        if self.directory.verify_key(token) is not None:
            raise AdminRequired("tenant API keys cannot use the admin API")
        raise AdminTokenInvalid(
            "invalid admin token: FAIRGATE_ADMIN_TOKEN (or --token) must be the server's"
        )


_Req = TypeVar("_Req")
_Resp = TypeVar("_Resp")


def _discard(raw: bytes) -> None:
    return None


def _refusal(
    handler: grpc.RpcMethodHandler[_Req, _Resp], exc: errors.ServiceError
) -> grpc.RpcMethodHandler[_Req, _Resp]:
    async def unary(request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> Any:
        await errors.abort(context, exc)

    async def stream(
        request: Any, context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[Any]:
        await errors.abort(context, exc)
        yield  # pragma: no cover

    kwargs: dict[str, Any] = {
        # Authentication first: a refused caller's bytes are never parsed.
        "request_deserializer": _discard,
        "response_serializer": handler.response_serializer,
    }
    out: Any
    if handler.unary_unary is not None:
        out = grpc.unary_unary_rpc_method_handler(unary, **kwargs)
    elif handler.unary_stream is not None:
        out = grpc.unary_stream_rpc_method_handler(stream, **kwargs)
    elif handler.stream_unary is not None:
        out = grpc.stream_unary_rpc_method_handler(unary, **kwargs)
    else:
        out = grpc.stream_stream_rpc_method_handler(stream, **kwargs)
    return cast("grpc.RpcMethodHandler[_Req, _Resp]", out)


class AuthInterceptor(grpc.aio.ServerInterceptor):
    def __init__(self, auth: Authenticator) -> None:
        self.auth = auth

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[_Req, _Resp] | None]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[_Req, _Resp] | None:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or not method.startswith((INFERENCE_PREFIX, ADMIN_PREFIX)):
            return handler
        md = _metadata(handler_call_details)
        try:
            if method.startswith(ADMIN_PREFIX):
                self.auth.admin(md)
                current_identity.set(Identity("", "admin"))
            else:
                # Same Context for the handler call (grpc.aio guarantees it).
                current_identity.set(self.auth.tenant(md))
        except errors.ServiceError as exc:
            return _refusal(handler, exc)
        return handler
