"""Driving `SharedDispatcher`s by hand, on a clock only the test moves.

Every dispatcher of a test shares one `FakeClock` and one `ManualTimers`: a
pump wakes for its own kicks (a local arrival or finish) at once, but for a
poll, a retry or a heartbeat only when the test moves the clock there. So a
test asserts what did not happen after a barrier it can prove (a decision
counted, the pump parked until a known time), never after a sleep.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from scheduler.budget import AdmissionLimits
from scheduler.clock import FakeClock
from scheduler.request import QueuedRequest
from scheduler.shared.admission import (
    SharedDispatcher,
    SharedOptions,
    shared_dispatcher,
)
from scheduler.state.store import Store
from scheduler.tenancy.tenants import TenantRegistry
from scheduler.timers import ManualTimers


class FakeTime:
    def __init__(self, start_s: float = 100.0) -> None:
        self.clock = FakeClock(start_s)
        self.timers = ManualTimers(self.clock)

    def next(self) -> None:
        """Move the clock to the earliest pending wake-up and run what is due then."""
        due_s = self.timers.next_s()
        assert due_s is not None, "no wake-up pending"
        self.clock.set(max(due_s, self.clock.now_s()))
        self.timers.run_due()

    async def until(self, cond: Callable[[], bool], what: str, timeout_s: float = 5.0) -> None:
        """Let the pumps run (a Redis step is real I/O) until `cond` holds; while it
        does not, move the clock from one pending wake-up to the next (polls, retries)."""
        deadline = time.monotonic() + timeout_s
        while not cond():
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out waiting for {what}")
            await asyncio.sleep(0.01)
            if not cond() and self.timers.next_s() is not None:
                self.next()


class Driver:
    """A dispatcher whose requests the test admits and finishes by hand."""

    def __init__(self, d: SharedDispatcher) -> None:
        self.d = d
        self.tasks: dict[str, asyncio.Task[None]] = {}
        self.reqs: dict[str, QueuedRequest] = {}
        self.finished: set[str] = set()

    def submit(self, request_id: str, tenant: str, kv: int = 100) -> asyncio.Task[None]:
        req = QueuedRequest(request_id, tenant, kv // 2, kv - kv // 2)
        self.reqs[request_id] = req
        self.tasks[request_id] = asyncio.create_task(self.d.admit(req))
        return self.tasks[request_id]

    def running(self, tenant: str) -> list[str]:
        return [
            rid
            for rid, t in self.tasks.items()
            if t.done() and not t.cancelled() and not t.exception() and rid not in self.finished
            if self.reqs[rid].tenant_id == tenant
        ]

    def finish(self, request_id: str) -> None:
        self.finished.add(request_id)
        self.d.finish(self.reqs[request_id])

    async def aclose(self) -> None:
        for t in self.tasks.values():
            t.cancel()
        await asyncio.gather(*self.tasks.values(), return_exceptions=True)
        for tenant in {r.tenant_id for r in self.reqs.values()}:
            for rid in self.running(tenant):
                self.finish(rid)
        await self.d.aclose()


async def start(
    drivers: list[Driver],
    fake: FakeTime,
    store: Store,
    limits: AdmissionLimits,
    tenants: TenantRegistry | None = None,
    replica: str = "r1",
    **options: object,
) -> Driver:
    opts = SharedOptions(replica, poll_s=0.005, **options)  # type: ignore[arg-type]
    d = shared_dispatcher(store, limits, fake.clock, opts, tenants=tenants, timers=fake.timers)
    await d.start()
    drivers.append(Driver(d))
    return drivers[-1]
