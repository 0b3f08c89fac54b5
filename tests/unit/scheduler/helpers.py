"""Request factories and a recording waiter for scheduler tests."""

from __future__ import annotations

import itertools

from scheduler.budget import AdmissionBudget
from scheduler.errors import SchedulingError
from scheduler.request import Priority, QueuedRequest
from scheduler.reserve import FairShareReserve
from scheduler.rules import Isolation, Verdict, needs_load, verdict

_ids = itertools.count(1)


def req(
    tenant: str,
    prompt: int = 10,
    max_tokens: int = 10,
    priority: Priority = Priority.INTERACTIVE,
    *,
    seq: int | None = None,
    deadline_s: float | None = None,
) -> QueuedRequest:
    n = next(_ids)
    return QueuedRequest(
        request_id=f"r{n}",
        tenant_id=tenant,
        prompt_tokens=prompt,
        max_tokens=max_tokens,
        priority=priority,
        deadline_s=deadline_s,
        seq=n if seq is None else seq,
    )


class Waiter:
    """Records what the dispatcher told it; `gone` simulates a cancelled caller."""

    def __init__(self) -> None:
        self.admitted_count = 0
        self.errors: list[SchedulingError] = []
        self.gone = False

    def wanted(self) -> bool:
        return not self.gone

    def admitted(self) -> None:
        self.admitted_count += 1

    def rejected(self, error: SchedulingError) -> None:
        self.errors.append(error)


def judged(
    reserve: FairShareReserve,
    budget: AdmissionBudget,
    req: QueuedRequest,
    isolation: Isolation,
    queued: int = 1,
    unsent: int = 0,
) -> Verdict:
    """`rules.verdict` on `req` under `isolation`, its tenant with `queued` requests
    queued (it one of them), `unsent` of those in flight held unsent, the load
    asked only where `needs_load` says."""
    for _ in range(queued):
        reserve.on_queued(kv_req(req.tenant_id))
    room = (budget.limits, budget.engine.requests, budget.engine.kv_tokens, req.kv_tokens)
    load = None
    if needs_load(reserve.fraction, *room, isolation, unsent):
        load = reserve.load(req.tenant_id, budget.limits)
    return verdict(0.0, *room, reserve.fraction, load, isolation, unsent=unsent)


def kv_req(tenant: str, kv: int = 100) -> QueuedRequest:
    """A request holding `kv` KV tokens (half prompt, half output)."""
    return QueuedRequest(f"{tenant}-{next(_ids)}", tenant, kv // 2, kv - kv // 2)


def fill(reserve: FairShareReserve, budget: AdmissionBudget, tenant: str, n: int) -> None:
    """`n` of `tenant`'s requests admitted: in flight in the budget and the reserve."""
    for _ in range(n):
        r = kv_req(tenant)
        reserve.on_queued(r)
        budget.reserve(r)
        reserve.on_admitted(r)
