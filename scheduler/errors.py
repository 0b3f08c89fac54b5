"""Domain errors of the scheduling layer; service/errors.py maps them to gRPC."""

from __future__ import annotations


class SchedulingError(Exception):
    """Base class. `reason` is a stable UPPER_SNAKE identifier for clients."""

    reason = "SCHEDULING_ERROR"


class RequestRejected(SchedulingError):
    """The request cannot be served now; it may be retried later."""

    reason = "REJECTED"

    def __init__(self, message: str, *, retry_after_s: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s
