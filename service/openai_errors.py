"""Domain errors as OpenAI-shaped HTTP errors, derived from the gRPC mapping.

service/errors.py is the one place that decides what an error means (status
code, retry delay, blamed field, reason). This module only translates its
`MappedStatus` for HTTP: the gRPC code becomes the HTTP status (the standard
google.rpc ↔ HTTP table), RetryInfo becomes `Retry-After` (and the
`retry-after-ms` the OpenAI SDKs read first), the BadRequest field becomes
`param`, the ErrorInfo reason becomes `code`:

    {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import grpc
from google.rpc import error_details_pb2

from service import errors
from service.telemetry.status import record_abort

# google/rpc/code.proto's HTTP equivalents.
_HTTP_STATUS = {
    grpc.StatusCode.INVALID_ARGUMENT: 400,
    grpc.StatusCode.FAILED_PRECONDITION: 400,
    grpc.StatusCode.OUT_OF_RANGE: 400,
    grpc.StatusCode.UNAUTHENTICATED: 401,
    grpc.StatusCode.PERMISSION_DENIED: 403,
    grpc.StatusCode.NOT_FOUND: 404,
    grpc.StatusCode.ABORTED: 409,
    grpc.StatusCode.ALREADY_EXISTS: 409,
    grpc.StatusCode.RESOURCE_EXHAUSTED: 429,
    grpc.StatusCode.CANCELLED: 499,
    grpc.StatusCode.UNIMPLEMENTED: 501,
    grpc.StatusCode.UNAVAILABLE: 503,
    grpc.StatusCode.DEADLINE_EXCEEDED: 504,
}
# Where OpenAI's API says otherwise than the gRPC code's equivalent.
_REASON_STATUS = {errors.UnknownModel.reason: 404}
# OpenAI's error `type` per HTTP status.
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    409: "conflict_error",
    429: "rate_limit_error",
    503: "service_unavailable_error",
}


@dataclass(slots=True)
class HttpError:
    status: int
    message: str
    type: str
    code: str
    param: str | None = None
    retry_after_s: float | None = None
    headers: dict[str, str] = field(default_factory=dict)

    def body(self) -> dict[str, object]:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def json_bytes(self) -> bytes:
        return json.dumps(self.body()).encode()


def _identity(name: str) -> str:
    return name


def http_error(exc: Exception, param_name: Callable[[str], str] = _identity) -> HttpError:
    """The HTTP error for `exc` (and, like errors.abort, the span's record of it).

    `param_name` renames the gRPC API's field paths to the HTTP API's names."""
    st = errors.map_error(exc)
    record_abort(exc, st.code)
    reason, param, retry_after_s = "", None, None
    for detail in st.details:
        if detail.Is(error_details_pb2.ErrorInfo.DESCRIPTOR):
            info = error_details_pb2.ErrorInfo()
            detail.Unpack(info)
            reason = info.reason
        elif detail.Is(error_details_pb2.BadRequest.DESCRIPTOR):
            bad = error_details_pb2.BadRequest()
            detail.Unpack(bad)
            if bad.field_violations:
                param = param_name(bad.field_violations[0].field)
        elif detail.Is(error_details_pb2.RetryInfo.DESCRIPTOR):
            retry = error_details_pb2.RetryInfo()
            detail.Unpack(retry)
            retry_after_s = retry.retry_delay.ToNanoseconds() / 1e9
    status = _REASON_STATUS.get(reason) or _HTTP_STATUS.get(st.code, 500)
    err = HttpError(
        status=status,
        message=st.message,
        type=_TYPES.get(status, "server_error"),
        code=(reason or st.code.name).lower(),
        param=param,
        retry_after_s=retry_after_s,
    )
    if retry_after_s is not None:
        # Whole seconds, rounded up (RFC 9110); milliseconds for the OpenAI SDKs.
        err.headers["Retry-After"] = str(max(1, math.ceil(retry_after_s)))
        err.headers["retry-after-ms"] = str(max(1, math.ceil(retry_after_s * 1000)))
    return err
