"""Policy registry: config names to policy factories."""

from __future__ import annotations

from collections.abc import Callable

from scheduler.fcfs import FcfsPolicy
from scheduler.policy import QueuePolicy

POLICIES: dict[str, Callable[[], QueuePolicy]] = {
    "fcfs": FcfsPolicy,
}


def make_policy(name: str) -> QueuePolicy:
    try:
        return POLICIES[name]()
    except KeyError:
        raise ValueError(
            f"unknown policy {name!r}; available: {', '.join(sorted(POLICIES))}"
        ) from None
