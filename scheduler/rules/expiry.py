"""The queue timeout: when a queued request must leave, and with which error
(its own deadline, or its tenant's max_queue_wait_s)."""

from __future__ import annotations

from scheduler.errors import DeadlineExpired, QueueTimeout, SchedulingError


def queue_expiry_s(
    arrival_s: float, max_queue_wait_s: float | None, deadline_s: float | None
) -> float | None:
    """When a queued request must leave the queue (None: never)."""
    limits = [t for t in (deadline_s,) if t is not None]
    if max_queue_wait_s is not None:
        limits.append(arrival_s + max_queue_wait_s)
    return min(limits) if limits else None


def deadline_binds(
    arrival_s: float, max_queue_wait_s: float | None, deadline_s: float | None
) -> bool:
    """At expiry, is it the request's own deadline (else the tenant's max_queue_wait_s)?"""
    if deadline_s is None:
        return False
    return max_queue_wait_s is None or deadline_s <= arrival_s + max_queue_wait_s


def queue_expired(
    request_id: str,
    tenant_id: str,
    arrival_s: float,
    now_s: float,
    max_queue_wait_s: float | None,
    deadline_s: float | None,
) -> SchedulingError:
    """The error a request leaves the queue with when `queue_expiry_s` passes."""
    waited_s = now_s - arrival_s
    if deadline_binds(arrival_s, max_queue_wait_s, deadline_s):
        return DeadlineExpired(
            f"request {request_id!r}: the deadline passed after {waited_s:.3f} s in the queue"
        )
    return QueueTimeout(
        tenant_id,
        "max_queue_wait_s",
        f"request {request_id!r} waited {waited_s:.3f} s in the queue; "
        f"the limit is {max_queue_wait_s:g} s",
    )
