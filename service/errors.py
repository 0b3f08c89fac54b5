"""The one place that maps domain errors to gRPC status codes.

Every error leaves with google.rpc.Status details in the standard
`grpc-status-details-bin` trailer (packed by grpcio-status): ErrorInfo
always, plus BadRequest, RetryInfo or QuotaFailure where they apply.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, NoReturn

import grpc
from google.protobuf import any_pb2, duration_pb2
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status

from scheduler.errors import (
    DeadlineExpired,
    QuotaExceeded,
    RequestRejected,
    RequestTooLarge,
    SchedulingError,
    StoreUnavailable,
    TenantRefused,
)
from scheduler.tenancy.tenant_store import (
    AlreadyExists,
    NotFound,
    StoreConstraint,
    StoreError,
    VersionConflict,
)
from service.engines.protocol import EngineError
from service.telemetry.status import record_abort

ERROR_DOMAIN = "fairgate.dev"


@dataclass(frozen=True, slots=True)
class FieldViolation:
    field: str
    description: str


class ServiceError(Exception):
    code = grpc.StatusCode.INTERNAL
    reason = "INTERNAL"
    # Set: the status carries RetryInfo with this delay.
    retry_after_s: float | None = None

    def __init__(self, message: str, *, metadata: dict[str, str] | None = None) -> None:
        super().__init__(message)
        self.metadata = metadata or {}


class InvalidRequest(ServiceError):
    code = grpc.StatusCode.INVALID_ARGUMENT
    reason = "INVALID_ARGUMENT"

    def __init__(self, violations: list[FieldViolation]) -> None:
        summary = "; ".join(f"{v.field}: {v.description}" for v in violations)
        super().__init__(f"invalid request: {summary}")
        self.violations = violations


class UnknownModel(InvalidRequest):
    """INVALID_ARGUMENT on the `model` field (404 model_not_found over HTTP)."""

    reason = "MODEL_NOT_FOUND"


class Unauthenticated(ServiceError):
    code = grpc.StatusCode.UNAUTHENTICATED
    reason = "UNAUTHENTICATED"


class PermissionDenied(ServiceError):
    code = grpc.StatusCode.PERMISSION_DENIED
    reason = "PERMISSION_DENIED"


class Unavailable(ServiceError):
    code = grpc.StatusCode.UNAVAILABLE
    reason = "UNAVAILABLE"


@dataclass(slots=True)
class MappedStatus:
    code: grpc.StatusCode
    message: str
    details: list[any_pb2.Any] = field(default_factory=list)

    def to_status(self) -> grpc.Status:
        """The status with its google.rpc.Status in the details trailer (grpcio-status)."""
        st = status_pb2.Status(code=self.code.value[0], message=self.message, details=self.details)
        status: grpc.Status = rpc_status.to_status(st)
        return status


def _pack(msg: object) -> any_pb2.Any:
    a = any_pb2.Any()
    a.Pack(msg)  # type: ignore[arg-type]
    return a


def _error_info(reason: str, metadata: dict[str, str]) -> any_pb2.Any:
    return _pack(error_details_pb2.ErrorInfo(reason=reason, domain=ERROR_DOMAIN, metadata=metadata))


def _retry_info(seconds: float) -> any_pb2.Any:
    delay = duration_pb2.Duration()
    # Round up: retrying earlier than this would fail again.
    nanos = max(0, math.ceil(seconds * 1e9))
    delay.seconds, delay.nanos = divmod(nanos, 1_000_000_000)
    return _pack(error_details_pb2.RetryInfo(retry_delay=delay))


def map_error(exc: Exception) -> MappedStatus:
    if isinstance(exc, InvalidRequest):
        bad = error_details_pb2.BadRequest(
            field_violations=[
                error_details_pb2.BadRequest.FieldViolation(
                    field=v.field, description=v.description
                )
                for v in exc.violations
            ]
        )
        return MappedStatus(exc.code, str(exc), [_pack(bad), _error_info(exc.reason, exc.metadata)])
    if isinstance(exc, ServiceError):
        details = [_error_info(exc.reason, exc.metadata)]
        if exc.retry_after_s is not None:
            details.insert(0, _retry_info(exc.retry_after_s))
        return MappedStatus(exc.code, str(exc), details)
    if isinstance(exc, SchedulingError):
        return _map_scheduling(exc)
    if isinstance(exc, StoreError):
        return MappedStatus(
            _STORE_CODES.get(type(exc), grpc.StatusCode.FAILED_PRECONDITION),
            str(exc),
            [_error_info(exc.reason, exc.metadata())],
        )
    if isinstance(exc, EngineError):
        details = [_error_info("ENGINE_ERROR", {"retryable": str(exc.retryable).lower()})]
        if exc.retryable:
            details.insert(0, _retry_info(1.0))
        return MappedStatus(grpc.StatusCode.UNAVAILABLE, f"engine error: {exc}", details)
    return MappedStatus(grpc.StatusCode.INTERNAL, "internal error", [_error_info("INTERNAL", {})])


_STORE_CODES = {
    NotFound: grpc.StatusCode.NOT_FOUND,
    AlreadyExists: grpc.StatusCode.ALREADY_EXISTS,
    VersionConflict: grpc.StatusCode.ABORTED,
    StoreConstraint: grpc.StatusCode.FAILED_PRECONDITION,
}


def _map_scheduling(exc: SchedulingError) -> MappedStatus:
    info = _error_info(exc.reason, exc.metadata())
    if isinstance(exc, RequestRejected):
        details = [info]
        if isinstance(exc, QuotaExceeded):
            violation = error_details_pb2.QuotaFailure.Violation(
                subject=exc.subject, description=f"{exc.limit}: {exc.description}"
            )
            details.insert(0, _pack(error_details_pb2.QuotaFailure(violations=[violation])))
        if exc.retry_after_s is not None:
            details.insert(0, _retry_info(exc.retry_after_s))
        return MappedStatus(grpc.StatusCode.RESOURCE_EXHAUSTED, str(exc), details)
    if isinstance(exc, RequestTooLarge):
        violation = error_details_pb2.BadRequest.FieldViolation(
            field=exc.field, description=exc.description
        )
        bad = error_details_pb2.BadRequest(field_violations=[violation])
        return MappedStatus(grpc.StatusCode.INVALID_ARGUMENT, str(exc), [_pack(bad), info])
    if isinstance(exc, TenantRefused):
        return MappedStatus(grpc.StatusCode.PERMISSION_DENIED, str(exc), [info])
    if isinstance(exc, StoreUnavailable):
        details = [_retry_info(exc.retry_after_s), info]
        return MappedStatus(grpc.StatusCode.UNAVAILABLE, str(exc), details)
    if isinstance(exc, DeadlineExpired):
        return MappedStatus(grpc.StatusCode.DEADLINE_EXCEEDED, str(exc), [info])
    return MappedStatus(grpc.StatusCode.FAILED_PRECONDITION, str(exc), [info])


async def abort(
    context: grpc.aio.ServicerContext[Any, Any],
    exc: Exception,
    metadata: Sequence[tuple[str, str]] = (),
) -> NoReturn:
    """End the call with `exc`'s status and details; `metadata`: more trailing
    metadata (the rate-limit headers)."""
    mapped = map_error(exc)
    record_abort(exc, mapped.code)
    st = mapped.to_status()
    trailing = (*st.trailing_metadata, *metadata)
    await context.abort(st.code, st.details, trailing_metadata=trailing)
    raise AssertionError("context.abort returned")  # pragma: no cover
