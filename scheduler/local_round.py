"""`LocalAdmission`'s state as a `decision.Round`: its queues, budget, quotas
and reserve, read and changed for the one admission decision (I/O only, no rule;
`store_round.py` is the shared store's)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from scheduler import rules
from scheduler.budget import AdmissionLimits
from scheduler.gate import RequestState
from scheduler.request import QueuedRequest
from scheduler.rules import Verdict

if TYPE_CHECKING:
    from scheduler.local_admission import LocalAdmission, LocalEntry


class QueueRound:
    """The state's queues, budget, quotas and reserve as a `decision.Round`:
    I/O for the one admission decision (no rule here)."""

    __slots__ = ("entry", "s")

    def __init__(self, s: LocalAdmission) -> None:
        self.s = s
        self.entry: LocalEntry | None = None  # the last head's (`head` to `admit`)

    @property
    def limits(self) -> AdmissionLimits:
        return self.s.budget.limits

    @property
    def in_flight(self) -> int:
        return self.s.budget.engine.requests

    @property
    def in_flight_kv(self) -> int:
        return self.s.budget.engine.kv_tokens

    @property
    def unsent(self) -> int:
        return 0 if self.s.unsent is None else self.s.unsent()

    def head(self) -> QueuedRequest | None:
        s = self.s
        while (head := s.policy.peek_next()) is not None:
            entry = self._wanted(head)
            if entry is None:
                continue
            if s.locality is not None:
                # What it would add to the engine's KV, and charge (QueuedRequest.kv_tokens).
                head.cached_estimate = s.locality(head)
            self.entry = entry
            return head
        return None

    @property
    def local(self) -> bool:
        return self.s.locality is not None

    def queued(self, c: QueuedRequest) -> int:
        return self.s.reserve.queued(c.tenant_id)

    @property
    def allowance(self) -> float:
        return self.s.allowance

    def order_key(self, c: QueuedRequest) -> float:
        return self.s.policy.order_key(c.tenant_id)

    def heads_upto(self, c: QueuedRequest, end: float) -> list[QueuedRequest]:
        s = self.s
        heads = [h for h in s.policy.heads_upto(end) if h is not c and self._wanted(h)]
        if s.locality is not None:
            for h in heads:  # the head's is set (`head`)
                h.cached_estimate = s.locality(h)
        return heads

    def cached(self, c: QueuedRequest) -> int:
        return c.cached_estimate

    def _wanted(self, req: QueuedRequest) -> LocalEntry | None:
        """Its entry, or None after dropping it: its caller was cancelled and has
        not run its cleanup yet."""
        entry = self._known(req)
        if entry.waiter.wanted():
            return entry
        self.s.door.drop(entry, RequestState.CANCELLED)
        return None

    def _entry(self, req: QueuedRequest) -> LocalEntry:
        if self.entry is not None and self.entry.req is req:
            return self.entry
        return self._known(req)

    def _known(self, req: QueuedRequest) -> LocalEntry:
        entry = self.s.door.entry_of(req)
        if entry is None:
            raise AssertionError(f"policy returned unknown request {req.request_id}")
        return entry

    def own_wait_s(self, c: QueuedRequest) -> float:
        return self.s.ledger.wait_s(self._entry(c).reservation)

    def load(self, c: QueuedRequest) -> rules.TenantLoad:
        return self.s.reserve.load(c.tenant_id, self.s.budget.limits)

    def first_elsewhere(self, c: QueuedRequest) -> float | None:
        return None  # one process: every backlogged tenant is in these queues

    def hold(self, c: QueuedRequest, wait_s: float) -> None:
        self.s.pause(c.tenant_id, wait_s)

    def stopped(self, c: QueuedRequest, v: Verdict) -> None:
        if v is Verdict.HOLD:
            self.s.reserve_holds_total += 1

    def held_over(self, c: QueuedRequest) -> None:
        self.s.reserve_held_over = True

    def admit(self, c: QueuedRequest, lent: bool) -> bool:
        s, entry = self.s, self._entry(c)
        s.locality_picks_total += c is not s.policy.peek_next()
        if s.policy.pop_next(c) is not c:
            raise AssertionError("policy pop_next disagrees with heads_upto")
        c.lent = lent
        s.budget.reserve(c)
        c.light = s.policy.fair and rules.light(s.reserve.queued(c.tenant_id))
        s.reserve.on_admitted(c)
        s.ledger.start(entry.reservation)
        s.door.started(entry)
        return True
