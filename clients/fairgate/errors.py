"""FairgateError: a gRPC error with its google.rpc details decoded."""

from __future__ import annotations

from typing import cast

import grpc
from google.rpc import error_details_pb2, status_pb2
from grpc_status import rpc_status


class FairgateError(Exception):
    def __init__(
        self,
        code: grpc.StatusCode,
        message: str,
        *,
        reason: str = "",
        retry_after_s: float | None = None,
        field_violations: tuple[tuple[str, str], ...] = (),
        quota_violations: tuple[tuple[str, str], ...] = (),
        metadata: dict[str, str] | None = None,
    ) -> None:
        super().__init__(f"{code.name}: {message}")
        self.code = code
        self.message = message
        self.reason = reason
        self.retry_after_s = retry_after_s
        self.field_violations = field_violations
        self.quota_violations = quota_violations
        self.metadata = metadata or {}

    @property
    def retryable(self) -> bool:
        return self.retry_after_s is not None or self.code == grpc.StatusCode.UNAVAILABLE


def from_rpc_error(exc: grpc.RpcError) -> FairgateError:
    code = exc.code() if hasattr(exc, "code") else grpc.StatusCode.UNKNOWN
    message = (exc.details() if hasattr(exc, "details") else None) or str(exc)
    kwargs: dict[str, object] = {}
    st: status_pb2.Status | None = None
    if hasattr(exc, "trailing_metadata"):
        try:
            st = rpc_status.from_call(cast(grpc.Call, exc))
        except ValueError:  # the status was rewritten on the way (a proxy): no details
            st = None
    if st is not None:
        for any_msg in st.details:
            if any_msg.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
                info = error_details_pb2.ErrorInfo()
                any_msg.Unpack(info)
                kwargs["reason"] = info.reason
                kwargs["metadata"] = dict(info.metadata)
            elif any_msg.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
                retry = error_details_pb2.RetryInfo()
                any_msg.Unpack(retry)
                kwargs["retry_after_s"] = retry.retry_delay.ToNanoseconds() / 1e9
            elif any_msg.Is(error_details_pb2.BadRequest.DESCRIPTOR):
                bad = error_details_pb2.BadRequest()
                any_msg.Unpack(bad)
                kwargs["field_violations"] = tuple(
                    (v.field, v.description) for v in bad.field_violations
                )
            elif any_msg.Is(error_details_pb2.QuotaFailure.DESCRIPTOR):
                quota = error_details_pb2.QuotaFailure()
                any_msg.Unpack(quota)
                kwargs["quota_violations"] = tuple(
                    (v.subject, v.description) for v in quota.violations
                )
    return FairgateError(code, message, **kwargs)  # type: ignore[arg-type]
