"""Every domain error has one meaning: the OpenAI JSON error is derived from the
gRPC mapping (status, retry delay, blamed field, reason), never restated."""

from __future__ import annotations

import pytest

from scheduler.errors import (
    DeadlineExpired,
    PriorityNotAllowed,
    QueueTimeout,
    QuotaExceeded,
    RequestTooLarge,
    StoreUnavailable,
)
from scheduler.tenancy.tenant_store import VersionConflict
from service import errors
from service.auth import KeyInvalid, TenantMismatch
from service.engines.protocol import EngineError
from service.openai_errors import http_error
from service.openai_request import param_name

CASES: list[tuple[Exception, int, str, str, str | None]] = [
    # (error, status, type, code, param)
    (
        errors.InvalidRequest([errors.FieldViolation("sampling.temperature", "too hot")]),
        400, "invalid_request_error", "invalid_argument", "temperature",
    ),
    (
        errors.UnknownModel([errors.FieldViolation("model", "unknown model 'x'")]),
        404, "not_found_error", "model_not_found", "model",
    ),
    (
        RequestTooLarge("t", "text", "max_prompt_tokens", "prompt too long"),
        400, "invalid_request_error", "request_too_large", "prompt",
    ),
    (KeyInvalid("bad key"), 401, "authentication_error", "api_key_invalid", None),
    (TenantMismatch("not yours"), 403, "permission_error", "tenant_mismatch", None),
    (PriorityNotAllowed("t", "no batch"), 403, "permission_error", "priority_not_allowed", None),
    (
        QuotaExceeded("t", "requests_per_s", "over", retry_after_s=0.25),
        429, "rate_limit_error", "quota_exceeded", None,
    ),
    (
        QueueTimeout("t", "max_queue_wait_s", "waited"),
        429, "rate_limit_error", "queue_timeout", None,
    ),
    (StoreUnavailable("redis down"), 503, "service_unavailable_error", "store_unavailable", None),
    (
        EngineError("engine gone", retryable=True),
        503, "service_unavailable_error", "engine_error", None,
    ),
    (DeadlineExpired("late"), 504, "server_error", "deadline_exceeded", None),
    (VersionConflict("stale etag"), 409, "conflict_error", "etag_mismatch", None),
    (RuntimeError("boom"), 500, "server_error", "internal", None),
]  # fmt: skip


@pytest.mark.parametrize(("exc", "status", "type_", "code", "param"), CASES)
def test_error_shape(exc: Exception, status: int, type_: str, code: str, param: str | None) -> None:
    err = http_error(exc, param_name)
    body = err.body()["error"]
    assert isinstance(body, dict)
    assert (err.status, body["type"], body["code"], body["param"]) == (status, type_, code, param)
    assert body["message"]
    if isinstance(exc, RuntimeError):
        assert "boom" not in body["message"]  # internal details stay inside


def test_retry_after_comes_from_retry_info() -> None:
    err = http_error(QuotaExceeded("t", "tokens_per_min", "over", retry_after_s=1.2))
    # Whole seconds rounded up (RFC 9110), and milliseconds for the OpenAI SDKs.
    assert err.headers == {"Retry-After": "2", "retry-after-ms": "1200"}
    assert http_error(QuotaExceeded("t", "max_queued", "full")).headers == {}
    assert http_error(StoreUnavailable("down", retry_after_s=1.0)).headers["Retry-After"] == "1"
