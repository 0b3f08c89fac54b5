"""Domain errors of the scheduling layer; service/errors.py maps them to gRPC.

Each class names the status it should leave with:
- RequestRejected and subclasses: RESOURCE_EXHAUSTED (+ RetryInfo when
  `retry_after_s` is set; + QuotaFailure for QuotaExceeded).
- RequestTooLarge: INVALID_ARGUMENT (+ BadRequest on `field`).
- TenantRefused and subclasses: PERMISSION_DENIED.
- DeadlineExpired: DEADLINE_EXCEEDED.
Every error has a stable `reason` and `metadata()` for google.rpc.ErrorInfo.
"""

from __future__ import annotations


class SchedulingError(Exception):
    """Base class. `reason` is a stable UPPER_SNAKE identifier for clients."""

    reason = "SCHEDULING_ERROR"

    def metadata(self) -> dict[str, str]:
        """Extra ErrorInfo metadata (string to string)."""
        return {}


class RequestRejected(SchedulingError):
    """The request cannot be served now; it may be retried later."""

    reason = "REJECTED"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class QuotaExceeded(RequestRejected):
    """A tenant quota refused the request.

    `limit` names the quota field (e.g. "tokens_per_min", "max_queued"); the
    service puts it in a QuotaFailure violation with subject `subject`.
    """

    reason = "QUOTA_EXCEEDED"

    def __init__(
        self,
        tenant_id: str,
        limit: str,
        description: str,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(f"tenant {tenant_id!r}: {description}", retry_after_s=retry_after_s)
        self.tenant_id = tenant_id
        self.limit = limit
        self.description = description

    @property
    def subject(self) -> str:
        return f"tenant:{self.tenant_id}"

    def metadata(self) -> dict[str, str]:
        return {"tenant": self.tenant_id, "limit": self.limit}


class KeyQuotaExceeded(QuotaExceeded):
    """An API key's own limit refused the request (its tenant's other keys go on)."""

    def __init__(
        self,
        tenant_id: str,
        key_id: str,
        limit: str,
        description: str,
        *,
        retry_after_s: float | None = None,
    ) -> None:
        super().__init__(tenant_id, limit, description, retry_after_s=retry_after_s)
        self.key_id = key_id

    @property
    def subject(self) -> str:
        return f"key:{self.key_id}"

    def metadata(self) -> dict[str, str]:
        return {**super().metadata(), "key_id": self.key_id}


class QueueTimeout(QuotaExceeded):
    """The request waited in the queue longer than its tenant's max_queue_wait_s."""

    reason = "QUEUE_TIMEOUT"


class BudgetExhausted(QuotaExceeded):
    """A budget over a calendar window is spent (scheduler/tenancy/budgets.py):
    refused before queueing until the window ends (`retry_after_s`). `limit` is
    the budget's name and what it caps ("budget.day.tokens"); `key_id` is set
    when it is a key's own budget."""

    reason = "BUDGET_EXHAUSTED"

    def __init__(
        self,
        tenant_id: str,
        limit: str,
        description: str,
        *,
        retry_after_s: float,
        key_id: str = "",
    ) -> None:
        super().__init__(tenant_id, limit, description, retry_after_s=retry_after_s)
        self.key_id = key_id

    @property
    def subject(self) -> str:
        return f"tenant:{self.tenant_id}" + (f"/key:{self.key_id}" if self.key_id else "")

    def metadata(self) -> dict[str, str]:
        return super().metadata() | ({"key": self.key_id} if self.key_id else {})


class RequestTooLarge(SchedulingError):
    """The request exceeds a tenant cap; retrying it unchanged cannot succeed.

    `field` is the request field to blame: "prompt" (the text or token_ids
    input) or "sampling.max_tokens".
    """

    reason = "REQUEST_TOO_LARGE"

    def __init__(self, tenant_id: str, field: str, limit: str, description: str) -> None:
        super().__init__(f"tenant {tenant_id!r}: {description}")
        self.tenant_id = tenant_id
        self.field = field
        self.limit = limit
        self.description = description

    def metadata(self) -> dict[str, str]:
        return {"tenant": self.tenant_id, "limit": self.limit}


class TenantRefused(SchedulingError):
    """The caller may not use the service as this tenant (or as no tenant)."""

    reason = "TENANT_REFUSED"

    def __init__(self, tenant_id: str, message: str) -> None:
        super().__init__(message)
        self.tenant_id = tenant_id

    def metadata(self) -> dict[str, str]:
        return {"tenant": self.tenant_id} if self.tenant_id else {}


class UnknownTenant(TenantRefused):
    reason = "TENANT_UNKNOWN"


class TenantRequired(TenantRefused):
    """The request names no tenant and no default tenant is configured."""

    reason = "TENANT_REQUIRED"


class TenantDisabled(TenantRefused):
    reason = "TENANT_DISABLED"


class PriorityNotAllowed(TenantRefused):
    reason = "PRIORITY_NOT_ALLOWED"


class KeyPriorityNotAllowed(PriorityNotAllowed):
    """The API key's own priorities (within its tenant's) exclude this class."""

    def __init__(self, tenant_id: str, key_id: str, message: str) -> None:
        super().__init__(tenant_id, message)
        self.key_id = key_id

    def metadata(self) -> dict[str, str]:
        return {**super().metadata(), "key_id": self.key_id}


class DeadlineExpired(SchedulingError):
    """The request's deadline passed while it was still queued."""

    reason = "DEADLINE_EXCEEDED"


class StoreUnavailable(SchedulingError):
    """The shared state store (Redis) cannot be reached and the failure mode is
    "closed": the request is refused with UNAVAILABLE (+ RetryInfo)."""

    reason = "STORE_UNAVAILABLE"

    def __init__(self, message: str, *, retry_after_s: float = 1.0) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
