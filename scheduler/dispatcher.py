"""The dispatcher: moves requests from the policy's queues into the engine.

It is event-driven rather than a polling loop: every arrival, finish or
capacity change "pumps" — admits queued requests in policy order while the
budget has room. That makes it work-conserving by construction: it never
leaves room idle while the policy's next request fits.
"""

from __future__ import annotations

import asyncio
import itertools

from scheduler.budget import AdmissionBudget, AdmissionLimits
from scheduler.clock import Clock
from scheduler.policy import QueuePolicy
from scheduler.request import QueuedRequest


class Dispatcher:
    def __init__(self, policy: QueuePolicy, budget: AdmissionBudget, clock: Clock) -> None:
        self.policy = policy
        self.budget = budget
        self.clock = clock
        self._seq = itertools.count(1)
        self._waiters: dict[int, asyncio.Future[None]] = {}
        self.admitted_total = 0

    @property
    def queued(self) -> int:
        return len(self.policy)

    @property
    def in_flight(self) -> int:
        return self.budget.in_flight_requests

    async def admit(self, req: QueuedRequest) -> None:
        """Wait until `req` is admitted. Cancelled while queued: dequeued, no charge.

        The caller must call `finish(req)` once the request leaves the engine.
        """
        req.seq = next(self._seq)
        req.arrival_s = self.clock.now_s()
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters[id(req)] = fut
        self.policy.push(req)
        self.pump()
        try:
            await fut
        except asyncio.CancelledError:
            if self._waiters.pop(id(req), None) is not None:
                self.policy.remove(req)
                self.pump()
            elif fut.done() and not fut.cancelled():
                # Admitted in the same tick the caller was cancelled: the
                # caller never saw the admission, so give the room back.
                self.finish(req)
            raise

    def pump(self) -> None:
        while True:
            head = self.policy.peek_next()
            if head is None:
                return
            fut = self._waiters.get(id(head))
            if fut is None or fut.done():
                # Its caller was cancelled and has not run its cleanup yet.
                self.policy.remove(head)
                self._waiters.pop(id(head), None)
                continue
            if not self.budget.fits(head):
                return
            popped = self.policy.pop_next()
            if popped is not head:
                raise AssertionError("policy pop_next disagrees with peek_next")
            self.budget.reserve(head)
            self.admitted_total += 1
            del self._waiters[id(head)]
            fut.set_result(None)

    def on_output_tokens(self, req: QueuedRequest, tokens: int) -> None:
        self.policy.on_output_tokens(req, tokens)

    def finish(self, req: QueuedRequest) -> None:
        """The admitted request left the engine (done, cancelled or failed)."""
        self.budget.release(req)
        self.policy.on_finish(req)
        self.pump()

    def set_limits(self, limits: AdmissionLimits) -> None:
        self.budget.limits = limits
        self.pump()
